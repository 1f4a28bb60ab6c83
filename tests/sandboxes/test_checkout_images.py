"""Checkout images (sandboxes/repositories.py's ClonesAhead, the docker provider's `make_checkout_image`) on a
real Docker engine, from a real git server on loopback. A state of the remote cloned a second time is made into
an image of the sandbox image with that checkout in its workspace; a later session whose own fetch names that
very clone starts its sandbox from it, and finds the checkout a copy would have given it. A session the remote
refuses, or one after the remote moved on, starts from the sandbox image as before."""

from __future__ import annotations

import contextlib
import io
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker.errors
import pytest
from django.test import override_settings

from sandboxes.providers.docker import CHECKOUT_FAMILY_LABEL, CHECKOUT_IMAGES_KEPT, CHECKOUT_LABEL, _digest
from sandboxes.repositories import ClonesAhead, checkout_images_made, checkout_repositories
from tests.git_server import GitServer, git_http_server, make_repository, push_commit
from tests.sandboxes.conftest import IMAGE, Sandbox, sandbox_resources
from tests.sandboxes.test_pool_repository import README, SHAPE
from tests.sandboxes.test_repositories import SESSION, TOKEN, fake_door, resource, through

OTHER_SESSION = "sesn_other_tenant"
MADE_S = 120  # how long a test waits for the background make of an image


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "cache"
    with override_settings(REPOSITORY_CACHE_DIR=str(folder), REPOSITORY_CACHE_MAX_MB=1024):
        yield folder


@pytest.fixture
def provider(docker_provider: Any) -> Iterator[Any]:
    """The docker provider; the checkout images the test made are removed after it."""
    since = time.time() - 1
    yield docker_provider
    assert checkout_images_made(MADE_S)
    for image in docker_provider.api.images(filters={"label": CHECKOUT_LABEL}):
        if image["Created"] >= since:
            with contextlib.suppress(docker.errors.NotFound):
                docker_provider.api.remove_image(image["Id"], force=True)


@pytest.fixture
def public(tmp_path: Path, cache: Path) -> Iterator[tuple[GitServer, Path]]:
    bare = tmp_path / "served" / "repo.git"
    make_repository(bare, {"README.md": README})
    with (
        git_http_server(tmp_path / "served") as server,
        override_settings(REPOSITORY_PLAIN_HOSTS=["127.0.0.1"], EGRESS_HARNESS_URL=""),
    ):
        yield server, bare


@dataclass
class Started:
    box: Sandbox
    ahead: ClonesAhead
    image: str  # what the sandbox started from
    events: list[dict[str, Any]]
    copied: list[bytes]  # the archives copied into it


class Copies:
    """The provider, with what is copied into its sandboxes kept."""

    def __init__(self, provider: Any) -> None:
        self.provider, self.archives = provider, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.provider, name)

    def copy_in(self, handle: str, archive: bytes) -> None:
        self.archives.append(archive)
        self.provider.copy_in(handle, archive)


@pytest.fixture
def start(provider: Any) -> Iterator[Any]:
    """Start a sandbox for a session with `resources` as sandbox_provision does: its clones begin, it starts
    from the image ClonesAhead names, and its repositories are put in. Each is removed after the test."""
    handles: list[str] = []

    def started(resources: list[dict[str, Any]], session_id: str = SESSION) -> Started:
        ahead = ClonesAhead(resources, session_id=session_id)
        image = ahead.sandbox_image(provider, IMAGE)
        handle = provider.provision(sandbox_resources(image=image))
        handles.append(handle)
        events: list[dict[str, Any]] = []
        copies = Copies(provider)
        checkout_repositories(copies, handle, resources, events.append, session_id=session_id, ahead=ahead)
        return Started(Sandbox(provider, handle), ahead, image, events, copies.archives)

    yield started
    for handle in handles:
        provider.terminate(handle)


def from_image(provider: Any, started: Started) -> str:
    """The image id the sandbox's container runs from."""
    return str(provider.api.inspect_container(started.box.handle)["Image"])


def test_after_a_states_second_clone_the_next_sandbox_starts_with_that_checkout_in_its_image(
    public, provider, start
):
    """The first session clones, the second reads the kept clone (and has an image made of it), the third
    starts from that image: nothing is copied into it, and its checkout is the very one the second got,
    owned by the sandbox user and writable."""
    server, _ = public
    resources = [resource(server.url("repo.git"))]
    first = start(resources)
    assert first.image == IMAGE and first.ahead.in_image is None
    second = start(resources)
    assert second.image == IMAGE and second.ahead.in_image is None
    assert checkout_images_made(MADE_S)
    third = start(resources)
    assert third.image != IMAGE and third.ahead.in_image == 0, "the third sandbox did not start from an image"
    assert from_image(provider, third) == third.image
    assert third.events == [] and third.copied == [] and len(second.copied) == 1
    assert third.box.bash(SHAPE) == second.box.bash(SHAPE)
    assert third.box.bash("cat /workspace/app/README.md") == README.strip()
    third.box.bash("echo more >> /workspace/app/README.md && git -C /workspace/app status --porcelain")
    assert "M README.md" in third.box.bash("git -C /workspace/app status --porcelain")
    assert second.box.bash("cat /workspace/app/README.md") == README.strip()  # an image, not a shared folder


def test_after_the_remote_moved_on_a_sandbox_starts_from_its_own_image_and_gets_the_new_tip(
    public, provider, start
):
    server, bare = public
    resources = [resource(server.url("repo.git"))]
    start(resources)
    start(resources)
    assert checkout_images_made(MADE_S)
    tip = push_commit(bare, "NEW.md", "only after the push\n")
    moved = start(resources)
    assert moved.image == IMAGE and moved.ahead.in_image is None
    assert moved.box.bash("git -C /workspace/app rev-parse HEAD").strip() == tip
    assert moved.box.bash("cat /workspace/app/NEW.md") == "only after the push"


def test_a_session_the_remote_refuses_never_starts_from_the_checkout_image(tmp_path, cache, provider, start):
    """Sessions with the token had the private repository made into an image; a session whose door has a
    wrong token is refused as without the cache, and its sandbox starts from the sandbox image, empty."""
    make_repository(tmp_path / "private" / "repo.git", {"README.md": README})
    with (
        git_http_server(tmp_path / "private", token=TOKEN) as server,
        override_settings(REPOSITORY_PLAIN_HOSTS=["127.0.0.1"]),
    ):
        resources = [resource(server.url("repo.git"))]
        with fake_door(TOKEN) as door, through(door):
            start(resources)
            start(resources)
            assert checkout_images_made(MADE_S)
            assert start(resources).ahead.in_image == 0  # the image is there, for a session that proves it
        with fake_door("ghs_not_the_token", session=OTHER_SESSION) as door, through(door):
            refused = start(resources, session_id=OTHER_SESSION)
    assert refused.image == IMAGE and refused.ahead.in_image is None
    assert from_image(provider, refused) == provider.toolbox_image(
        IMAGE
    )  # the sandbox image, with the toolbox
    [error] = refused.events
    assert error["error"]["type"] == "repository_authentication_error", error
    assert refused.box.bash("ls -A /workspace").strip() == ""


def test_a_family_keeps_the_images_made_last_but_not_one_a_sandbox_runs_from(provider, new_sandbox):
    """Past CHECKOUT_IMAGES_KEPT images of one repository, the oldest go, except one a sandbox still runs from;
    an image is made from the sandbox image as it is now, so another base finds none of them."""
    family = f"test-family-{time.time_ns()}"
    names = [f"{family}-state-{i}" for i in range(CHECKOUT_IMAGES_KEPT + 2)]
    archive = _tar({"app/STATE": b"0\n"})
    first = provider.make_checkout_image(IMAGE, names[0], family, archive)
    running = new_sandbox(image=first)
    for name in names[1:]:
        provider.make_checkout_image(IMAGE, name, family, archive)
    kept = {name for name in names if provider.checkout_image(IMAGE, name)}
    # The oldest is kept while a sandbox runs from it; the second oldest went.
    assert kept == {names[0], *names[-CHECKOUT_IMAGES_KEPT:]}
    assert running.bash("cat /workspace/app/STATE") == "0"
    provider.terminate(running.handle)
    provider.make_checkout_image(IMAGE, f"{family}-state-last", family, archive)
    family_images = provider.api.images(filters={"label": f"{CHECKOUT_FAMILY_LABEL}={_digest(family)}"})
    assert len(family_images) == CHECKOUT_IMAGES_KEPT
    assert provider.checkout_image(IMAGE, names[0]) is None
    other_base = provider.snapshot(new_sandbox().handle, tag=f"workbench-test-base:{time.time_ns()}")
    try:
        assert provider.checkout_image(other_base, names[-1]) is None
    finally:
        provider.api.remove_image(other_base, force=True)


def test_of_one_checkout_made_twice_at_once_the_newer_image_alone_is_kept(provider, monkeypatch):
    """Two workers that make the same checkout image at once both commit one; the prune that follows the
    second leaves one, and it counts once toward the family's CHECKOUT_IMAGES_KEPT."""
    family = f"test-family-{time.time_ns()}"
    archive = _tar({"app/STATE": b"0\n"})
    provider.make_checkout_image(IMAGE, f"{family}-state", family, archive)
    monkeypatch.setattr(provider, "checkout_image", lambda base, name: None)  # the other had not seen it
    second = provider.make_checkout_image(IMAGE, f"{family}-state", family, archive)
    family_images = provider.api.images(filters={"label": f"{CHECKOUT_FAMILY_LABEL}={_digest(family)}"})
    assert [image["Id"] for image in family_images] == [second]


def test_past_the_cap_a_deployments_images_made_first_go_whatever_their_family(provider):
    """Each repository keeps its own newest, but repositories no session clones any more would keep theirs
    for ever: of the images of one deployment (the scope's label), only the `most` made last stay; another
    deployment's, on the same engine, are not this one's to remove."""
    run = time.time_ns()
    ours, theirs = {"workbench.deployment": f"test-{run}"}, {"workbench.deployment": f"test-other-{run}"}
    archive = _tar({"app/STATE": b"0\n"})
    other = provider.make_checkout_image(
        IMAGE, f"{run}-theirs", f"{run}-family", archive, scope=theirs, most=1
    )
    made = [
        provider.make_checkout_image(IMAGE, f"{run}-{i}", f"{run}-family-{i}", archive, scope=ours, most=2)
        for i in range(4)
    ]
    left = provider.api.images(filters={"label": f"workbench.deployment={ours['workbench.deployment']}"})
    assert {image["Id"] for image in left} == set(made[-2:])
    assert provider.api.inspect_image(other)["Id"] == other


def _tar(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.uid, info.gid, info.mode = len(data), 1000, 1000, 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
