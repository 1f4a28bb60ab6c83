"""A warm pool sandbox with its environment's repository already checked out (sandboxes/repositories.py), in
real Docker sandboxes, from a real git server on loopback. The refill checks out from the workers' mirror
alone, asking no remote; a session keeps that checkout only when one of its resources names the same
repository, folder and checkout and the remote, asked as that session, still serves exactly it. Every other
session finds nothing of it: not one without that resource, not one the remote refuses, not one after the
remote moved on (it gets the new tip, as without a pool)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from kernel.errors import Invalid
from sandboxes.environments import normalise_config
from sandboxes.repositories import checkout_repositories, prepare_checkout, repository_archive
from tests.git_server import GitServer, git_http_server, make_repository, push_commit
from tests.sandboxes.conftest import Sandbox
from tests.sandboxes.test_repositories import SESSION, TOKEN, fake_door, resource, through

README = "hello from the repository\n"
OTHER_SESSION = "sesn_other_tenant"
LINE = "a line only the prepared checkout has"  # a copy of the repository over it would overwrite it
POOL_ONLY = "/workspace/app/.pool-only"  # a file only the prepared checkout has: only its removal removes it
# What a checkout is, apart from times: its files' names and contents, HEAD, refs, config, shallow boundary.
SHAPE = (
    "cd /workspace/app && git ls-files -s && git status --porcelain && cat .git/HEAD .git/config && "
    "git for-each-ref --format='%(refname) %(objectname)' && cat .git/shallow 2>/dev/null; stat -c %U ."
)


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "cache"
    with override_settings(REPOSITORY_CACHE_DIR=str(folder), REPOSITORY_CACHE_MAX_MB=1024):
        yield folder


@pytest.fixture
def public(tmp_path: Path, cache: Path) -> Iterator[tuple[GitServer, Path]]:
    """A public repository (main, and a branch `feature`); yields its server and its bare folder."""
    bare = tmp_path / "served" / "repo.git"
    make_repository(bare, {"README.md": README}, branches={"feature": {"feature.txt": "on the branch\n"}})
    with (
        git_http_server(tmp_path / "served") as server,
        override_settings(REPOSITORY_PLAIN_HOSTS=["127.0.0.1"], EGRESS_HARNESS_URL=""),
    ):
        yield server, bare


@pytest.fixture
def provider(docker_provider: Any) -> Any:
    return docker_provider


def pool_repository(url: str, **fields: Any) -> dict[str, Any]:
    return {"url": url, "mount_path": "/workspace/app", **fields}


def prepared_sandbox(new_sandbox: Any, repository: dict[str, Any]) -> tuple[Sandbox, dict[str, Any] | None]:
    """A new sandbox prepared as the pool's refill prepares one, and marked so that a test sees whether the
    session's checkout is the prepared one."""
    box = new_sandbox()
    prepared = prepare_checkout(box.provider, box.handle, repository)
    if prepared:
        box.bash(f"echo '{LINE}' >> /workspace/app/README.md; touch {POOL_ONLY}")
    return box, prepared


def taken(box: Sandbox, resources: list[dict[str, Any]], prepared: Any, session_id: str = SESSION) -> list:
    """The session takes the sandbox: its resources are checked out as a pooled sandbox's are."""
    events: list[dict[str, Any]] = []
    checkout_repositories(
        box.provider, box.handle, resources, events.append, session_id=session_id, prepared=prepared
    )
    return events


def main_commit(bare: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(bare), "rev-parse", "main"], check=True, capture_output=True, text=True
    ).stdout.strip()


def marked(box: Sandbox) -> bool:
    """Whether the sandbox still holds the prepared checkout, as prepared."""
    return LINE in box.bash("cat /workspace/app/README.md 2>/dev/null || true")


def has(box: Sandbox, path: str) -> bool:
    return box.bash(f"test -e {path} && echo yes || echo no").strip() == "yes"


def test_the_refill_prepares_nothing_before_a_session_fetched_the_repository_and_asks_no_remote(
    public, new_sandbox
):
    server, _ = public
    box, prepared = prepared_sandbox(new_sandbox, pool_repository(server.url("repo.git")))
    assert prepared is None and not has(box, "/workspace/app")
    assert server.requests == [], "the refill asked the remote"
    with override_settings(REPOSITORY_CACHE_DIR=""):
        repository_archive(resource(server.url("repo.git")), session_id=SESSION)
        assert prepare_checkout(box.provider, box.handle, pool_repository(server.url("repo.git"))) is None


@pytest.mark.parametrize(
    "checkout", [None, {"type": "branch", "name": "feature"}, "commit"], ids=["default", "branch", "commit"]
)
def test_a_session_that_proves_its_access_keeps_the_prepared_checkout_which_is_its_clone(
    public, new_sandbox, checkout
):
    server, bare = public
    url = server.url("repo.git")
    if checkout == "commit":
        checkout = {"type": "commit", "sha": main_commit(bare)[:12]}
    repository_archive(resource(url, checkout=checkout), session_id=SESSION)  # a session fetched it
    asked = len(server.requests)
    box, prepared = prepared_sandbox(new_sandbox, pool_repository(url, checkout=checkout))
    assert prepared is not None and len(server.requests) == asked, "the refill asked the remote"

    assert taken(box, [resource(url, checkout=checkout)], prepared) == []
    assert marked(box), "the prepared checkout was replaced"
    assert len(server.requests) > asked, "the session did not prove its access to the remote"
    # The checkout it kept, but for the test's mark, is the one a sandbox without a pool gets.
    box.bash(f"git -C /workspace/app checkout -- README.md; rm {POOL_ONLY}")
    fresh = new_sandbox()
    assert taken(fresh, [resource(url, checkout=checkout)], None) == []
    assert box.bash(SHAPE) == fresh.bash(SHAPE)


def test_after_the_remote_moved_on_the_session_gets_the_new_tip_and_nothing_of_the_prepared_checkout(
    public, new_sandbox
):
    server, bare = public
    url = server.url("repo.git")
    repository_archive(resource(url), session_id=SESSION)
    box, prepared = prepared_sandbox(new_sandbox, pool_repository(url))
    later = push_commit(bare, "later.txt", "pushed after the pool was filled\n")
    assert taken(box, [resource(url)], prepared) == []
    assert not marked(box) and not has(box, POOL_ONLY)
    shown = box.bash("git -C /workspace/app rev-parse HEAD; cat /workspace/app/later.txt")
    assert shown == f"{later}\npushed after the pool was filled"


def test_what_a_fresh_clone_would_differ_in_replaces_the_prepared_checkout(public, new_sandbox):
    """The remote's default branch changed (a default checkout now clones another branch), or a branch was
    added (a commit checkout copies every branch): the session gets that clone, not the pool's."""
    server, bare = public
    url = server.url("repo.git")
    commit = {"type": "commit", "sha": main_commit(bare)}
    repository_archive(resource(url), session_id=SESSION)
    default, prepared_default = prepared_sandbox(new_sandbox, pool_repository(url))
    pinned, prepared_pinned = prepared_sandbox(new_sandbox, pool_repository(url, checkout=commit))
    subprocess.run(["git", "-C", str(bare), "symbolic-ref", "HEAD", "refs/heads/feature"], check=True)
    subprocess.run(["git", "-C", str(bare), "branch", "later", "main"], check=True)

    assert taken(default, [resource(url)], prepared_default) == []
    assert not has(default, POOL_ONLY) and has(default, "/workspace/app/feature.txt")
    assert taken(pinned, [resource(url, checkout=commit)], prepared_pinned) == []
    assert not has(pinned, POOL_ONLY)
    assert "origin/later" in pinned.bash("git -C /workspace/app branch -r")


@pytest.mark.parametrize(
    "resources",
    [
        [],
        [{"mount_path": "/workspace/elsewhere"}],
        [{"checkout": {"type": "branch", "name": "feature"}}],
        [{"url": "other.git"}],
    ],
    ids=["no resource", "another folder", "another branch", "another repository"],
)
def test_a_session_without_that_very_repository_finds_nothing_of_the_prepared_checkout(
    public, new_sandbox, tmp_path, resources
):
    server, _ = public
    make_repository(tmp_path / "served" / "other.git", {"OTHER.md": "another repository\n"})
    url = server.url("repo.git")
    repository_archive(resource(url), session_id=SESSION)
    box, prepared = prepared_sandbox(new_sandbox, pool_repository(url))
    mine = [resource(server.url(r.pop("url", "repo.git")), **r) for r in resources]
    assert taken(box, mine, prepared) == []
    assert not marked(box) and not has(box, POOL_ONLY)
    if not mine:
        assert box.bash("ls -A /workspace").strip() == ""
    else:
        [folder] = box.bash("ls /workspace").split()
        assert f"/workspace/{folder}" == mine[0]["mount_path"]
        assert has(box, f"/workspace/{folder}/OTHER.md") == mine[0]["url"].endswith("other.git")


def test_a_session_the_remote_refuses_gets_nothing_of_a_checkout_prepared_for_another(
    tmp_path, cache, new_sandbox
):
    """Session A fetched the private repository with its token, so the pool prepared it; session B, whose
    door has a wrong token, is refused as it would be without a pool, and the checkout is gone."""
    make_repository(tmp_path / "private" / "repo.git", {"README.md": README})
    with (
        git_http_server(tmp_path / "private", token=TOKEN) as server,
        override_settings(REPOSITORY_PLAIN_HOSTS=["127.0.0.1"]),
    ):
        url = server.url("repo.git")
        with fake_door(TOKEN) as door, through(door):
            repository_archive(resource(url), session_id=SESSION)
        box, prepared = prepared_sandbox(new_sandbox, pool_repository(url))
        assert prepared is not None and has(box, "/workspace/app/README.md")
        with fake_door("ghs_not_the_token", session=OTHER_SESSION) as door, through(door):
            [error] = taken(box, [resource(url)], prepared, session_id=OTHER_SESSION)
    assert error["error"]["type"] == "repository_authentication_error", error
    assert box.bash("ls -A /workspace").strip() == ""


def test_an_environment_names_its_pool_repository_by_a_resource_shape_without_a_token():
    config = normalise_config(
        {"type": "cloud", "sandbox": {"pool_repository": {"url": "https://github.com/o/r"}}}
    )
    assert config["sandbox"]["pool_repository"] == {
        "url": "https://github.com/o/r",
        "mount_path": "/workspace/r",
        "checkout": None,
    }
    assert normalise_config({"type": "cloud"})["sandbox"]["pool_repository"] is None
    for wrong, says in [
        ({"url": "file:///etc"}, "'config.sandbox.pool_repository.url' must be an https:// URL"),
        ({"url": "https://github.com/o/r", "authorization_token": "t"}, "authorization_token"),
        ({"url": "https://github.com/o/r", "mount_path": "/etc"}, "under /workspace/"),
        ("https://github.com/o/r", "'config.sandbox.pool_repository' must be"),
    ]:
        with pytest.raises(Invalid, match=says):
            normalise_config({"type": "cloud", "sandbox": {"pool_repository": wrong}})


def test_a_worker_without_the_cache_replaces_the_prepared_checkout_with_its_clone(public, new_sandbox):
    """The proof and the comparison need the mirror: a worker whose cache is off clones from the network."""
    server, _ = public
    url = server.url("repo.git")
    repository_archive(resource(url), session_id=SESSION)
    box, prepared = prepared_sandbox(new_sandbox, pool_repository(url))
    with override_settings(REPOSITORY_CACHE_DIR=""):
        assert taken(box, [resource(url)], prepared) == []
    assert not marked(box) and not has(box, POOL_ONLY) and has(box, "/workspace/app/README.md")
