"""DockerProvider: a sandbox is a hardened container on a Docker engine, driven through the SDK.

The container's main process (under docker's init) is the toolbox's supervisor, as root with only
CAP_SETUID and CAP_SETGID: it listens on the toolbox's socket in a directory only root may write, and
forks the daemon, which drops to the sandbox user (uid 1000) and owns the shell; every process the
model starts is the sandbox user's, with no capability. Each `execute` goes through a `docker exec` of
the toolbox's relay, as root, kept open for call after call (`relays.py`), which for each call checks
that root listens on the socket, relays the request and the reply back: see
`sandboxes/toolbox/supervisor.py` for why, and `daemon.py` for the protocol. A sandbox made by a
Workbench whose toolbox had no relay is called through an exec of the one-shot client per call. A daemon
that dies (killed by the model, or by the OOM killer) is forked again at once on the same socket, and
the container's files survive it.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import docker.types
import requests.exceptions

from sandboxes.toolbox.bundle import (
    CLIENT_COMMAND,
    RELAY_COMMAND,
    SANDBOX_PARENT,
    SUPERVISOR_COMMAND,
    archive,
)
from sandboxes.toolbox.bundle import digest as toolbox_digest
from sandboxes.toolbox.disk import DISK_MB_ENV
from sandboxes.toolbox.procs import PIDS_LIMIT_ENV

from . import protocol
from .base import Cancelled, EgressRoute, Resources, SandboxError, SandboxGone, ToolFailed
from .relays import Frames, Relay, relays

MANAGED_LABEL = "workbench.managed"
CONTAINER_COMMAND = ["/bin/sh", "-c", f"cd {SANDBOX_PARENT} && exec {' '.join(SUPERVISOR_COMMAND)}"]
# The supervisor's, to drop to the sandbox user; nothing the sandbox user runs has any (no-new-privileges).
CAPABILITIES = ["SETUID", "SETGID"]
CONTAINER_USER = "0:0"
# How long a container that lost its call may take to show as stopped in the engine.
GONE_SETTLE_S = 2.0
# At the pids limit the engine cannot start the client: retry while the toolbox recovers.
EXEC_RETRY_S = 5.0
# Where a sandbox with networking finds the CA bundle that trusts the egress proxy (mounted over the image's).
CA_BUNDLE_PATH = "/etc/ssl/certs/ca-certificates.crt"
# Checkout images (`make_checkout_image`): the repository they are kept in, their labels, their helper
# containers' name, and how many of one family (a repository, folder and checkout) are kept; the caller may
# cap them all (of its scope) too.
CHECKOUT_IMAGE = "workbench-checkout"
CHECKOUT_LABEL = "workbench.checkout"
CHECKOUT_FAMILY_LABEL = "workbench.checkout.family"
CHECKOUT_BASE_LABEL = "workbench.checkout.base"
CHECKOUT_MADE_LABEL = "workbench.checkout.made"
CHECKOUT_HELPER = "workbench-checkout-helper-"
CHECKOUT_IMAGES_KEPT = 4
CHECKOUT_HELPER_STALE_S = 600
# Toolbox images (`toolbox_image`): their repository, labels, helper containers' name, and how many are kept.
TOOLBOX_IMAGE = "workbench-toolbox"
TOOLBOX_LABEL = "workbench.toolbox"  # the toolbox's digest, on every image that holds it
TOOLBOX_BASE_LABEL = "workbench.toolbox.base"  # the image a toolbox image was made from
TOOLBOX_MADE_LABEL = "workbench.toolbox.made"
TOOLBOX_HELPER = "workbench-toolbox-helper-"
TOOLBOX_IMAGES_KEPT = 8
# The networks this process has made sure of (created, internal, firewalled): checked once per process.
_prepared: set[str] = set()
_preparing = threading.Lock()
_making_toolbox_image = threading.Lock()
# Sandboxes whose toolbox has no relay (made by an earlier Workbench): called through a client per call.
_without_relay: set[str] = set()
# A relayed call with no reply yet looks whether its sandbox was paused after this long, then ever less often.
PAUSED_LOOK_S = 1.0
PAUSED_LOOK_MAX_S = 10.0
NO_SUCH_SCRIPT = 2  # python's exit code for a script it cannot open
EXIT_SETTLE_S = 1.0


class DockerProvider:
    name = "docker"
    capabilities = frozenset({"pause", "snapshot", "checkout_image"})

    def __init__(self, *, api: docker.APIClient | None = None, relay: bool = True):
        """`relay=False`: an exec of the one-shot client per call, as before relays (bench/sandboxes compares)."""
        self._api = api
        self._relay = relay

    @property
    def api(self) -> docker.APIClient:
        if self._api is None:
            try:
                self._api = docker.from_env(version="auto").api
            except docker.errors.DockerException as error:
                raise SandboxError(f"the Docker engine is not reachable: {error}") from None
        return self._api

    # -- lifecycle

    def provision(self, resources: Resources) -> str:
        """Create and start the container from the image's toolbox image; the toolbox daemon starts with it,
        and the first call waits for it (well under a second)."""
        network = "bridge" if resources.network else "none"
        binds: dict[str, dict[str, str]] | None = None
        dns: list[str] | None = None
        if resources.egress is not None:
            self.prepare_egress(resources.egress)
            if not Path(resources.egress.ca_bundle).is_file():
                raise SandboxError(
                    f"the egress proxy's CA bundle {resources.egress.ca_bundle} is missing: start the egress "
                    "proxy (python -m vault.egress) once, which makes it"
                )
            network = resources.egress.network
            binds = {resources.egress.ca_bundle: {"bind": CA_BUNDLE_PATH, "mode": "ro"}}
            # Names are the proxy's to resolve; the engine's resolver gets no server to forward to.
            dns = ["127.0.0.1"]
        with self._engine():
            image = self.toolbox_image(resources.image)
            host_config = self.api.create_host_config(
                cap_drop=["ALL"],
                cap_add=CAPABILITIES,
                security_opt=["no-new-privileges"],
                pids_limit=resources.pids,
                mem_limit=f"{resources.memory_mb}m",
                memswap_limit=f"{resources.memory_mb}m",
                nano_cpus=int(resources.cpus * 1e9),
                init=True,
                network_mode=network,
                binds=binds,
                dns=dns,
                storage_opt={"size": f"{resources.disk_mb}M"} if resources.disk_mb else None,
            )
            try:
                container = self.api.create_container(
                    image,
                    entrypoint=[],  # the image's own, if it has one, would be handed our command as arguments
                    command=CONTAINER_COMMAND,
                    user=CONTAINER_USER,
                    working_dir="/workspace",
                    hostname="sandbox",
                    environment={
                        **resources.env,
                        PIDS_LIMIT_ENV: str(resources.pids),
                        DISK_MB_ENV: str(resources.disk_mb or ""),
                    },
                    labels={**resources.labels, MANAGED_LABEL: "true"},
                    host_config=host_config,
                )
            except docker.errors.APIError as error:
                if resources.disk_mb and "storage" in str(error.explanation).lower():
                    raise SandboxError(
                        f"the Docker engine cannot enforce the sandbox's disk quota ({error.explanation}): "
                        "start dockerd on XFS mounted with pquota, or on btrfs (scripts/start-dockerd.sh does, "
                        "when it starts the engine), or set SANDBOX_DISK_QUOTA=off to run sandboxes without one"
                    ) from None
                raise
        handle: str = container["Id"]
        try:
            with self._engine(handle):
                self._start(handle)
        except BaseException:
            with contextlib.suppress(SandboxError):
                self.terminate(handle)
            raise
        return handle

    def _start(self, handle: str) -> None:
        self.api.start(handle)

    # -- toolbox images: a sandbox image with the toolbox in it
    #
    # Copying the toolbox into each new container cost the engine a run of its tar helper (a new dockerd
    # process) and the copy: 50-60 ms of the machine's CPU and 25-50 ms of the sandbox's start on a 2-core
    # machine (bench/sandboxes, side by side). Put once into an image made from the sandbox's image, it costs
    # nothing per container. An image that holds this toolbox already (its label says so: a toolbox image, a
    # checkout image made from one, a snapshot of a sandbox) is used as it is; the toolbox's folder is root's
    # in a sandbox, so no sandbox changes it.

    def toolbox_image(self, image: str) -> str:
        """The id of an image that is `image` with this toolbox in it, made once (the toolbox's and the image's
        versions name it) if the engine has none yet."""
        base = self._inspect_image(image)
        if (base["Config"].get("Labels") or {}).get(TOOLBOX_LABEL) == toolbox_digest():
            return str(base["Id"])
        key = _digest(f"{base['Id']}\n{toolbox_digest()}")
        if found := self._made_toolbox_image(key, base["Id"]):
            return found
        with _making_toolbox_image:  # this process's threads make it once; another process may make its own
            if found := self._made_toolbox_image(key, base["Id"]):
                return found
            return self._make_toolbox_image(key, base["Id"])

    def _made_toolbox_image(self, key: str, base_id: str) -> str | None:
        try:
            made = self.api.inspect_image(f"{TOOLBOX_IMAGE}:{key[:40]}")
        except docker.errors.ImageNotFound:
            return None
        return (
            str(made["Id"])
            if (made["Config"].get("Labels") or {}).get(TOOLBOX_BASE_LABEL) == base_id
            else None
        )

    def _make_toolbox_image(self, key: str, base_id: str) -> str:
        labels = {
            TOOLBOX_LABEL: toolbox_digest(),
            TOOLBOX_BASE_LABEL: base_id,
            TOOLBOX_MADE_LABEL: str(time.time_ns()),
        }
        # Never started: its command and entrypoint are no sandbox's, which sets its own.
        helper = self.api.create_container(
            base_id, entrypoint=[], command=["/bin/true"], labels=labels, name=f"{TOOLBOX_HELPER}{_tag()}"
        )
        try:
            self.api.put_archive(helper["Id"], "/", archive())
            made_id = str(self.api.commit(helper["Id"], repository=TOOLBOX_IMAGE, tag=key[:40])["Id"])
        finally:
            self.api.remove_container(helper["Id"], force=True, v=True)
        self._prune_toolbox_images()
        return made_id

    def _prune_toolbox_images(self) -> None:
        """Keep the TOOLBOX_IMAGES_KEPT toolbox images made last (a new toolbox, or a rebuilt sandbox image,
        makes new ones); one a sandbox, checkout image or snapshot still uses stays until it does not."""
        made = self.api.images(filters={"reference": TOOLBOX_IMAGE})
        made.sort(key=lambda image: int((image.get("Labels") or {}).get(TOOLBOX_MADE_LABEL, 0)), reverse=True)
        # Two processes that made one at once made two: the first lost its tag, and goes with the old ones.
        untagged = [
            image
            for image in self.api.images(filters={"label": TOOLBOX_BASE_LABEL, "dangling": True})
            if image.get("ParentId") == (image.get("Labels") or {}).get(TOOLBOX_BASE_LABEL)
        ]
        for image in made[TOOLBOX_IMAGES_KEPT:] + untagged:
            with contextlib.suppress(docker.errors.APIError):  # 409: in use, or the parent of another image
                self.api.remove_image(image["Id"])
        self._remove_stale_helpers(TOOLBOX_HELPER)

    # -- checkout images: a sandbox image with a repository's checkout already in it (sandboxes/repositories.py)
    #
    # A kept clone (sandboxes/mirrors.py) copied into each new container costs the copy (~0.4 s for 3,000
    # files, twice that under load); put once into an image made from the sandbox's image, it costs nothing
    # per container, which starts as fast from it. The caller says what the image holds (`name`: a kept clone's
    # name) and of what repository (`family`); what may use it, when, is the caller's rule.

    def has_checkout_images(self, family: str) -> bool:
        """Whether any checkout image of `family` is on the engine (so a lookup by name may be worth waiting
        for)."""
        with self._engine():
            return bool(self.api.images(filters={"label": f"{CHECKOUT_FAMILY_LABEL}={_digest(family)}"}))

    def checkout_image(self, base: str, name: str) -> str | None:
        """The id of the checkout image made as `name` from the image `base` (as it is now), or None."""
        with self._engine():
            key = _digest(f"{name}\n{self.toolbox_image(base)}")
            found = self.api.images(filters={"label": f"{CHECKOUT_LABEL}={key}"})
        return str(found[0]["Id"]) if found else None

    def make_checkout_image(
        self,
        base: str,
        name: str,
        family: str,
        archive: bytes,
        *,
        scope: dict[str, str] | None = None,
        most: int | None = None,
    ) -> str:
        """Make the checkout image `name` of `family`: the image `base` (its toolbox image) with `archive` (a tar
        relative to the workspace, owned by the sandbox user) unpacked into the workspace; keep the
        CHECKOUT_IMAGES_KEPT of the family made last and, of those labelled with `scope` (as this one is), the `most` made last, whatever
        their family: repositories no session clones any more do not keep theirs for ever. Returns its id (an
        existing one's if it was made already)."""
        if made := self.checkout_image(base, name):
            return made
        with self._engine():
            base_id = self.toolbox_image(base)
            key = _digest(f"{name}\n{base_id}")
            labels = {
                **(scope or {}),
                CHECKOUT_LABEL: key,
                CHECKOUT_FAMILY_LABEL: _digest(family),
                CHECKOUT_BASE_LABEL: base_id,
                CHECKOUT_MADE_LABEL: str(time.time_ns()),  # "Created" counts in whole seconds
            }
            # Never started: its configuration is the base image's, and only its workspace differs.
            helper = self.api.create_container(
                base_id, labels=labels, name=f"{CHECKOUT_HELPER}{key[:16]}-{_tag()}"
            )
            try:
                self.api.put_archive(helper["Id"], "/workspace", archive)
                image = self.api.commit(helper["Id"], repository=CHECKOUT_IMAGE, tag=key[:40])
            finally:
                self.api.remove_container(helper["Id"], force=True, v=True)
            self._prune_checkout_images(
                [f"{CHECKOUT_FAMILY_LABEL}={labels[CHECKOUT_FAMILY_LABEL]}"], CHECKOUT_IMAGES_KEPT
            )
            if most is not None:
                self._prune_checkout_images(
                    [CHECKOUT_LABEL, *(f"{k}={v}" for k, v in (scope or {}).items())], most
                )
        return str(image["Id"])

    def _prune_checkout_images(self, filters: list[str], keep: int) -> None:
        """Of the checkout images with all the `filters` labels, remove all but the `keep` made last."""
        made = self.api.images(filters={"label": filters})
        made.sort(
            key=lambda image: int((image.get("Labels") or {}).get(CHECKOUT_MADE_LABEL, 0)), reverse=True
        )
        kept: set[str] = set()
        for image in made:
            # The newest of each checkout is kept (two workers making one at once made two: the other goes).
            key = (image.get("Labels") or {}).get(CHECKOUT_LABEL, image["Id"])
            if key not in kept and len(kept) < keep:
                kept.add(key)
                continue
            try:
                self.api.remove_image(image["Id"])
            except docker.errors.APIError as error:
                if error.status_code not in (404, 409):  # 409: a sandbox runs from it still; a later prune
                    raise
        self._remove_stale_helpers(CHECKOUT_HELPER)

    def _remove_stale_helpers(self, prefix: str) -> None:
        """A helper container (named `prefix`...) outlives its image's make only if its process died midway: it
        never ran, and holds disk alone."""
        for helper in self.api.containers(all=True, filters={"name": prefix}):
            if helper["Created"] < time.time() - CHECKOUT_HELPER_STALE_S:
                with contextlib.suppress(docker.errors.APIError):
                    self.api.remove_container(helper["Id"], force=True, v=True)

    def _inspect_image(self, image: str) -> dict[str, Any]:
        try:
            return dict(self.api.inspect_image(image))
        except docker.errors.ImageNotFound:
            raise SandboxError(
                f"the image {image} is not on the Docker engine: build it with `make image` (scripts/build-image.sh)"
            ) from None

    def prepare_egress(self, route: EgressRoute) -> None:
        """Make sure the sandboxes' network exists, is internal (no route out), and that the host answers
        on its bridge only at the proxy's port."""
        with _preparing:
            if route.network in _prepared:
                return
            with self._engine():
                _internal_network(self.api, route)
            if route.firewall:
                _firewall(route.bridge, route.proxy_port)
            _prepared.add(route.network)

    def copy_in(self, handle: str, archive: bytes) -> None:
        """Unpack a tar (paths relative to /workspace, owned by the sandbox user) into the workspace."""
        with self._engine(handle):
            self.api.put_archive(handle, "/workspace", archive)

    def is_alive(self, handle: str) -> bool:
        with self._engine():
            try:
                return bool(self.api.inspect_container(handle)["State"]["Running"])
            except docker.errors.NotFound:
                return False

    def terminate(self, handle: str) -> None:
        """Remove the container and its anonymous volumes; nothing happens if it is already gone."""
        relays().drop(handle)
        with self._engine():
            try:
                self.api.remove_container(handle, force=True, v=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as error:
                if error.status_code != 409:  # 409: its removal is already in progress
                    raise

    def list_handles(self) -> dict[str, dict[str, str]]:
        with self._engine():
            containers = self.api.containers(all=True, filters={"label": f"{MANAGED_LABEL}=true"})
        return {container["Id"]: container.get("Labels") or {} for container in containers}

    def pause(self, handle: str) -> None:
        with self._engine(handle):
            self.api.pause(handle)

    def unpause(self, handle: str) -> None:
        with self._engine(handle):
            self.api.unpause(handle)

    def snapshot(self, handle: str, *, tag: str | None = None) -> str:
        """Commit the container's file system to an image and return its reference."""
        reference = tag or f"workbench-snapshot:{handle[:12]}-{int(time.time())}"
        repository, _, version = reference.rpartition(":")
        if not repository or "/" in version:
            repository, version = reference, "latest"
        with self._engine(handle):
            self.api.commit(handle, repository=repository, tag=version, message="workbench sandbox snapshot")
        return f"{repository}:{version}"

    # -- calls

    def execute(
        self,
        handle: str,
        name: str,
        input: dict[str, Any],
        *,
        timeout_s: float | None = None,
        cancelled: Cancelled | None = None,
    ) -> str:
        return self._call(handle, protocol.build_request(name, input, timeout_s=timeout_s), cancelled)

    def reset(self, handle: str, *, env: dict[str, str] | None = None, unused: bool = False) -> None:
        """Verify the toolbox of a hand that changed sessions and give it a new shell (see daemon.py), with
        the new session's variables (`env`) in place of the previous one's."""
        self._call(handle, protocol.reset_request(env, unused=unused), None)

    def _call(self, handle: str, request: protocol.Request, cancelled: Cancelled | None) -> str:
        exec_id, reply, stopped, stderr = self._exchange(handle, request, cancelled)
        if reply is not None:
            try:
                return protocol.parse_reply(reply)
            except SandboxGone:
                raise
            except SandboxError as error:
                raise self._made_before_the_supervisor(handle) or error from None
        if stopped:
            raise protocol.interrupted(stopped, request)
        raise self._lost_call(handle, exec_id, stderr)

    def _exchange(
        self, handle: str, request: protocol.Request, cancelled: Cancelled | None
    ) -> tuple[str, bytes | None, str | None, bytes]:
        """One call: (exec id, the reply if complete, why stopped, stderr). Through a relay of the sandbox's,
        or a client of its own where its toolbox has no relay, or where the relay ended before it could be
        told to run the call (which therefore never ran)."""
        if self._relay and handle not in _without_relay:
            relay = relays().take(handle) or Relay(*self._start_client(handle, RELAY_COMMAND))
            paused = _PausedLook(self, handle)
            finished, stopped = protocol.exchange(
                relay.sock,
                request,
                # Until GO the call waits on the relay, which a pause freezes; after, on the call itself.
                cancelled=lambda: (not relay.went and paused()) or (cancelled is not None and cancelled()),
                cancel=lambda: self._cancel(handle, request),
                relayed=relay,
            )
            if finished:
                reply = relay.take_reply()
                relays().give_back(handle, relay)
                return relay.exec_id, reply, stopped, b""
            if relay.went:  # it may have run: lost or stopped, as a client's call
                return relay.exec_id, None, stopped, bytes(relay.frames.stderr)
            if paused.seen:
                raise SandboxError("the sandbox is paused: unpause it before calling it")
            if stopped:
                return relay.exec_id, None, stopped, b""
            if self._exit_code(relay.exec_id) == NO_SUCH_SCRIPT:
                _without_relay.add(handle)  # an earlier Workbench's toolbox, with no relay.py
        exec_id, sock, _ = self._start_client(handle)
        frames = Frames()
        finished, stopped = protocol.exchange(
            sock, request, cancelled=cancelled, cancel=lambda: self._cancel(handle, request), feed=frames.feed
        )
        whole = bytes(frames.stdout) if finished and frames.stdout else None
        return exec_id, whole, stopped, bytes(frames.stderr)

    def _exit_code(self, exec_id: str) -> int | None:
        """An exec's exit code, once the engine has it (within EXIT_SETTLE_S of its stream's end); None if
        it still runs, or the engine cannot say."""
        settle = time.monotonic() + EXIT_SETTLE_S
        while True:
            try:
                with self._engine():
                    state = self.api.exec_inspect(exec_id)
            except SandboxError:
                return None
            code = state.get("ExitCode")
            if not state.get("Running") and isinstance(code, int):
                return code
            if time.monotonic() > settle:
                return None
            time.sleep(0.05)

    def _start_client(
        self, handle: str, command: list[str] = CLIENT_COMMAND
    ) -> tuple[str, socket.socket, Any]:
        """Start one toolbox client (or relay) with its stdin attached: (exec id, its socket, the SDK's object
        holding the socket). Retried while the sandbox is at its pids limit (the engine then cannot fork the
        client), which the toolbox clears within seconds."""
        give_up = time.monotonic() + EXEC_RETRY_S
        while True:
            try:
                with self._engine(handle):
                    # As root: no process of the sandbox user's can trace the client.
                    created = self.api.exec_create(handle, command, stdin=True, user="0", workdir="/")
                    exec_id = created["Id"]
                    response_socket = self.api.exec_start(exec_id, socket=True)
                break
            except SandboxError as error:
                if isinstance(error, SandboxGone) or not _at_pids_limit(str(error)):
                    raise
                if time.monotonic() > give_up:
                    raise ToolFailed(
                        "the sandbox is at its process limit and cannot start anything; "
                        "try again, or restart the shell (bash with restart: true)"
                    ) from None
                time.sleep(0.2)
        # The SDK hands back the socket's file object; its socket allows select and half-close.
        return exec_id, getattr(response_socket, "_sock", response_socket), response_socket

    def _cancel(self, handle: str, request: protocol.Request) -> None:
        """Ask the toolbox to stop the call (it kills the command's process group)."""
        with contextlib.suppress(SandboxError, OSError, ToolFailed):
            _, sock, _ = self._start_client(handle)
            try:
                sock.sendall(request.cancel_payload)
                sock.shutdown(socket.SHUT_WR)
                sock.settimeout(1.0)
                while sock.recv(65536):
                    pass
            finally:
                protocol.close(sock)

    def _lost_call(self, handle: str, exec_id: str, stderr: bytes) -> SandboxError:
        """Why a call ended without a reply: the container died (SandboxGone), or the client failed."""
        settle = time.monotonic() + GONE_SETTLE_S
        while True:
            gone = self._gone_reason(handle)
            if gone:
                return SandboxGone(gone)
            if time.monotonic() > settle:
                break
            time.sleep(0.05)
        code = self._exit_code(exec_id)
        detail = stderr.decode("utf-8", "replace").strip()[-1000:] or "no message"
        if code is None:
            return SandboxError(
                f"the sandbox's toolbox relay stopped answering during the call (its stream broke): {detail}"
            )
        return SandboxError(f"the toolbox client in the sandbox failed (exit code {code}): {detail}")

    def _made_before_the_supervisor(self, handle: str) -> SandboxGone | None:
        """A container provisioned by an earlier Workbench runs as the sandbox user, and its toolbox
        cannot be reached safely: it is as good as gone, and the session's next call gets a new one."""
        with self._engine(handle):
            user = self.api.inspect_container(handle)["Config"]["User"]
        if user == CONTAINER_USER:
            return None
        return SandboxGone(
            f"the sandbox was provisioned by an earlier version of Workbench (its container runs as {user!r}), "
            "whose toolbox this one does not call"
        )

    def _gone_reason(self, handle: str) -> str | None:
        with self._engine():
            try:
                state = self.api.inspect_container(handle)["State"]
            except docker.errors.NotFound:
                return "the sandbox container no longer exists (it was removed)"
        if state.get("Running"):
            return None
        code = state.get("ExitCode")
        if state.get("OOMKilled"):
            return f"the sandbox container was killed: it ran out of memory (exit {code})"
        if code == 137:
            return "the sandbox container was killed (exit 137)"
        return f"the sandbox container stopped (exit {code})"

    @contextlib.contextmanager
    def _engine(self, handle: str | None = None) -> Iterator[None]:
        """Turn the SDK's errors into the provider's: gone, paused, refused, unreachable."""
        try:
            yield
        except docker.errors.NotFound as error:
            if handle is None:
                raise SandboxError(f"the Docker engine has no such object: {error.explanation}") from None
            raise SandboxGone(
                self._gone_reason(handle) or f"the sandbox container {handle[:12]} was not found"
            ) from None
        except docker.errors.APIError as error:
            explanation = str(error.explanation or error)
            if handle is not None and error.status_code == 409 and "not running" in explanation:
                raise SandboxGone(self._gone_reason(handle) or explanation) from None
            if error.status_code == 409 and "paused" in explanation:
                raise SandboxError("the sandbox is paused: unpause it before calling it") from None
            raise SandboxError(f"the Docker engine refused: {explanation}") from None
        except (requests.exceptions.ConnectionError, docker.errors.DockerException) as error:
            raise SandboxError(f"the Docker engine is not reachable: {error}") from None


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _tag() -> str:
    return f"{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}"


def _internal_network(api: docker.APIClient, route: EgressRoute) -> None:
    gateway = str(next(ipaddress.ip_network(route.subnet).hosts()))
    try:
        network = api.inspect_network(route.network)
    except docker.errors.NotFound:
        ipam = docker.types.IPAMConfig(
            pool_configs=[docker.types.IPAMPool(subnet=route.subnet, gateway=gateway)]
        )
        try:
            api.create_network(
                route.network,
                driver="bridge",
                internal=True,
                ipam=ipam,
                options={
                    "com.docker.network.bridge.name": route.bridge,
                    "com.docker.network.bridge.enable_ip_masquerade": "false",
                },
                labels={MANAGED_LABEL: "true"},
                check_duplicate=True,
            )
        except docker.errors.APIError as error:
            if error.status_code != 409:  # 409: another process made it meanwhile
                raise
        network = api.inspect_network(route.network)
    subnets = [pool.get("Subnet") for pool in (network.get("IPAM") or {}).get("Config") or []]
    if not network.get("Internal") or route.subnet not in subnets:
        raise SandboxError(
            f"the Docker network {route.network} exists but is not the sandboxes' egress network (it must be "
            f"internal, on {route.subnet}; it is {'internal' if network.get('Internal') else 'not internal'}, "
            f"on {', '.join(map(str, subnets)) or 'no subnet'}): remove it, or set EGRESS_NETWORK to another name"
        )


def _firewall(bridge: str, port: int) -> None:
    """INPUT rules for the sandboxes' bridge: the proxy's port accepted, everything else dropped, in that
    order at the top of the chain, so no other service of the host (its database, Redis, the web server) is
    reachable from a sandbox whatever address it listens on."""
    iptables = shutil.which("iptables") or shutil.which("iptables", path="/usr/sbin:/sbin")
    if iptables is None:
        raise SandboxError(
            "iptables is not installed, so the sandboxes' network cannot be closed to the host's services: "
            "install it, or set EGRESS_FIREWALL=off where another firewall does this"
        )
    accept = ["-i", bridge, "-p", "tcp", "--dport", str(port), "-j", "ACCEPT"]
    drop = ["-i", bridge, "-j", "DROP"]
    wanted = [_rule_text(accept), _rule_text(drop)]
    try:
        listed = subprocess.run(
            [iptables, "-w", "-S", "INPUT"], capture_output=True, text=True, check=True
        ).stdout.splitlines()
        ours = [line for line in listed if f"-i {bridge} " in line + " "]
        if ours == wanted:
            return
        for line in ours:
            subprocess.run([iptables, "-w", "-D", *line.split()[1:]], capture_output=True, check=True)
        subprocess.run([iptables, "-w", "-I", "INPUT", "1", *drop], capture_output=True, check=True)
        subprocess.run([iptables, "-w", "-I", "INPUT", "1", *accept], capture_output=True, check=True)
    except subprocess.CalledProcessError as error:
        raise SandboxError(
            f"the sandboxes' network could not be closed to the host's services (iptables: "
            f"{(error.stderr or '').strip() or error.returncode}); run the workers as root, or set "
            "EGRESS_FIREWALL=off where another firewall does this"
        ) from None


def _rule_text(rule: list[str]) -> str:
    """A rule as `iptables -S` prints it."""
    text = " ".join(rule)
    return "-A INPUT " + text.replace("-p tcp --dport", "-p tcp -m tcp --dport")


def _at_pids_limit(message: str) -> bool:
    return (
        "resource temporarily unavailable" in message.lower() or "cannot allocate memory" in message.lower()
    )


class _PausedLook:
    """Whether a relayed call waits on a paused sandbox before its GO: a relay frozen with its container
    answers nothing, where a new exec is refused at once. Asked as the call waits; it looks (one inspect)
    PAUSED_LOOK_S after the call began, then twice as long after each look, at most PAUSED_LOOK_MAX_S. The
    relay, thawed, finds its input ended instead of GO, and does not run the call. (A call paused after its
    GO waits for its sandbox, as a call through a client of its own does.)"""

    def __init__(self, provider: DockerProvider, handle: str) -> None:
        self._provider, self._handle = provider, handle
        self._gap = PAUSED_LOOK_S
        self._next = time.monotonic() + self._gap
        self.seen = False

    def __call__(self) -> bool:
        now = time.monotonic()
        if now < self._next:
            return False
        self._gap = min(2 * self._gap, PAUSED_LOOK_MAX_S)
        self._next = now + self._gap
        # Any failure (the engine slow or gone) is not a pause: the call's own limits still hold.
        with contextlib.suppress(Exception):
            self.seen = bool(self._provider.api.inspect_container(self._handle)["State"].get("Paused"))
        return self.seen
