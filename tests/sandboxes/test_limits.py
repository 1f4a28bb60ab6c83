"""What a session may take is bounded (issue 13, item 8): installation-wide maxima for an environment's
sandboxes, a cap on the sandboxes one session holds, the API's name rule on the tool path, and a disk
quota per Docker sandbox."""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
import requests
from django.db import connection, transaction
from django.test import override_settings

from harness import model
from harness.brain import run_brain
from harness.services.lifecycle import session_create, session_send_events
from sandboxes.hands import held, resources_for, sandbox_provision
from sandboxes.models import Environment, Sandbox
from sandboxes.providers import Resources, SandboxError, ToolFailed
from sessions.models import Session
from sessions.selectors import get_events
from tests.conftest import in_thread, make_agent, make_environment, on_postgres, require

TOOLSET = [{"type": "agent_toolset_20260401"}]
MAXIMA = {
    "SANDBOX_MAX_MEMORY_MB": 8192,
    "SANDBOX_MAX_CPUS": 4.0,
    "SANDBOX_MAX_PIDS": 4096,
    "SANDBOX_MAX_DISK_MB": 10240,
    "SANDBOX_MAX_WARM_POOL": 10,
    "SANDBOX_MAX_PER_SESSION": 8,
}


def sandbox_config(**sandbox: object) -> dict:
    return {"type": "cloud", "sandbox": sandbox}


def refusal(response) -> str:
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    return error["message"]


# -- the maxima, at the API


@pytest.mark.django_db
@override_settings(**MAXIMA)
@pytest.mark.parametrize(
    ("field", "asked", "maximum"),
    [
        ("memory_mb", 65536, "8192"),
        ("cpus", 64, "4"),
        ("pids", 32768, "4096"),
        ("warm_pool", 50, "10"),
        ("disk_mb", 10_000_000, "10240"),
        ("max_sandboxes", 100, "8"),
    ],
)
def test_an_environment_asking_for_more_than_a_maximum_is_a_400_naming_the_field_and_the_maximum(
    api, field, asked, maximum
):
    message = refusal(
        api.post("/v1/environments", {"name": "greedy", "config": sandbox_config(**{field: asked})})
    )
    assert f"'config.sandbox.{field}'" in message and f"to {maximum} " in message and "maximum" in message
    assert not Environment.objects.exists()
    modest = api.post("/v1/environments", {"name": "modest"}).json()
    message = refusal(
        api.post(f"/v1/environments/{modest['id']}", {"config": sandbox_config(**{field: asked})})
    )
    assert f"'config.sandbox.{field}'" in message and maximum in message


@pytest.mark.django_db
@override_settings(**MAXIMA)
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("memory_mb", "lots"),
        ("memory_mb", 512.5),
        ("pids", True),
        ("cpus", float("nan")),
        ("cpus", [2]),
        ("disk_mb", "1G"),
        ("max_sandboxes", 0),
        ("warm_pool", -1),
    ],
)
def test_a_limit_of_the_wrong_type_or_below_the_least_is_a_400_not_a_crash_at_provisioning(api, field, value):
    message = refusal(
        api.post("/v1/environments", {"name": "odd", "config": sandbox_config(**{field: value})})
    )
    assert f"'config.sandbox.{field}' must be" in message


@pytest.mark.django_db
@override_settings(**MAXIMA)
def test_limits_at_the_maxima_are_accepted_and_null_means_the_installation_default(api):
    config = sandbox_config(memory_mb=8192, cpus=4, pids=4096, warm_pool=0, disk_mb=10240, max_sandboxes=None)
    created = api.post("/v1/environments", {"name": "at the top", "config": config})
    assert created.status_code == 200, created.content
    assert created.json()["config"]["sandbox"]["disk_mb"] == 10240
    assert created.json()["config"]["sandbox"]["max_sandboxes"] is None


@pytest.mark.django_db
def test_provisioning_holds_a_stored_environment_to_maxima_lowered_since_and_to_the_quota_setting():
    environment = Environment.objects.get(id=make_environment())
    environment.config["sandbox"].update(memory_mb=65536, cpus=64, pids=32768, disk_mb=10_000_000)
    sandbox = Sandbox(id="sbx_probe", environment=environment)
    with override_settings(**MAXIMA, SANDBOX_DISK_QUOTA=True):
        resources = resources_for(environment, sandbox)
    assert (resources.memory_mb, resources.cpus, resources.pids, resources.disk_mb) == (
        8192,
        4.0,
        4096,
        10240,
    )
    environment.config["sandbox"]["disk_mb"] = None
    with override_settings(SANDBOX_DISK_QUOTA=True, SANDBOX_DISK_MB=300):
        assert resources_for(environment, sandbox).disk_mb == 300
    with override_settings(SANDBOX_DISK_QUOTA=False):
        assert resources_for(environment, sandbox).disk_mb is None


# -- the name rule and the cap, on the tool path (a real brain) and the API path


@pytest.fixture
def brains(offline_model):
    with override_settings(
        ANTHROPIC_BASE_URL=offline_model.base_url, SANDBOX_PROVIDER="docker", SANDBOX_DISK_QUOTA=False
    ):
        model.client.cache_clear()
        yield offline_model
    model.client.cache_clear()


def new_session(**sandbox: object) -> str:
    environment = make_environment(config=sandbox_config(**sandbox))
    return session_create(**{"agent": make_agent(tools=TOOLSET), "environment_id": environment}).id


def turn(session_id: str, text: str) -> list[tuple[str, bool]]:
    before = len(get_events(session_id))
    session_send_events(
        session_id, events=[{"type": "user.message", "content": [{"type": "text", "text": text}]}]
    )
    assert run_brain(session_id) == "idle"
    return [
        (e.payload["content"][0]["text"], e.payload["is_error"])
        for e in get_events(session_id, before)
        if e.type == "agent.tool_result"
    ]


@pytest.mark.django_db(transaction=True)
def test_a_sandbox_name_the_api_would_refuse_is_a_tool_error_and_the_brain_goes_on(brains):
    """On PostgreSQL a 300-character name crashed the worker with DataError (the column holds 64)."""
    session_id = new_session()
    long = "x" * 300
    results = turn(
        session_id,
        f'/tool provision_sandbox {{"name": ""}}\n'
        f'/tool provision_sandbox {{"name": "{long}"}}\n'
        f'/tool bash {{"command": "true", "sandbox": "{long}"}}\n'
        '/tool provision_sandbox {"name": "two\\nlines"}',
    )
    (empty, empty_error), (too_long, long_error), (via_bash, bash_error), (control, control_error) = results
    assert empty_error and "needs a name of 1 to 64 characters" in empty
    assert long_error and "at most 64 characters, not 300" in too_long
    assert bash_error and "at most 64 characters, not 300" in via_bash
    assert control_error and "control characters" in control
    assert not Sandbox.objects.exists()
    assert get_events(session_id)[-1].type == "session.status_idle"
    assert turn(session_id, "just talk") == []


@pytest.mark.django_db(transaction=True)
def test_the_tool_path_refuses_a_hand_over_the_cap_and_says_how_to_release_one(brains, docker_engine):
    session_id = new_session(max_sandboxes=2)
    results = turn(
        session_id,
        '/tool provision_sandbox {"name": "a"}\n/tool provision_sandbox {"name": "b"}\n'
        '/tool provision_sandbox {"name": "c"}\n'
        '/tool bash {"command": "echo hi", "sandbox": "a"}',
    )
    (_, a_error), (_, b_error), (refused, c_error), (said, bash_error) = results
    assert not a_error and not b_error and not bash_error and said == "hi"
    assert c_error and "as many sandboxes as it may (2: " in refused and "'a', 'b'." in refused
    assert "max_sandboxes" in refused and "release_sandbox" in refused
    assert [hand.name for hand in held(session_id)] == ["a", "b"]
    results = turn(session_id, '/tool release_sandbox {"name": "a"}\n/tool provision_sandbox {"name": "c"}')
    assert [is_error for _, is_error in results] == [False, False]
    assert [hand.name for hand in held(session_id)] == ["b", "c"]


@pytest.mark.django_db(transaction=True)
def test_hands_a_stopped_brain_left_provisioning_under_any_name_do_not_count_toward_the_cap(
    brains, docker_engine
):
    """The next brain gives up every row an earlier brain of the session left provisioning (its lease epoch
    older than the session's), not only one under the name it wants: each would otherwise hold a place under
    the cap until the reaper's grace. An operator's provisioning (no epoch) still counts."""
    session_id = new_session(max_sandboxes=2)
    session = Session.objects.get(id=session_id)
    environment = session.environment
    stale = Sandbox.objects.create(
        session=session,
        environment=environment,
        name="other",
        provider="docker",
        labels={"lease_epoch": session.lease_epoch},
    )
    operators = Sandbox.objects.create(
        session=session, environment=environment, name="api", provider="docker"
    )
    [(said, is_error)] = turn(session_id, "/bash echo hi")
    assert not is_error and said == "hi", said
    stale.refresh_from_db()
    operators.refresh_from_db()
    assert stale.status == Sandbox.Status.DEAD
    assert operators.status == Sandbox.Status.PROVISIONING
    assert [hand.name for hand in held(session_id)] == ["main"]


@pytest.mark.django_db(transaction=True)
def test_the_api_refuses_a_hand_over_the_installation_cap_with_a_400(brains, docker_engine, api):
    session_id = new_session()
    with override_settings(SANDBOX_MAX_PER_SESSION=1):
        assert api.post(f"/v1/sessions/{session_id}/sandboxes", {"name": "only"}).status_code == 200
        message = refusal(api.post(f"/v1/sessions/{session_id}/sandboxes", {"name": "second"}))
    assert (
        "as many sandboxes as it may (1: " in message
        and "'only'." in message
        and "SANDBOX_MAX_PER_SESSION=1" in message
    )
    assert f"DELETE /v1/sessions/{session_id}/sandboxes/" in message
    assert [hand.name for hand in held(session_id)] == ["only"]


@pytest.mark.django_db(transaction=True)
def test_attaching_or_transferring_into_a_session_at_its_cap_is_refused_and_moves_nothing(
    brains, docker_engine, api
):
    full, giver = new_session(max_sandboxes=1), new_session()
    assert api.post(f"/v1/sessions/{full}/sandboxes", {"name": "only"}).status_code == 200
    given = api.post(f"/v1/sessions/{giver}/sandboxes", {"name": "spare"}).json()
    refused = refusal(
        api.post(f"/v1/sessions/{giver}/sandboxes/{given['id']}/transfer", {"to_session": full})
    )
    assert "as many sandboxes as it may (1: " in refused
    assert api.post(f"/v1/sessions/{giver}/sandboxes/{given['id']}/detach").status_code == 200
    refused = refusal(api.post(f"/v1/sessions/{full}/sandboxes", {"sandbox_id": given["id"]}))
    assert "as many sandboxes as it may (1: " in refused
    assert [hand.name for hand in held(full)] == ["only"]
    assert Sandbox.objects.get(id=given["id"]).session_id is None


@pytest.mark.django_db
def test_a_name_made_free_for_an_arriving_hand_still_fits_the_name_column():
    from sandboxes.hands import _free_name

    session_id = new_session()
    environment = Sandbox._meta.get_field("environment").related_model.objects.first()
    longest = "x" * 64
    for name in (longest, longest[:62] + "-2"):
        Sandbox.objects.create(
            environment=environment,
            session_id=session_id,
            name=name,
            provider="docker",
            status=Sandbox.Status.READY,
        )
    chosen = _free_name(session_id, longest)
    assert len(chosen) <= 64 and chosen == longest[:62] + "-3"


def _waiting_on_locks(cursor) -> int:
    cursor.execute("SELECT pg_stat_clear_snapshot()")  # else the view stays as this transaction first saw it
    cursor.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock'"
    )
    return cursor.fetchone()[0]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_provisionings_racing_for_the_last_places_cannot_pass_the_cap(brains, docker_engine):
    """A lock on the sandboxes table stops inserts, not reads: four provisionings are held until all four
    wait on a lock, so that unless the session's lock serialises them, each counts the live hands before
    any other's row exists."""
    require(
        on_postgres(), "racing transactions need PostgreSQL's row locks; run with DATABASE_URL=postgres://…"
    )
    session_id = new_session(max_sandboxes=2)
    outcomes: list[str] = []

    def provision(name: str) -> None:
        try:
            sandbox_provision(session_id, name=name)
            outcomes.append("provisioned")
        except Exception as error:  # noqa: BLE001 - the outcome is what the test counts
            outcomes.append(type(error).__name__)

    threads = [threading.Thread(target=in_thread, args=(lambda n=n: provision(n),)) for n in "abcd"]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"LOCK TABLE {Sandbox._meta.db_table} IN SHARE MODE")  # inserts wait, reads do not
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 60
        while _waiting_on_locks(cursor) < 4:
            assert time.monotonic() < deadline, "the four provisionings did not all reach their insert"
            time.sleep(0.05)
    for thread in threads:
        thread.join(120)
    assert sorted(outcomes) == ["Invalid", "Invalid", "provisioned", "provisioned"]
    assert Sandbox.objects.filter(session_id=session_id, status="ready").count() == 2


# -- the disk quota of a Docker sandbox


def _engine_root(provider) -> Path | None:
    root = Path(provider.api.info().get("DockerRootDir") or "")
    return root if root.is_dir() else None


def _quota_problem(provider) -> str | None:
    """None when the engine enforces `storage_opt` sizes, else what it says."""
    try:
        provider.terminate(
            provider.provision(Resources(disk_mb=64, labels={"workbench.test": "quota-probe"}))
        )
    except SandboxError as error:
        return str(error)
    return None


class _EngineWithoutQuotas(docker.APIClient):
    """A Docker API client whose engine answers a size option as overlay2 on ext4 does (dockerd 20.10's
    words); this machine's engine enforces quotas, so the refusal is played, not reached."""

    def inspect_image(self, image: str) -> Any:  # one with the toolbox in it: no toolbox image to make
        from sandboxes.providers.docker import TOOLBOX_LABEL, toolbox_digest

        return {"Id": f"sha256:{image}", "Config": {"Labels": {TOOLBOX_LABEL: toolbox_digest()}}}

    def create_container(self, *args: Any, **kwargs: Any) -> Any:
        response = requests.Response()
        response.status_code = 500
        raise docker.errors.APIError(
            "500 Server Error",
            response=response,
            explanation=("--storage-opt is supported only for overlay over xfs with 'pquota' mount option"),
        )


def test_an_engine_that_cannot_enforce_the_quota_refuses_to_provision_and_says_what_to_do():
    from sandboxes.providers.docker import DockerProvider

    provider = DockerProvider(api=_EngineWithoutQuotas(base_url="unix:///nonexistent.sock", version="1.41"))
    with pytest.raises(SandboxError) as refused:
        provider.provision(Resources(disk_mb=512, labels={"workbench.test": "quota-refused"}))
    assert "disk quota" in str(refused.value) and "pquota" in str(refused.value)
    assert "SANDBOX_DISK_QUOTA=off" in str(refused.value)


def _as_sandbox_user(provider, handle: str, *command: str) -> None:
    """Run `command` beside the toolbox, which cannot work while the sandbox's disk is full."""
    provider.api.exec_start(provider.api.exec_create(handle, list(command), user="1000")["Id"])


def test_writing_2_gb_into_a_sandbox_with_a_quota_stops_at_the_quota(docker_provider):
    problem = _quota_problem(docker_provider)
    require(
        problem is None,
        f"the Docker engine cannot enforce disk quotas ({problem}); start it with scripts/start-dockerd.sh "
        "(XFS with pquota, or btrfs) or point DOCKER_HOST at one that can",
    )
    labels = {"workbench.sandbox": f"quota-{uuid.uuid4().hex[:8]}", "workbench.test": "quota"}
    handle = docker_provider.provision(Resources(disk_mb=256, labels=labels))
    root = _engine_root(docker_provider)
    try:
        for place in ("/workspace", "/tmp"):
            used_before = shutil.disk_usage(root).used if root else 0
            write = (
                f"dd if=/dev/zero of={place}/big bs=1M count=2048 2>/dev/shm/dd.txt; stat -c %s {place}/big"
            )
            # The call's own output has no room either: what it says is read once the file is gone.
            with contextlib.suppress(ToolFailed):
                docker_provider.execute(
                    handle, "bash", {"command": f"{write} >/dev/shm/size.txt"}, timeout_s=120
                )
            grown = shutil.disk_usage(root).used - used_before if root else 0
            _as_sandbox_user(docker_provider, handle, "rm", "-f", f"{place}/big")
            said = docker_provider.execute(
                handle, "bash", {"command": "cat /dev/shm/dd.txt /dev/shm/size.txt"}
            )
            assert "Disk quota exceeded" in said or "No space left on device" in said, said
            assert int(said.split()[-1]) <= 256 * 1024 * 1024, said
            assert grown < 1024**3, f"the engine's disk grew by {grown} bytes"
        assert docker_provider.execute(handle, "bash", {"command": "echo still works"}) == "still works"
    finally:
        docker_provider.terminate(handle)


@pytest.mark.django_db
@override_settings(SANDBOX_MAX_WARM_POOL=2)
def test_a_warm_pool_stored_before_its_maximum_was_lowered_is_held_to_it():
    from sandboxes.pool import pool_size

    environment = Environment.objects.get(id=make_environment())
    environment.config = sandbox_config(warm_pool=50)
    environment.save(update_fields=["config"])
    assert pool_size(environment) == 2
