"""A sandbox provisioned ahead that no call used goes back to its environment when its session ends, and the
next session with the same repository takes it (sandboxes/returns.py): on the real Docker engine, with the
repository served over HTTP."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from harness.services.lifecycle import session_archive, session_create
from kernel.errors import Invalid
from sandboxes import hands, provisioning
from sandboxes.hands import held, sandbox_release
from sandboxes.models import Environment, Sandbox
from sandboxes.providers.docker import DockerProvider
from sandboxes.reaper import reap_idle
from sessions.selectors import get_events
from tests.conftest import make_agent, make_environment
from tests.git_server import git_http_server, make_repository, push_commit
from tests.sandboxes.test_hands import TOOLSET, brains, results, turn  # noqa: F401 - `brains`: used by pytestmark
from workbench.ui.selectors import free_sandboxes

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("brains")]


def session_in(environment_id: str, url: str, mount_path: str = "/workspace/app") -> str:
    repository = {"type": "github_repository", "url": url, "mount_path": mount_path}
    return session_create(
        agent=make_agent(tools=TOOLSET), environment_id=environment_id, resources=[repository]
    ).id


def containers(docker_engine: Any, environment_id: str) -> list[Any]:
    return docker_engine.containers.list(
        all=True, filters={"label": f"workbench.environment={environment_id}"}
    )


def sandbox_events(session_id: str) -> list[Any]:
    return [e for e in get_events(session_id) if e.type.startswith("sandbox.")]


def ended_unused(environment_id: str, url: str) -> Sandbox:
    """A session that never called a tool, archived and reaped: its sandbox provisioned ahead, as it is now."""
    session_id = session_in(environment_id, url)
    turn(session_id, "just talk")
    [sandbox] = held(session_id)
    assert sandbox.labels["speculative"] and sandbox.labels["returnable"]["session"] == session_id
    session_archive(session_id)
    assert reap_idle() == [], "an unused sandbox of an ended session goes back, it is not reaped"
    sandbox.refresh_from_db()
    return sandbox


@pytest.fixture
def served(tmp_path: Path):  # type: ignore[no-untyped-def]
    make_repository(tmp_path / "served" / "origin.git", {"README.md": "hello from the repository\n"})
    with (
        git_http_server(tmp_path / "served") as server,
        override_settings(REPOSITORY_PLAIN_HOSTS=["127.0.0.1"]),
    ):
        yield server


def test_an_unused_sandbox_goes_back_at_its_sessions_end_and_the_next_session_takes_it(
    docker_engine, served, api
):
    """The first session's sandbox, provisioned ahead and never used, is free and ready once the session
    ended (its log says it went back), attaching it is refused, and the next session of the environment
    with the same repository gets it, as its log says, with no second container: its first call finds the
    checkout, which the session kept only after its own fetch from the remote."""
    environment_id = make_environment()
    first = ended_unused(environment_id, served.url("origin.git"))
    assert first.session_id is None and first.status == Sandbox.Status.READY and first.labels["returned"]
    [container] = containers(docker_engine, environment_id)
    assert container.status == "running"
    detached = sandbox_events(first.labels["returnable"]["session"])[-1]
    assert detached.type == "sandbox.detached" and detached.payload["returned"] is True

    other = session_in(environment_id, served.url("origin.git"))
    response = api.post(f"/v1/sessions/{other}/sandboxes", {"sandbox_id": first.id})
    assert (
        response.status_code == 400
        and "handed out only by provisioning" in response.json()["error"]["message"]
    )

    second = session_in(environment_id, served.url("origin.git"))
    asked = len(served.requests)
    events = turn(second, "/bash cat app/README.md; git -C app status --porcelain; stat -c %U app")
    assert results(events) == [("hello from the repository\nsandbox", False)]
    [provisioned] = [e for e in events if e.type == "sandbox.provisioned"]
    assert provisioned.payload["sandbox_id"] == first.id and provisioned.payload["returned"] is True
    assert len(served.requests) > asked, "the second session did not ask the remote itself"
    [hand] = held(second)
    assert hand.id == first.id and hand.labels["prepared"]["kept"] and not hand.labels["speculative"]
    assert [c.id for c in containers(docker_engine, environment_id)] == [container.id]


def test_a_sandbox_a_call_used_is_terminated_at_its_sessions_end(docker_engine, served):
    environment_id = make_environment()
    session_id = session_in(environment_id, served.url("origin.git"))
    assert results(turn(session_id, "/bash cat app/README.md")) == [("hello from the repository", False)]
    [sandbox] = held(session_id)
    session_archive(session_id)
    assert reap_idle() == [sandbox.id]
    assert not containers(docker_engine, environment_id)
    assert sandbox_events(session_id)[-1].type == "sandbox.terminated"


def test_a_returned_sandbox_no_session_takes_is_removed_after_the_idle_timeout(docker_engine, served):
    environment_id = make_environment()
    sandbox = ended_unused(environment_id, served.url("origin.git"))
    assert containers(docker_engine, environment_id)
    time.sleep(1.5)
    with override_settings(SPECULATIVE_IDLE_SECONDS=1):
        assert reap_idle() == [sandbox.id]
    assert not containers(docker_engine, environment_id)
    sandbox.refresh_from_db()
    assert sandbox.status == Sandbox.Status.TERMINATED


def test_only_a_session_with_the_same_repository_and_folder_takes_a_returned_sandbox(docker_engine, served):
    """A session that wants the repository in another folder gets a sandbox of its own; with
    SPECULATIVE_RETURNED_MAX at 0 the unused sandbox is terminated at its session's end instead."""
    environment_id = make_environment()
    returned = ended_unused(environment_id, served.url("origin.git"))
    elsewhere = session_in(environment_id, served.url("origin.git"), mount_path="/workspace/other")
    events = turn(elsewhere, "/bash cat other/README.md")
    assert results(events) == [("hello from the repository", False)]
    [hand] = held(elsewhere)
    assert hand.id != returned.id
    returned.refresh_from_db()
    assert returned.session_id is None and returned.status == Sandbox.Status.READY

    with override_settings(SPECULATIVE_RETURNED_MAX=0):
        session_id = session_in(environment_id, served.url("origin.git"), mount_path="/workspace/third")
        turn(session_id, "just talk")
        [unused] = held(session_id)
        session_archive(session_id)
        assert unused.id in reap_idle()
    assert sandbox_events(session_id)[-1].type == "sandbox.terminated"


def test_a_session_taking_a_returned_sandbox_after_the_remote_moved_on_gets_the_new_tip(served, tmp_path):
    """The returned checkout is of the remote as it was: the next session's fetch finds a new commit, so the
    checkout is replaced by a clone of the new tip before its first call."""
    environment_id = make_environment()
    returned = ended_unused(environment_id, served.url("origin.git"))
    tip = push_commit(tmp_path / "served" / "origin.git", "NEW.md", "new\n")
    session_id = session_in(environment_id, served.url("origin.git"))
    events = turn(session_id, "/bash git -C app rev-parse HEAD; cat app/NEW.md")
    assert results(events) == [(f"{tip}\nnew", False)]
    [hand] = held(session_id)
    assert hand.id == returned.id and hand.labels["prepared"]["kept"] is False


def test_a_call_that_finds_its_sandbox_returned_runs_nothing(served, monkeypatch):
    """A call of the ended session that began as its sandbox went back (the sandbox taken for the call just
    before) is refused, and runs nothing in the sandbox the next session may get."""
    environment_id = make_environment()
    session_id = session_in(environment_id, served.url("origin.git"))
    turn(session_id, "just talk")
    found = hands._hand

    def found_then_returned(session: str, name: str | None) -> Sandbox | None:
        sandbox = found(session, name)
        assert sandbox is not None
        session_archive(session)
        sandbox_release(sandbox.id)
        return sandbox

    monkeypatch.setattr(hands, "_hand", found_then_returned)
    text, is_error = hands.execute(
        session_id,
        "bash",
        {"command": "touch /workspace/app/written"},
        emit=lambda e: None,
        cancelled=lambda: False,
    )
    assert is_error and "went back to its environment" in text
    [sandbox] = Sandbox.objects.filter(environment_id=environment_id)
    assert sandbox.session_id is None and sandbox.labels["returned"] and sandbox.labels["speculative"]
    said = DockerProvider().execute(sandbox.handle, "bash", {"command": "ls /workspace/app"})
    assert "written" not in said and "README.md" in said


def test_a_returned_sandbox_keeps_none_of_its_first_sessions_variables(served, monkeypatch):
    """The first session's shell had a variable of its own (a credential's placeholder); the next session,
    which takes the sandbox, finds it unset, and no note of a new shell: no call had run in it."""
    environment_id = make_environment()
    first = session_in(environment_id, served.url("origin.git"))
    monkeypatch.setattr(
        provisioning,
        "_session_env_sources",
        [lambda sandbox: {"FIRST_TOKEN": "wbph_first"} if sandbox.session_id == first else {}],
    )
    turn(first, "just talk")
    [sandbox] = held(first)
    assert sandbox.labels["returnable"]["variables"] is True
    session_archive(first)
    assert reap_idle() == []
    second = session_in(environment_id, served.url("origin.git"))
    events = turn(second, "/bash echo ${FIRST_TOKEN:-unset}")
    assert results(events) == [("unset", False)]
    assert [hand.id for hand in held(second)] == [sandbox.id]


def test_a_release_that_loses_the_race_to_another_leaves_the_returned_sandbox_alone(
    docker_engine, served, monkeypatch
):
    """Two releases of one ended session's sandbox (the reaper's and the session's end): the one whose return
    finds the sandbox already gone back does not terminate it; it stays ready for the next session."""
    environment_id = make_environment()
    session_id = session_in(environment_id, served.url("origin.git"))
    turn(session_id, "just talk")
    [sandbox] = held(session_id)
    session_archive(session_id)
    give_back = hands.give_back

    def the_other_release_won(sandbox: Sandbox, emit: Any) -> bool:
        assert give_back(sandbox, emit)  # the other release, between this one's read and its return
        return False

    monkeypatch.setattr(hands, "give_back", the_other_release_won)
    released = sandbox_release(sandbox.id)
    assert released.status == Sandbox.Status.READY and released.session_id is None
    assert released.labels["returned"]
    assert [c.status for c in containers(docker_engine, environment_id)] == ["running"]


def test_the_attach_list_leaves_out_returned_sandboxes_and_the_reaper_ends_idle_free_ones(docker_engine):
    """The UI's list of sandboxes to attach holds a detached sandbox and a warm-pool member, but not a returned
    one nor a pool member with a checkout (attach refuses both; a NOT over a label's key would have dropped
    every sandbox without the key); and a detached sandbox idle past its environment's TTL (an hour) is reaped
    like any other."""
    environment_id = make_environment()
    session_id = session_create(agent=make_agent(tools=TOOLSET), environment_id=environment_id).id
    assert results(turn(session_id, "/bash echo used")) == [("used", False)]
    [detached] = held(session_id)
    hands.sandbox_detach(detached.id)
    environment = Environment.objects.get(id=environment_id)
    returned = Sandbox.objects.create(
        environment=environment, provider="docker", status=Sandbox.Status.READY, labels={"returned": True}
    )
    checked_out, pooled = (
        Sandbox.objects.create(
            environment=environment, provider="docker", status=Sandbox.Status.READY, labels=labels
        )
        for labels in ({"pooled": True, "prepared": {"url": "https://git.example/r.git"}}, {"pooled": True})
    )
    with pytest.raises(Invalid, match="warm pool with a repository checked out"):
        hands.sandbox_attach(checked_out.id, session_id)
    assert [s.id for s in free_sandboxes(environment.workspace_id)] == [pooled.id, detached.id]
    assert reap_idle() == []
    Sandbox.objects.filter(id=detached.id).update(last_used_at=timezone.now() - timedelta(hours=2))
    assert reap_idle() == [detached.id]
    assert not containers(docker_engine, environment_id)
    returned.refresh_from_db()
    assert returned.status == Sandbox.Status.READY, "a returned sandbox goes by SPECULATIVE_IDLE_SECONDS"
