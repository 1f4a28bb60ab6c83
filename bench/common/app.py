"""The platform's services as the benchmarks call them, in this process: the one module of bench/ that knows
their signatures and where they live. What a benchmark measures (emit_event, get_events, a brain) it
imports itself."""

from __future__ import annotations

import contextlib
import io
from typing import Any

MODEL = "claude-sonnet-5-5"


def new_agent(name: str = "bench", **fields: Any) -> str:
    from harness.agents import agent_create

    return agent_create(name=name, model=MODEL, **fields).agent_id


def new_environment(name: str, config: dict[str, Any] | None = None) -> str:
    """An environment (names are unique) with `config`, or the defaults."""
    from sandboxes.environments import environment_create

    return environment_create(name=name, config=config).id


def new_session(text: str | None = None, *, agent: str | None = None, environment: str | None = None) -> str:
    """A session of `agent` in `environment` (new ones unless given), `text` its first user message if any."""
    from harness.services.lifecycle import session_create

    agent = agent or new_agent()
    initial = [{"type": "user.message", "content": [{"type": "text", "text": text}]}] if text else None
    return session_create(
        agent=agent, environment_id=environment or new_environment(f"bench {agent}"), initial_events=initial
    ).id


def new_api_key(name: str) -> str:
    """A /v1 API key, as `manage.py createapikey` makes it (the last line it prints)."""
    from django.core.management import call_command

    out = io.StringIO()
    call_command("createapikey", name=name, stdout=out)
    return out.getvalue().strip().splitlines()[-1]


def event_uid() -> str:
    """A new event's uid, for events a benchmark inserts in bulk."""
    from kernel.ids import new_id

    return new_id("sevt")


def provision_sandbox(session_id: str, name: str) -> Any:
    """A sandbox (its row) for the session, from its environment's warm pool if it has one."""
    from sandboxes.hands import sandbox_provision

    return sandbox_provision(session_id, name=name)


def refill_pool(environment_id: str) -> None:
    from sandboxes.pool import pool_refill

    pool_refill(environment_id)


def terminate_sandboxes(session_id: str | None = None) -> None:
    """Terminate the session's live sandboxes (every session's without one), as an operator would."""
    from sandboxes.hands import sandbox_terminate
    from sandboxes.models import Sandbox

    live = Sandbox.objects.exclude(status=Sandbox.Status.TERMINATED)
    if session_id is not None:
        live = live.filter(session_id=session_id)
    for sandbox_id in live.values_list("id", flat=True):
        sandbox_terminate(sandbox_id)


def release_sandboxes(session_id: str) -> None:
    """End the live sandboxes of a session that ended as the reaper does (`sandbox_release`): an unused one
    provisioned ahead goes back to its environment where it may, any other is terminated."""
    from sandboxes.hands import sandbox_release
    from sandboxes.models import Sandbox

    live = Sandbox.objects.filter(session_id=session_id).exclude(status=Sandbox.Status.TERMINATED)
    for sandbox_id in live.values_list("id", flat=True):
        sandbox_release(sandbox_id)


def remove_sandboxes(deployment: str, provider_name: str) -> int:
    """Remove what the provider still runs with this deployment's label, rows or none, and the checkout images
    the deployment made (a benchmark's deployment is its run's alone); how many sandboxes."""
    from sandboxes.providers import SandboxError, get_provider
    from sandboxes.providers.docker import CHECKOUT_LABEL

    provider = get_provider(provider_name)
    handles = [
        h for h, labels in provider.list_handles().items() if labels.get("workbench.deployment") == deployment
    ]
    for handle in handles:
        with contextlib.suppress(SandboxError, OSError):
            provider.terminate(handle)
    if api := getattr(provider, "api", None):  # docker
        for image in api.images(filters={"label": [CHECKOUT_LABEL, f"workbench.deployment={deployment}"]}):
            with contextlib.suppress(Exception):
                api.remove_image(image["Id"], force=True)
    return len(handles)
