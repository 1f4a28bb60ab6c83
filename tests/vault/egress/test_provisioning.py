"""What a sandbox is provisioned with for egress (sandboxes/provisioning.py), without starting one."""

from __future__ import annotations

import hashlib
from urllib.parse import urlsplit

import pytest
from django.test import override_settings

from sandboxes.models import Environment, Sandbox
from sandboxes.provisioning import CA_VARIABLES, resources_for
from tests.conftest import make_environment, make_session
from vault.egress.policy import placeholder
from vault.services import credential_create, vault_create

pytestmark = pytest.mark.django_db


def _sandbox(provider: str, *, vault_ids: list[str] | None = None, config: dict | None = None) -> Sandbox:
    environment = Environment.objects.get(id=make_environment(config=config))
    session_id = make_session(environment_id=environment.id, vault_ids=vault_ids or [])
    return Sandbox.objects.create(environment=environment, session_id=session_id, provider=provider)


@override_settings(SANDBOX_EGRESS=True, EGRESS_SUBNET="10.213.0.0/24", EGRESS_PORT=3128)
def test_a_docker_sandbox_gets_the_proxy_with_its_own_identity_whose_hash_alone_is_stored():
    vault = vault_create(display_name="v")
    credential = credential_create(
        vault.id,
        auth={
            "type": "environment_variable",
            "secret_name": "API_KEY",
            "secret_value": "canary-provisioning-1",
            "networking": {"type": "unrestricted"},
        },
        actor="test",
    )
    sandbox = _sandbox("docker", vault_ids=[vault.id])
    resources = resources_for(sandbox.environment, sandbox)
    assert resources.egress is not None and resources.egress.proxy_port == 3128
    proxy = urlsplit(resources.env["HTTPS_PROXY"])
    assert (proxy.hostname, proxy.port, proxy.username) == ("10.213.0.1", 3128, sandbox.id)
    assert resources.env["http_proxy"] == resources.env["HTTPS_PROXY"]
    stored = Sandbox.objects.get(id=sandbox.id).egress_token_hash
    assert stored == hashlib.sha256(proxy.password.encode()).hexdigest() and proxy.password not in stored
    assert all(resources.env[name] == "/etc/ssl/certs/ca-certificates.crt" for name in CA_VARIABLES)
    assert resources.env["API_KEY"] == placeholder(credential.id)
    assert resources.env["WORKBENCH_SESSION_ENV"] == "API_KEY"
    assert "canary-provisioning-1" not in repr(resources)
    # Each provisioning makes a new identity.
    again = resources_for(sandbox.environment, sandbox)
    assert again.env["HTTPS_PROXY"] != resources.env["HTTPS_PROXY"]


@override_settings(SANDBOX_EGRESS=False)
def test_without_sandbox_egress_a_docker_sandbox_has_no_network():
    sandbox = _sandbox("docker")
    resources = resources_for(sandbox.environment, sandbox)
    assert resources.egress is None and not resources.network and "HTTPS_PROXY" not in resources.env


@override_settings(SANDBOX_EGRESS=True)
def test_the_local_provider_has_no_network_and_says_so():
    sandbox = _sandbox("local")
    resources = resources_for(sandbox.environment, sandbox)
    assert resources.egress is None and not resources.network and "HTTPS_PROXY" not in resources.env
    assert "no network" in resources.env["WORKBENCH_NETWORK"]


@override_settings(SANDBOX_EGRESS=True)
def test_a_credential_named_like_a_platform_variable_cannot_replace_it():
    vault = vault_create(display_name="v")
    for name in ("HTTPS_PROXY", "PATH", "LD_PRELOAD"):
        credential_create(
            vault.id,
            auth={
                "type": "environment_variable",
                "secret_name": name,
                "secret_value": "x",
                "networking": {"type": "unrestricted"},
            },
            actor="test",
        )
    sandbox = _sandbox("docker", vault_ids=[vault.id])
    resources = resources_for(sandbox.environment, sandbox)
    assert resources.env["HTTPS_PROXY"].startswith(f"http://{sandbox.id}:")
    assert "PATH" not in resources.env and "LD_PRELOAD" not in resources.env
    assert resources.env["WORKBENCH_SESSION_ENV"] == ""
