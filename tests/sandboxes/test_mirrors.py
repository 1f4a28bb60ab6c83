"""The workers' repository cache (sandboxes/mirrors.py): a clone from a repository's mirror is the clone from
the network, file for file, and stands alone; the mirror is brought up to date from the remote at every
clone; the remote still decides, as each session, who gets the repository (a mirror another session filled
gives nothing to a session the remote refuses, nor when the remote is gone); two clones at once share a
mirror unharmed; the least recently used mirrors go past the size cap."""

from __future__ import annotations

import io
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from sandboxes import mirrors, repositories
from sandboxes.repositories import checkout_repositories, repository_archive
from tests.git_server import GitServer, git_http_server, make_repository, push_commit
from tests.sandboxes.test_repositories import (
    SESSION,
    TOKEN,
    Processes,
    Recorder,
    clone_errors,
    fake_door,
    identity,
    members,
    resource,
    through,
)

README = b"hello from the repository\n"
OTHER_SESSION = "sesn_other_tenant"


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[Path]:
    """A repository cache of the test's own."""
    folder = tmp_path / "cache"
    with override_settings(REPOSITORY_CACHE_DIR=str(folder), REPOSITORY_CACHE_MAX_MB=1024):
        yield folder


def _serve(root: Path, *, token: str | None = None, delay_s: float = 0.0) -> Any:
    return git_http_server(root, token=token, delay_s=delay_s)


@pytest.fixture
def public(tmp_path: Path, cache: Path) -> Iterator[tuple[GitServer, str]]:
    head = make_repository(
        tmp_path / "public" / "repo.git",
        {"README.md": README.decode()},
        branches={"feature": {"feature.txt": "on the branch\n"}},
    )
    with _serve(tmp_path / "public") as server, override_settings(REPOSITORY_PLAIN_HOSTS=["127.0.0.1"]):
        yield server, head


@pytest.fixture
def private(tmp_path: Path, cache: Path) -> Iterator[GitServer]:
    make_repository(tmp_path / "private" / "repo.git", {"README.md": README.decode()})
    with (
        _serve(tmp_path / "private", token=TOKEN) as server,
        override_settings(REPOSITORY_PLAIN_HOSTS=["127.0.0.1"], EGRESS_HARNESS_URL=""),
    ):
        yield server


def _git(folder: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(folder), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def _extracted(archive: bytes, folder: Path) -> Path:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder / "app"


def _shape(repo: Path) -> dict[str, Any]:
    """What a clone is, apart from times and pack names: its files, config, HEAD, refs, shallow boundary and
    the objects it holds."""
    return {
        "files": sorted(str(p.relative_to(repo)) for p in repo.rglob("*") if ".git" not in p.parts),
        "config": (repo / ".git" / "config").read_text(),
        "head": (repo / ".git" / "HEAD").read_text(),
        "refs": _git(repo, "for-each-ref", "--format=%(refname) %(objectname) %(symref)"),
        "shallow": (repo / ".git" / "shallow").read_text() if (repo / ".git" / "shallow").exists() else None,
        "objects": sorted(_git(repo, "cat-file", "--batch-all-objects", "--batch-check").splitlines()),
        "reflog": [
            line.split("\t", 1)[1] for line in (repo / ".git" / "logs" / "HEAD").read_text().splitlines()
        ],
    }


@pytest.mark.parametrize(
    "checkout",
    [None, {"type": "branch", "name": "feature"}, "commit"],
    ids=["default branch", "branch", "commit"],
)
def test_a_clone_from_the_cache_is_the_clone_from_the_network_and_stands_alone(
    public, cache, tmp_path, checkout
):
    """The same files, config, refs, depth and objects as a clone without the cache; nothing in it points at
    the mirror (no alternates, no path of the cache), and it checks out whole once the cache is gone."""
    server, head = public
    if checkout == "commit":
        checkout = {"type": "commit", "sha": head[:12]}
    repository = resource(server.url("repo.git"), checkout=checkout)
    with override_settings(REPOSITORY_CACHE_DIR=""):
        direct = repository_archive(repository, session_id=SESSION)
    assert not cache.exists()
    cached = repository_archive(repository, session_id=SESSION)
    assert mirrors.mirror_path(server.url("repo.git")).is_dir(), "the clone did not go through the cache"
    assert not any(name.endswith("objects/info/alternates") for name in members(cached))
    assert str(cache).encode() not in b"".join(members(cached).values())
    assert _shape(_extracted(cached, tmp_path / "cached")) == _shape(_extracted(direct, tmp_path / "direct"))
    subprocess.run(["rm", "-rf", str(cache)], check=True)
    repo = tmp_path / "cached" / "app"
    subprocess.run(
        ["git", "-C", str(repo), "fsck", "--full", "--no-dangling"], check=True, capture_output=True
    )
    assert _git(repo, "status", "--porcelain") == ""


def test_each_clone_brings_the_mirror_up_to_date_from_the_remote(public, tmp_path):
    server, _ = public
    url = server.url("repo.git")
    first = members(repository_archive(resource(url), session_id=SESSION))
    assert "app/later.txt" not in first
    later = push_commit(tmp_path / "public" / "repo.git", "later.txt", "pushed after the first clone\n")
    second = members(repository_archive(resource(url), session_id=SESSION))
    assert second["app/later.txt"] == b"pushed after the first clone\n"
    assert _git(mirrors.mirror_path(url), "rev-parse", "refs/heads/main") == later
    # A branch deleted on the remote leaves the mirror at its next clone.
    _git(tmp_path / "public" / "repo.git", "branch", "-D", "feature")
    repository_archive(resource(url), session_id=SESSION)
    assert _git(mirrors.mirror_path(url), "branch", "--list") == "* main"


def test_a_state_cloned_once_is_read_from_the_cache_and_a_new_one_is_cloned(public, tmp_path, monkeypatch):
    """The first clone of a URL, folder and checkout is kept beside the mirror; the next whose fetch shows the
    same state is that file, byte for byte, and no clone is made; another folder, another checkout, or the
    remote moving on is cloned anew; only the CHECKOUTS_KEPT used last stay."""
    server, head = public
    url = server.url("repo.git")
    kept = mirrors.mirror_path(url) / "workbench-checkouts"
    first = repository_archive(resource(url), session_id=SESSION)
    assert [path.read_bytes() for path in kept.glob("*.tar")] == [first]

    made: list[Any] = []
    clone_local = repositories._clone_local
    monkeypatch.setattr(repositories, "_clone_local", lambda *args: made.append(args) or clone_local(*args))
    assert repository_archive(resource(url), session_id=OTHER_SESSION) == first
    assert made == [], "a state already cloned was cloned again"

    elsewhere = members(repository_archive(resource(url, mount_path="/workspace/else"), session_id=SESSION))
    feature = {"type": "branch", "name": "feature"}
    branch = members(repository_archive(resource(url, checkout=feature), session_id=SESSION))
    assert elsewhere["else/README.md"] == README and branch["app/feature.txt"] == b"on the branch\n"
    assert len(made) == 2

    later = push_commit(tmp_path / "public" / "repo.git", "later.txt", "pushed after the first clone\n")
    moved = repository_archive(resource(url), session_id=SESSION)
    assert members(moved)["app/later.txt"] == b"pushed after the first clone\n"
    assert len(made) == 3
    assert later != head and len(list(kept.glob("*.tar"))) == 4

    monkeypatch.setattr(mirrors, "CHECKOUTS_KEPT", 2)
    commit = {"type": "commit", "sha": head}
    repository_archive(resource(url, checkout=commit), session_id=SESSION)
    assert len(list(kept.glob("*.tar"))) == 2
    assert repository_archive(resource(url), session_id=SESSION) == moved, "the one used last but one went"
    assert len(made) == 4


def test_a_mirror_filled_for_one_session_gives_nothing_to_a_session_the_remote_refuses(private, cache):
    """Session A clones the private repository through the door with its token: the mirror holds it, and
    neither the mirror's config nor any process holds the token. Session B, whose door has no token for it
    (or which has no door at all), is refused as without a cache, and gets no file; nor does A once the
    remote is gone: the cache never stands in for the remote's answer."""
    url = private.url("repo.git")
    with fake_door(TOKEN) as door, through(door), Processes() as seen:
        first = repository_archive(resource(url), session_id=SESSION)
    assert members(first)["app/README.md"] == README
    mirror = mirrors.mirror_path(url)
    assert _git(mirror, "rev-parse", "refs/heads/main")
    config = (mirror / "config").read_text()
    assert TOKEN not in config and "proxy" not in config and url not in config
    assert not seen.holding(TOKEN)
    assert list((mirror / "workbench-checkouts").glob("*.tar")), "A's clone was not kept for the next"

    asked = len(private.requests)
    wrong = "ghs_not_the_token"
    with fake_door(wrong, session=OTHER_SESSION) as door, through(door):
        provider = Recorder()
        events: list[dict[str, Any]] = []
        checkout_repositories(provider, "h", [resource(url)], events.append, session_id=OTHER_SESSION)
    [event] = events
    assert event["error"]["type"] == "repository_authentication_error", event
    assert f"/v1/sessions/{OTHER_SESSION}/resources/sres_test" in event["error"]["message"]
    assert provider.archives == []
    assert private.requests[asked:] and not any(ok for _, _, ok in private.requests[asked:]), (
        "session B's clone did not ask the remote"
    )
    assert set(door.identities) == {identity(OTHER_SESSION)}, "B's clone went through the door as B"

    provider = Recorder()
    [event] = clone_errors([resource(url)], provider)
    assert event["error"]["type"] == "repository_authentication_error"
    assert "EGRESS_HARNESS_URL" in event["error"]["message"] and provider.archives == []


def test_a_remote_that_is_gone_is_an_error_even_with_a_full_mirror(tmp_path, cache):
    """A repository deleted from its server is not found, and a server that is down is a clone error, though
    the mirror still holds the repository."""
    make_repository(tmp_path / "served" / "repo.git", {"README.md": README.decode()})
    provider = Recorder()
    with override_settings(REPOSITORY_PLAIN_HOSTS=["127.0.0.1"]):
        with _serve(tmp_path / "served") as server:
            url = server.url("repo.git")
            repository_archive(resource(url), session_id=SESSION)
            assert (mirrors.mirror_path(url) / "refs" / "heads" / "main").is_file()
            subprocess.run(["rm", "-rf", str(tmp_path / "served" / "repo.git")], check=True)
            [deleted] = clone_errors([resource(url)], provider)
        [down] = clone_errors([resource(url)], provider)
    assert deleted["error"]["type"] == "repository_not_found_error", deleted
    assert down["error"]["type"] == "repository_clone_error", down
    assert provider.archives == []


def test_two_clones_at_once_share_one_mirror_unharmed(tmp_path, cache):
    make_repository(tmp_path / "slow" / "repo.git", {"README.md": README.decode()})
    results: list[bytes | BaseException] = []

    def clone(url: str) -> None:
        try:
            results.append(repository_archive(resource(url), session_id=SESSION))
        except BaseException as error:  # noqa: BLE001 (the test reports it)
            results.append(error)

    with (
        _serve(tmp_path / "slow", delay_s=0.05) as server,
        override_settings(REPOSITORY_PLAIN_HOSTS=["127.0.0.1"]),
    ):
        url = server.url("repo.git")
        threads = [threading.Thread(target=clone, args=(url,)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert all(isinstance(r, bytes) and members(r)["app/README.md"] == README for r in results), results
    assert len(results) == 4
    mirror = mirrors.mirror_path(url)
    subprocess.run(["git", "-C", str(mirror), "fsck", "--full"], check=True, capture_output=True)
    assert [p.name for p in cache.iterdir() if p.name.endswith(".new")] == []


def test_a_held_mirror_is_busy_for_another_and_a_busy_or_unusable_cache_is_cloned_around(public, tmp_path):
    server, _ = public
    url = server.url("repo.git")
    with (
        mirrors.mirror_held(url, wait_s=1),
        pytest.raises(mirrors.MirrorUnavailable, match="busy"),
        mirrors.mirror_held(url, wait_s=0.2),
    ):
        pass
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    with override_settings(REPOSITORY_CACHE_DIR=str(blocked / "cache")):
        assert members(repository_archive(resource(url), session_id=SESSION))["app/README.md"] == README


def test_past_the_cap_the_least_recently_used_mirror_that_no_one_holds_goes(tmp_path, cache):
    for name in ("one", "two", "three"):
        make_repository(tmp_path / "repos" / f"{name}.git", {"README.md": f"{name}\n"})
    with _serve(tmp_path / "repos") as server, override_settings(REPOSITORY_PLAIN_HOSTS=["127.0.0.1"]):
        one, two, three = (server.url(f"{n}.git") for n in ("one", "two", "three"))
        for url in (one, two):
            repository_archive(resource(url), session_id=SESSION)
        assert mirrors.mirror_path(one).is_dir() and mirrors.mirror_path(two).is_dir()
        with override_settings(REPOSITORY_CACHE_MAX_MB=0):
            with mirrors.mirror_held(one, wait_s=1):
                repository_archive(resource(three), session_id=SESSION)
                # `one` is held and `three` just used: they stay; `two`, the least recently used, goes.
                assert mirrors.mirror_path(one).is_dir() and mirrors.mirror_path(three).is_dir()
                assert not mirrors.mirror_path(two).exists()
                assert not (cache / f"{mirrors.mirror_key(two)}.lock").exists()
            # `one`, just let go of, is the last used now.
            assert mirrors.mirror_path(one).is_dir() and not mirrors.mirror_path(three).exists()
            assert members(repository_archive(resource(two), session_id=SESSION))["app/README.md"] == b"two\n"
            assert not mirrors.mirror_path(one).exists() and mirrors.mirror_path(two).is_dir()


def test_the_spellings_of_one_repository_share_a_mirror():
    same = [
        "https://github.com/o/r",
        "https://GitHub.com/o/r.git",
        "https://github.com:443/o/r/",
        "HTTPS://github.com/o/r.git/",
    ]
    assert len({mirrors.mirror_key(url) for url in same}) == 1
    others = [
        "https://github.com/o/R",
        "https://github.com/o/r2",
        "http://github.com/o/r",
        "https://github.com:8443/o/r",
    ]
    assert len({mirrors.mirror_key(url) for url in [same[0], *others]}) == 1 + len(others)
