"""Hands as cattle, on the real Docker engine: lazy, replaceable, many per brain, passable between brains."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import pytest
from django.conf import settings
from django.db import connections
from django.test import override_settings

from harness import model
from harness.brain import run_brain
from harness.services.lifecycle import session_archive, session_create, session_send_events
from sandboxes.hands import held
from sandboxes.models import Environment, Sandbox
from sandboxes.pool import pool_refill
from sandboxes.providers.docker import DockerProvider
from sandboxes.reaper import reap_idle, reap_orphans
from sandboxes.repositories import checkout_images_made
from sessions.selectors import get_events
from tests.conftest import ROOT, child_env, make_agent, make_environment
from tests.git_server import git_http_server, make_repository, push_commit

pytestmark = pytest.mark.django_db(transaction=True)
TOOLSET = [{"type": "agent_toolset_20260401"}]


@pytest.fixture
def brains(offline_model, docker_engine):
    with override_settings(ANTHROPIC_BASE_URL=offline_model.base_url, SANDBOX_PROVIDER="docker"):
        model.client.cache_clear()
        yield offline_model
    model.client.cache_clear()


def new_session(environment_id: str | None = None) -> str:
    return session_create(
        **{"agent": make_agent(tools=TOOLSET), "environment_id": environment_id or make_environment()}
    ).id


def turn(session_id: str, text: str) -> list:
    before = len(get_events(session_id))
    session_send_events(
        session_id, events=[{"type": "user.message", "content": [{"type": "text", "text": text}]}]
    )
    assert run_brain(session_id) == "idle"
    return get_events(session_id, before)


def results(events: list) -> list[tuple[str, bool]]:
    return [
        (e.payload["content"][0]["text"], e.payload["is_error"])
        for e in events
        if e.type == "agent.tool_result"
    ]


def brain_in_a_process(session_id: str, text: str, model_url: str, **env: str) -> subprocess.Popen[bytes]:
    """Send `text`, and run the session's brain in a process of its own, for the test to kill."""
    session_send_events(
        session_id, events=[{"type": "user.message", "content": [{"type": "text", "text": text}]}]
    )
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import django; django.setup(); from harness.brain import run_brain; run_brain({session_id!r})",
        ],
        cwd=ROOT,
        env=child_env(ANTHROPIC_BASE_URL=model_url, SANDBOX_PROVIDER="docker", **env),
        start_new_session=True,
    )


def test_a_session_that_never_calls_a_tool_never_provisions(brains, docker_engine):
    session_id = new_session()
    turn(session_id, "just talk")
    assert not Sandbox.objects.exists()
    assert not [e for e in get_events(session_id) if e.type.startswith("sandbox.")]


def test_coupled_mode_provisions_before_the_first_model_call(brains):
    session_id = new_session()
    with override_settings(SANDBOX_PROVISIONING="eager"):
        events = turn(session_id, "just talk")
    kinds = [e.type for e in events]
    assert kinds.index("sandbox.provisioned") < kinds.index("span.model_request_start")


def test_a_killed_container_is_an_error_result_and_the_next_call_gets_a_new_sandbox(brains, docker_engine):
    session_id = new_session()
    assert results(turn(session_id, "/bash echo first")) == [("first", False)]
    [sandbox] = held(session_id)
    docker_engine.containers.get(sandbox.handle).kill()
    [(text, is_error)] = results(turn(session_id, "/bash echo second"))
    assert is_error and "died" in text and "killed" in text
    [(text, is_error)] = results(turn(session_id, "/bash echo third"))
    assert not is_error and "a new sandbox" in text and text.endswith("third")
    kinds = [e.type for e in get_events(session_id)]
    assert kinds.count("sandbox.provisioned") == 2 and "sandbox.failed" in kinds
    assert get_events(session_id)[-1].type == "session.status_idle"


def test_a_transfer_keeps_files_and_a_background_process_alive(brains, api):
    giver, taker = new_session(), new_session()
    turn(giver, "/bash echo kept > notes.txt; nohup sleep 301 >/dev/null 2>&1 &")
    [sandbox] = held(giver)
    response = api.post(f"/v1/sessions/{giver}/sandboxes/{sandbox.id}/transfer", {"to_session": taker})
    assert response.status_code == 200, response.content
    assert response.json()["session_id"] == taker
    [(text, is_error)] = results(turn(taker, "/bash cat notes.txt; pgrep -f 'sleep 301' | wc -l"))
    assert not is_error and text.splitlines()[:2] == ["kept", "1"] and "a new shell was started" in text
    assert held(giver) == []
    detached = [e for e in get_events(giver) if e.type == "sandbox.detached"]
    attached = [e for e in get_events(taker) if e.type == "sandbox.attached"]
    assert detached[0].payload["to_session"] == taker and attached[0].payload["from_session"] == giver


def test_a_brain_holds_several_named_hands_and_can_pass_one(brains):
    session_id, other = new_session(), new_session()
    events = turn(
        session_id,
        '/bash touch only-in-main; ls\n/tool provision_sandbox {"name": "build"}\n'
        '/tool bash {"command": "ls; echo listed", "sandbox": "build"}\n'
        '/tool bash {"command": "true", "sandbox": "nope"}',
    )
    (main_files, _), (provisioned, _), (build_files, _), (missing, missing_error) = results(events)
    assert main_files == "only-in-main" and build_files == "listed"
    assert "Provisioned sandbox 'build'" in provisioned
    assert missing_error and "holds no sandbox named 'nope'" in missing and "main" in missing
    assert [hand.name for hand in held(session_id)] == ["main", "build"]
    events = turn(session_id, f'/tool transfer_sandbox {{"name": "build", "to_session": "{other}"}}')
    [use] = [e for e in events if e.type == "agent.tool_use"]
    assert use.payload["evaluated_permission"] == "ask" and not results(events), (
        "a transfer waits for the user"
    )
    session_send_events(
        session_id,
        events=[{"type": "user.tool_confirmation", "tool_use_id": use.uid, "result": "allow"}],
    )
    assert run_brain(session_id) == "idle"
    assert not results(get_events(session_id, use.seq))[0][1]
    assert [hand.name for hand in held(other)] == ["build"]


def test_the_hands_api_attaches_detaches_and_refuses_what_it_cannot_do(brains, api):
    first, second = new_session(), new_session()
    created = api.post(f"/v1/sessions/{first}/sandboxes", {"name": "spare"}).json()
    assert created["status"] == "ready" and created["session_id"] == first
    taken = api.post(f"/v1/sessions/{second}/sandboxes", {"sandbox_id": created["id"]})
    assert taken.status_code == 400 and "held by session" in taken.json()["error"]["message"]
    assert api.post(f"/v1/sessions/{first}/sandboxes/{created['id']}/detach").json()["session_id"] is None
    attached = api.post(f"/v1/sessions/{second}/sandboxes", {"sandbox_id": created["id"]}).json()
    assert attached["session_id"] == second
    listed = api.get(f"/v1/sessions/{second}/sandboxes").json()["data"]
    assert [s["id"] for s in listed] == [created["id"]]
    assert api.get(f"/v1/sessions/{first}/sandboxes/sbx_nope/detach").status_code == 405
    assert api.post(f"/v1/sessions/{first}/sandboxes/{created['id']}/detach").status_code == 404
    gone = api.delete(f"/v1/sessions/{second}/sandboxes/{created['id']}").json()
    assert gone["status"] == "terminated"
    kinds = [e.type for e in get_events(second)]
    assert kinds == ["sandbox.attached", "sandbox.terminated"]


def test_the_warm_pool_hands_out_a_ready_sandbox_and_refills(brains):
    environment_id = make_environment(config={"type": "cloud", "sandbox": {"warm_pool": 1}})
    assert pool_refill(environment_id) == 1
    [pooled] = Sandbox.objects.filter(session__isnull=True, status="ready")
    session_id = new_session(environment_id)
    events = turn(session_id, "/bash echo from the pool")
    provisioned = [e for e in events if e.type == "sandbox.provisioned"][0]
    assert provisioned.payload["sandbox_id"] == pooled.id and provisioned.payload["pooled"]
    assert pool_refill(environment_id) == 1
    assert Sandbox.objects.filter(session__isnull=True, status="ready").count() == 1


@dataclass
class PreparedPool:
    """An environment whose warm pool (of one) comes with a served repository checked out."""

    environment_id: str
    resource: dict  # the session resource naming that repository
    head: str  # its commit

    def session(self, *resources: dict) -> str:
        return session_create(
            agent=make_agent(tools=TOOLSET), environment_id=self.environment_id, resources=list(resources)
        ).id

    def refilled(self) -> Sandbox:
        assert pool_refill(self.environment_id) == 1
        [pooled] = Sandbox.objects.filter(
            environment_id=self.environment_id, session__isnull=True, status="ready"
        )
        return pooled


@pytest.fixture
def prepared_pool(brains, tmp_path):
    """A PreparedPool whose repository one session has already fetched (so the refill can prepare it)."""
    head = make_repository(tmp_path / "served" / "origin.git", {"README.md": "hello from the repository\n"})
    with (
        git_http_server(tmp_path / "served") as server,
        override_settings(REPOSITORY_PLAIN_HOSTS=["127.0.0.1"], REPOSITORY_CACHE_DIR=str(tmp_path / "cache")),
    ):
        repository = {"url": server.url("origin.git"), "mount_path": "/workspace/app"}
        environment_id = make_environment(
            config={"type": "cloud", "sandbox": {"warm_pool": 1, "pool_repository": repository}}
        )
        pool = PreparedPool(environment_id, {"type": "github_repository", **repository}, head)
        first = pool.session(pool.resource)
        assert results(turn(first, "/bash git -C app rev-parse HEAD")) == [(head, False)]  # fills the mirror
        yield pool


def test_the_warm_pool_hands_out_its_repository_checked_out_only_to_a_session_that_proved_its_access(
    prepared_pool, api, docker_engine
):
    """Once a session fetched the repository, the refill checks it out into the pooled sandbox; the next
    session with that repository uses it as it was prepared (its clone is not made again), a session without
    it finds no trace of it, and no one attaches a prepared pool member."""
    pool = prepared_pool
    pooled = pool.refilled()
    assert pooled.labels["prepared"]["mount_path"] == "/workspace/app"
    refused = api.post(f"/v1/sessions/{pool.session()}/sandboxes", {"sandbox_id": pooled.id})
    assert refused.status_code == 400 and "warm pool" in refused.json()["error"]["message"], refused.json()
    # Changed here, the prepared checkout shows whether the session's is it or a new clone over it.
    docker_engine.containers.get(pooled.handle).exec_run(
        ["sh", "-c", "echo prepared >> /workspace/app/README.md"], user="1000"
    )
    events = turn(pool.session(pool.resource), "/bash tail -1 app/README.md; git -C app rev-parse HEAD")
    [provisioned] = [e for e in events if e.type == "sandbox.provisioned"]
    assert provisioned.payload["sandbox_id"] == pooled.id and provisioned.payload["pooled"]
    assert results(events) == [(f"prepared\n{pool.head}", False)]
    assert Sandbox.objects.get(id=pooled.id).labels["prepared"]["kept"] is True

    pooled = pool.refilled()
    events = turn(pool.session(), "/bash ls -A /workspace | wc -l")
    assert [e.payload["sandbox_id"] for e in events if e.type == "sandbox.provisioned"] == [pooled.id]
    assert results(events) == [("0", False)]
    assert Sandbox.objects.get(id=pooled.id).labels["prepared"]["kept"] is False


def test_pool_maintenance_replaces_members_the_mirror_has_moved_past_and_only_those(
    prepared_pool, docker_engine, tmp_path
):
    """A member made while the cache could give no checkout, and one whose checkout a session's fetch has
    since moved the mirror past, are replaced by beat's pool maintenance with members prepared from the
    mirror as it is; one the mirror still gives, or whose remote moved with no session fetching since, stays
    (maintenance asks no remote)."""
    from sandboxes.mirrors import mirror_path
    from sandboxes.repositories import repository_archive
    from sandboxes.tasks import maintain_pools

    def members() -> list[Sandbox]:
        return list(
            Sandbox.objects.filter(environment_id=pool.environment_id, session__isnull=True, status="ready")
        )

    def gone(sandbox: Sandbox) -> bool:
        found = docker_engine.containers.list(all=True, filters={"label": f"workbench.sandbox={sandbox.id}"})
        return Sandbox.objects.get(id=sandbox.id).status in ("dead", "terminated") and not found

    pool = prepared_pool
    with override_settings(REPOSITORY_CACHE_DIR=""):  # a refill on a worker without the cache
        assert pool_refill(pool.environment_id) == 1
    [bare] = members()
    assert "prepared" not in bare.labels
    assert maintain_pools() == 1
    [prepared] = members()
    assert gone(bare) and pool.head in prepared.labels["prepared"]["state"]

    served = tmp_path / "served" / "origin.git"
    later = push_commit(served, "later.txt", "pushed after the pool was filled\n")
    assert maintain_pools() == 0 and members() == [prepared], "renewed with no session's fetch since"

    repository_archive(pool.resource, session_id="sesn_a_later_one")  # a session's clone fetches the tip
    assert maintain_pools() == 1
    [renewed] = members()
    assert gone(prepared) and later in renewed.labels["prepared"]["state"]
    assert maintain_pools() == 0 and members() == [renewed]
    # A worker whose mirror is behind the member's (last fetched before the member was made) leaves it be.
    mirror = mirror_path(pool.resource["url"])
    subprocess.run(["git", "-C", str(mirror), "update-ref", "refs/heads/main", pool.head], check=True)
    os.utime(mirror / "FETCH_HEAD", (time.time() - 3600, time.time() - 3600))
    assert maintain_pools() == 0 and members() == [renewed]

    events = turn(pool.session(pool.resource), "/bash git -C app rev-parse HEAD")
    assert [e.payload["sandbox_id"] for e in events if e.type == "sandbox.provisioned"] == [renewed.id]
    assert results(events) == [(later, False)]
    assert Sandbox.objects.get(id=renewed.id).labels["prepared"]["kept"] is True

    member = pool.refilled()  # a member prepared as configured, until the configuration changes
    environment = Environment.objects.get(id=pool.environment_id)
    environment.config["sandbox"]["pool_repository"]["mount_path"] = "/workspace/elsewhere"
    environment.save(update_fields=["config"])
    assert maintain_pools() == 1
    [moved] = members()
    assert gone(member) and moved.labels["prepared"]["mount_path"] == "/workspace/elsewhere"


def test_a_prepared_pool_sandbox_is_out_of_reach_until_proved_and_discarded_if_its_checkout_cannot_go(
    prepared_pool, api, docker_engine, monkeypatch
):
    """While the session proves its access, the taken sandbox is provisioning: not the session's hand yet, and
    nobody's to attach. A checkout the session may not keep and that cannot be removed discards the sandbox
    (container and all; the log says so), and the session's next call gets a new one."""
    from sandboxes import repositories

    pool = prepared_pool
    pooled, other = pool.refilled(), pool.session()
    real, seen = repositories._prepared_resource, {}

    def watched(resources, prepared, *, session_id):
        seen["status"] = Sandbox.objects.get(id=pooled.id).status
        seen["held"] = held(session_id)
        seen["attach"] = api.post(f"/v1/sessions/{other}/sandboxes", {"sandbox_id": pooled.id}).status_code
        return real(resources, prepared, session_id=session_id)

    monkeypatch.setattr(repositories, "_prepared_resource", watched)
    second = pool.session(pool.resource)
    assert results(turn(second, "/bash cat app/README.md")) == [("hello from the repository", False)]
    assert seen == {"status": "provisioning", "held": [], "attach": 400}

    pooled = pool.refilled()
    container = docker_engine.containers.get(pooled.handle)
    assert container.exec_run(["chmod", "555", "/workspace"], user="1000").exit_code == 0  # no removal
    third = pool.session()
    events = turn(third, "/bash echo hi")
    [failed] = [e for e in events if e.type == "sandbox.failed"]
    assert failed.payload["sandbox_id"] == pooled.id and "warm pool" in failed.payload["reason"], (
        failed.payload
    )
    assert [ok for _, ok in results(events)] == [True]
    assert Sandbox.objects.get(id=pooled.id).status in ("dead", "terminated")
    assert not docker_engine.containers.list(all=True, filters={"label": f"workbench.sandbox={pooled.id}"})
    [(said, error)] = results(turn(third, "/bash echo hi"))
    assert said.endswith("was provisioned: the previous one had died]\nhi") and not error, said


def test_the_reaper_running_while_the_pool_refills_leaves_the_new_containers_alone(
    brains, docker_engine, monkeypatch
):
    import threading

    from sandboxes import hands
    from tests.conftest import in_thread

    environment_id = make_environment(config={"type": "cloud", "sandbox": {"warm_pool": 1}})
    real = hands.provider_of

    class ReapedRightAfter:
        """The real provider; right after the container starts, the reaper runs (another connection)."""

        def __init__(self, sandbox):
            self.provider = real(sandbox)

        def provision(self, resources):
            handle = self.provider.provision(resources)
            reaper = threading.Thread(target=in_thread, args=(lambda: reap_orphans(("docker",)),))
            reaper.start()
            reaper.join(60)
            return handle

    monkeypatch.setattr(hands, "provider_of", ReapedRightAfter)
    assert pool_refill(environment_id) == 1
    monkeypatch.setattr(hands, "provider_of", real)
    [pooled] = Sandbox.objects.filter(environment_id=environment_id, session__isnull=True, status="ready")
    assert docker_engine.containers.get(pooled.handle).status == "running", (
        "the reaper removed the pool's container"
    )


def test_no_container_is_left_behind_after_a_worker_dies_mid_call_and_the_reaper_runs(brains, docker_engine):
    session_id = new_session()
    worker = brain_in_a_process(session_id, "/bash sleep 60", brains.base_url)
    deadline = time.monotonic() + 60
    while not held(session_id):  # the call's sandbox is up, so the call is running in it
        assert time.monotonic() < deadline and worker.poll() is None
        time.sleep(0.2)
    time.sleep(0.5)
    worker.kill()
    worker.wait()
    labelled = docker_engine.containers.list(filters={"label": "workbench.managed=true"})
    assert any(c.labels.get("workbench.sandbox") == held(session_id)[0].id for c in labelled)
    orphan = docker_engine.containers.run(
        "workbench-sandbox:latest",
        "sleep 300",
        detach=True,
        labels={
            "workbench.managed": "true",
            "workbench.sandbox": "sbx_nobody",
            "workbench.environment": "env_orphan",
            "workbench.deployment": settings.WORKBENCH_DEPLOYMENT,
        },
    )
    elsewhere = docker_engine.containers.run(
        "workbench-sandbox:latest",
        "sleep 300",
        detach=True,
        labels={
            "workbench.managed": "true",
            "workbench.sandbox": "sbx_theirs",
            "workbench.environment": "env_theirs",
            "workbench.deployment": "another-deployment",
        },
    )
    session_archive(session_id)
    assert len(reap_idle()) == 1
    reap_orphans(("docker",))
    remaining = [
        c.labels.get("workbench.sandbox")
        for c in docker_engine.containers.list(all=True, filters={"label": "workbench.managed=true"})
    ]
    assert orphan.id not in [c.id for c in docker_engine.containers.list(all=True)]
    assert elsewhere.id in [c.id for c in docker_engine.containers.list(all=True)], (
        "another deployment's is kept"
    )
    elsewhere.remove(force=True)
    assert not [s for s in remaining if s and Sandbox.objects.filter(id=s, session_id=session_id).exists()]


def test_a_brain_killed_while_provisioning_leaves_the_next_brain_a_sandbox_to_use(brains, docker_engine):
    """The dead brain's row stays `provisioning` under the hand's name; the next brain of the session gives it
    up instead of refusing every call ('already holds a sandbox named main') until the reaper's grace ends."""
    session_id = new_session()
    worker = brain_in_a_process(session_id, "/bash echo first", brains.base_url, LEASE_SECONDS="1")
    provisioning = Sandbox.objects.filter(session_id=session_id, status=Sandbox.Status.PROVISIONING)
    deadline = time.monotonic() + 60
    while not provisioning.exists():
        assert time.monotonic() < deadline and worker.poll() is None, "the brain never provisioned"
        time.sleep(0.01)
    worker.kill()
    worker.wait()
    [stale] = provisioning
    time.sleep(1.5)  # the dead brain's lease lapses

    assert run_brain(session_id, by="sweeper") == "idle"  # closes the call the dead brain left
    [(text, is_error)] = results(turn(session_id, "/bash echo second"))
    assert not is_error, text
    assert text.endswith("second") and "given up" in text
    stale.refresh_from_db()
    assert stale.status in (Sandbox.Status.DEAD, Sandbox.Status.TERMINATED)
    [hand] = held(session_id)
    assert hand.name == "main" and hand.id != stale.id
    reap_orphans(("docker",))
    sandboxes = {c.labels.get("workbench.sandbox") for c in docker_engine.containers.list(all=True)}
    assert stale.id not in sandboxes, "the given-up sandbox's container is reaped"


def test_a_provider_that_is_down_gives_an_error_result_and_the_session_goes_idle(brains, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    session_id = new_session()
    [(text, is_error)] = results(turn(session_id, "/bash echo hi"))
    assert is_error and "could not" in text
    failed = [e for e in get_events(session_id) if e.type == "sandbox.failed"]
    assert failed and failed[0].payload["reason"]
    assert get_events(session_id)[-1].type == "session.status_idle"


def test_a_session_repository_is_cloned_into_its_sandbox_before_the_first_call_in_coupled_mode(
    brains, tmp_path
):
    make_repository(tmp_path / "served" / "origin.git", {"README.md": "hello from the repository\n"})
    environment_id = make_environment(config={"type": "cloud", "sandbox": {"provisioning": "eager"}})
    with (
        git_http_server(tmp_path / "served") as server,
        override_settings(REPOSITORY_PLAIN_HOSTS=["127.0.0.1"]),
    ):
        repositories = [
            {"type": "github_repository", "url": server.url("origin.git"), "mount_path": "/workspace/app"},
            {"type": "github_repository", "url": server.url("missing.git")},
        ]
        session_id = session_create(
            **{
                "agent": make_agent(tools=TOOLSET),
                "environment_id": environment_id,
                "resources": repositories,
            }
        ).id
        events = turn(session_id, "/bash cat app/README.md; git -C app log --oneline | wc -l; stat -c %U app")
    kinds = [e.type for e in events]
    assert kinds.index("sandbox.provisioned") < kinds.index("span.model_request_start")
    assert results(events) == [("hello from the repository\n1\nsandbox", False)]
    [error] = [e for e in events if e.type == "session.error"]
    assert error.payload["error"]["type"] == "repository_not_found_error"
    assert error.payload["error"]["retry_status"] == {"type": "retrying"}


SLOW_GIT_REQUEST_S = 0.2  # each request to the served repository waits this long: a clone makes several


def session_with_repository(server) -> str:
    repository = {
        "type": "github_repository",
        "url": server.url("origin.git"),
        "mount_path": "/workspace/app",
    }
    return session_create(
        **{
            "agent": make_agent(tools=TOOLSET),
            "environment_id": make_environment(),
            "resources": [repository],
        }
    ).id


def test_a_repository_is_cloned_while_the_first_model_call_thinks(brains, tmp_path):
    """A session with a repository whose first model call takes 2 s gets its first tool result less than 1 s
    after the model asks for the tool: its sandbox was provisioned, and the repository cloned, meanwhile,
    from a server slow enough that the clone alone takes longer than that (SPECULATIVE_PROVISIONING=never
    fails this test). A sandbox a call used is no longer reaped as an unused one."""
    make_repository(tmp_path / "served" / "origin.git", {"README.md": "hello from the repository\n"})
    with (
        git_http_server(tmp_path / "served", delay_s=SLOW_GIT_REQUEST_S) as server,
        override_settings(REPOSITORY_PLAIN_HOSTS=["127.0.0.1"]),
    ):
        session_id = session_with_repository(server)
        events = turn(session_id, "/sleep 2\n/bash cat app/README.md")
    [use] = [e for e in events if e.type == "agent.tool_use"]
    [result] = [e for e in events if e.type == "agent.tool_result"]
    assert results(events) == [("hello from the repository", False)]
    waited = (result.processed_at - use.processed_at).total_seconds()
    assert waited < 1.0, f"the first tool result came {waited:.2f} s after the model asked for the tool"
    [provisioned] = [e for e in get_events(session_id) if e.type == "sandbox.provisioned"]
    started = next(e for e in events if e.type == "span.model_request_start")
    container_s = (provisioned.processed_at - started.processed_at).total_seconds()
    assert container_s + len(server.requests) * SLOW_GIT_REQUEST_S > 1.0, (
        "the container's start and the clone's requests alone would make the call wait longer than 1 s"
    )
    [hand] = held(session_id)
    assert provisioned.payload["sandbox_id"] == hand.id and not hand.labels["speculative"]
    with override_settings(SPECULATIVE_IDLE_SECONDS=0):
        assert reap_idle() == []


def test_a_sandbox_started_after_a_states_second_clone_comes_with_the_checkout_in_its_image(brains, tmp_path):
    """Two sessions clone one state of a repository (the second reads the kept clone, and has it made into an
    image); the third session's sandbox starts from that image, labelled so, and its first call finds the
    repository there."""
    make_repository(tmp_path / "served" / "origin.git", {"README.md": "hello from the repository\n"})
    with (
        git_http_server(tmp_path / "served") as server,
        override_settings(REPOSITORY_PLAIN_HOSTS=["127.0.0.1"]),
    ):
        sessions = [session_with_repository(server) for _ in range(3)]
        for session_id in sessions[:2]:
            assert results(turn(session_id, "/bash cat app/README.md")) == [
                ("hello from the repository", False)
            ]
        assert checkout_images_made(120)
        events = turn(sessions[2], "/bash cat app/README.md; git -C app status --porcelain; stat -c %U app")
    assert results(events) == [("hello from the repository\nsandbox", False)]
    assert [bool(held(s)[0].labels.get("checkout_image")) for s in sessions] == [False, False, True]


def test_the_repositories_are_cloned_while_the_sandbox_starts(brains, tmp_path, monkeypatch):
    """The container's start does not wait for the clone, nor the clone for the container: the repository
    server is asked before the provider has started the container (the provider here waits for that), and
    the repository is in the sandbox all the same."""
    make_repository(tmp_path / "served" / "origin.git", {"README.md": "hello from the repository\n"})
    waited: list[bool] = []
    start = DockerProvider.provision

    with (
        git_http_server(tmp_path / "served") as server,
        override_settings(REPOSITORY_PLAIN_HOSTS=["127.0.0.1"], SPECULATIVE_PROVISIONING="never"),
    ):

        def provision_once_asked(self, resources):  # type: ignore[no-untyped-def]
            deadline = time.monotonic() + 30
            while not server.requests and time.monotonic() < deadline:
                time.sleep(0.01)
            waited.append(bool(server.requests))
            return start(self, resources)

        monkeypatch.setattr(DockerProvider, "provision", provision_once_asked)
        session_id = session_with_repository(server)
        events = turn(session_id, "/bash cat app/README.md")
    assert waited == [True], "the clone did not begin before the container was started"
    assert results(events) == [("hello from the repository", False)]


def test_a_message_sent_while_the_sandbox_is_still_provisioned_ahead_is_answered_beside_it(brains, tmp_path):
    """A first turn that calls no tool ends before its provisioning ahead does; a second message sent then is
    taken by the same brain at once: its model request goes out while the repository is still cloning (as
    the first one did), not after, and its first tool result still finds the repository."""
    make_repository(tmp_path / "served" / "origin.git", {"README.md": "hello from the repository\n"})
    slow_s = 0.5
    with (
        git_http_server(tmp_path / "served", delay_s=slow_s) as server,
        override_settings(REPOSITORY_PLAIN_HOSTS=["127.0.0.1"]),
    ):
        session_id = session_with_repository(server)
        session_send_events(
            session_id, events=[{"type": "user.message", "content": [{"type": "text", "text": "just talk"}]}]
        )
        outcome: list[str] = []

        def work() -> None:
            try:
                outcome.append(run_brain(session_id))
            finally:
                connections.close_all()

        brain = threading.Thread(target=work)
        brain.start()
        deadline = time.monotonic() + 60
        while not any(e.type == "session.status_idle" for e in get_events(session_id)):
            assert time.monotonic() < deadline, "the first turn did not end"
            time.sleep(0.01)
        second = len(get_events(session_id))
        session_send_events(
            session_id,
            events=[
                {"type": "user.message", "content": [{"type": "text", "text": "/bash cat app/README.md"}]}
            ],
        )
        brain.join(timeout=120)
    assert outcome == ["idle"]
    events = get_events(session_id)
    later = events[second:]
    assert results(later) == [("hello from the repository", False)]
    [message] = [e for e in later if e.type == "user.message"]
    request = next(e for e in later if e.type == "span.model_request_start")
    [provisioned] = [e for e in events if e.type == "sandbox.provisioned"]
    cloned_by = provisioned.processed_at.timestamp() + len(server.requests) * slow_s  # the clone ended after
    assert request.processed_at.timestamp() < cloned_by, (
        "the second turn's model request waited for the provisioning ahead to end"
    )
    assert (request.processed_at - message.processed_at).total_seconds() < 1.0


def test_a_sandbox_provisioned_ahead_that_no_call_uses_is_reaped_after_the_idle_timeout(
    brains, docker_engine, tmp_path
):
    """A session with a repository that never calls a tool gets its sandbox provisioned ahead, as the log says,
    and has none running once it was idle for SPECULATIVE_IDLE_SECONDS and the reaper ran."""
    make_repository(tmp_path / "served" / "origin.git", {"README.md": "hello\n"})
    with (
        git_http_server(tmp_path / "served") as server,
        override_settings(REPOSITORY_PLAIN_HOSTS=["127.0.0.1"]),
    ):
        session_id = session_with_repository(server)
        turn(session_id, "just talk")
    [sandbox] = held(session_id)
    assert sandbox.labels["speculative"]
    assert [e.type for e in get_events(session_id) if e.type.startswith("sandbox.")] == [
        "sandbox.provisioned"
    ]
    assert reap_idle() == [], "the environment's idle TTL (an hour) is not the one of an unused sandbox"
    time.sleep(1.5)
    with override_settings(SPECULATIVE_IDLE_SECONDS=1):
        assert reap_idle() == [sandbox.id]
    assert not docker_engine.containers.list(all=True, filters={"label": f"workbench.sandbox={sandbox.id}"})
    assert [e.type for e in get_events(session_id)][-1] == "sandbox.terminated"


def test_no_sandbox_is_provisioned_ahead_while_as_many_as_the_cap_are_starting(brains, tmp_path):
    """Provisioning ahead is the work shed when the engine falls behind: while SPECULATIVE_MAX_IN_FLIGHT
    sandboxes are being provisioned (another session's, here), a turn that would provision ahead does not,
    and the log shows no sandbox; once that one is no longer starting, the next turn does."""
    make_repository(tmp_path / "served" / "origin.git", {"README.md": "hello\n"})
    with (
        git_http_server(tmp_path / "served") as server,
        override_settings(REPOSITORY_PLAIN_HOSTS=["127.0.0.1"], SPECULATIVE_MAX_IN_FLIGHT=1),
    ):
        session_id = session_with_repository(server)
        starting = Sandbox.objects.create(
            environment=Environment.objects.get(id=make_environment()), provider="docker"
        )
        turn(session_id, "just talk")
        assert held(session_id) == []
        assert not [e for e in get_events(session_id) if e.type.startswith("sandbox.")]
        Sandbox.objects.filter(id=starting.id).update(status=Sandbox.Status.DEAD)
        turn(session_id, "just talk again")
    [sandbox] = held(session_id)
    assert sandbox.labels["speculative"]
    assert [e.type for e in get_events(session_id) if e.type.startswith("sandbox.")] == [
        "sandbox.provisioned"
    ]
