"""Putting a session's repositories into a new sandbox.

The worker clones and copies the tree into the sandbox's workspace; a repository token reaches neither.
Tokens are sealed in the vault (a layer above this one), and only the egress proxy opens them: with
EGRESS_HARNESS_URL set, git speaks through the proxy's door for the workers, as the session it clones for
(kernel/egress.py), and the proxy adds the token to the requests under the repository's URL. Without it
the clone goes out directly, with no credential, so only a public repository clones. The worker holds the
Docker socket, so what it hands git is checked first, by the resource's documented shape (reference §6.1):
at the API, and here again for rows stored before the API checked. git then runs with no configuration but
its command line's, speaking only the URL's own protocol. A repository that cannot be cloned is a
`session.error` the session continues past, as the reference specifies.

With the repository cache on (REPOSITORY_CACHE_DIR), the clone is made from the workers' mirror of the URL
(sandboxes/mirrors.py), once that mirror is brought up to date from the remote through the same door as the
session: the remote still decides, at every clone, whether the session may have the repository.
"""

from __future__ import annotations

import io
import ipaddress
import json
import logging
import posixpath
import re
import shlex
import subprocess
import tarfile
import tempfile
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import quote, urlsplit

from django.conf import settings

from kernel.api.validation import expect, no_unknown_fields, text
from kernel.egress import harness_proxied, harness_proxy_url
from kernel.errors import Invalid
from sandboxes import mirrors
from sandboxes.providers import DEPLOYMENT_LABEL, SandboxError, ToolFailed, ToolInputError, get_provider
from sessions import events

logger = logging.getLogger(__name__)

WORKSPACE = "/workspace/"
CLONE_TIMEOUT_SECONDS = 300
# git check-ref-format's rules for a branch (one level allowed), and no leading '-' that git could take as
# an option: no control characters, space, ~ ^ : ? * [ \, no '..', '@{' or '//', no component that starts
# with '.' or ends with '.lock', and not ending with '/' or '.'.
_NOT_A_BRANCH = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]|\.\.|@\{|//|/\.|\.lock(/|$)|^[./-]|[./]$")
_SHA = re.compile(r"[0-9a-fA-F]{7,40}|[0-9a-fA-F]{64}")
_HOSTNAME = re.compile(r"[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?")
_CREDENTIALS_IN_URL = re.compile(r"//[^/]*@")


class RepositoryError(Exception):
    """A repository that could not be put into the sandbox; `kind` is its session.error type."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _printable(value: str) -> bool:
    """No spaces and no control characters."""
    return not any(ch <= " " or ch == "\x7f" for ch in value)


def _url(url: str, where: str) -> str:
    if not _printable(url):
        raise Invalid(f"'{where}' must not contain spaces or control characters.")
    if _CREDENTIALS_IN_URL.search(url):
        raise Invalid(f"'{where}' must not carry credentials; give the token as 'authorization_token'.")
    scheme = next((s for s in ("https", "http", "git") if url.startswith(f"{s}://")), None)
    if scheme is None:
        raise Invalid(
            f"'{where}' must be an https:// URL (local paths, host:path and git's other "
            f"transports are not accepted), not {url!r}."
        )
    parts = urlsplit(url)
    try:
        host, _ = parts.hostname or "", parts.port
    except ValueError:
        raise Invalid(f"'{where}' has a malformed host or port: {url!r}.") from None
    if not (_HOSTNAME.fullmatch(host) or _is_ip(host)):
        raise Invalid(f"'{where}' must name a host, as https://github.com/owner/repo does; not {url!r}.")
    if scheme != "https" and host not in settings.REPOSITORY_PLAIN_HOSTS:
        raise Invalid(
            f"'{where}' must be an https:// URL: plain {scheme}:// is allowed only for the hosts "
            f"in REPOSITORY_PLAIN_HOSTS ({', '.join(settings.REPOSITORY_PLAIN_HOSTS) or 'none'})."
        )
    return url


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _checkout(value: Any, where: str) -> dict[str, str] | None:
    if value is None:
        return None
    expect(value, dict, f"'{where}'")
    kind = value.get("type")
    if kind == "branch":
        no_unknown_fields(value, ("type", "name"), where)
        name = text(value, "name", where, required=True, min_length=1, max_length=255)
        if name in ("@", "HEAD") or _NOT_A_BRANCH.search(name):
            raise Invalid(
                f"'{where}.name' must be a git branch name (not starting with '-' or '.', "
                f"without '..', spaces, control characters or any of ~^:?*[\\), not {name!r}."
            )
        return {"type": "branch", "name": name}
    if kind == "commit":
        no_unknown_fields(value, ("type", "sha"), where)
        sha = text(value, "sha", where, required=True, min_length=1)
        if not _SHA.fullmatch(sha):
            raise Invalid(
                f"'{where}.sha' must be a commit id of 7 to 40 hexadecimal digits "
                f"(64 for a SHA-256 repository), not {sha!r}."
            )
        return {"type": "commit", "sha": sha}
    raise Invalid(f"'{where}.type' must be 'branch' or 'commit', not {kind!r}.")


def _mount_path(path: str, where: str) -> str:
    folder = path.rstrip("/")
    if not (folder.startswith(WORKSPACE) and posixpath.normpath(folder) == folder and _printable(folder)):
        raise Invalid(
            f"'{where}' must be a folder under {WORKSPACE} (an absolute path without '.' or "
            f"'..' parts), not {path!r}."
        )
    return folder


def checked_repository(resource: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The url, mount_path and checkout of a github_repository resource, each checked by its documented
    shape; raises Invalid naming the field (`where` is the resource, e.g. resources[0]). Its token is
    `checked_token`'s: it is never stored with the resource."""
    url = _url(text(resource, "url", where, required=True, min_length=1, max_length=2048), f"{where}.url")
    name = PurePosixPath(urlsplit(url).path).name.removesuffix(".git") or urlsplit(url).hostname
    mount_path = text(resource, "mount_path", where, max_length=1024, default=f"{WORKSPACE}{name}")
    return {
        "url": url,
        "mount_path": _mount_path(mount_path, f"{where}.mount_path"),
        "checkout": _checkout(resource.get("checkout"), f"{where}.checkout"),
    }


def checked_token(value: Any, where: str) -> str:
    """A github_repository's `authorization_token` (`where` names the field): a string of 1 to 4096
    characters. The egress proxy sends it as the password of HTTP Basic auth, in a header: a space or a
    control character (a line break that would start another header) is refused here, before it is sealed."""
    token = expect(value, str, f"'{where}'")
    if not token:
        raise Invalid(f"'{where}' must not be empty.")
    if len(token) > 4096:
        raise Invalid(f"'{where}' must be at most 4096 characters, not {len(token)}.")
    if not _printable(token):
        raise Invalid(f"'{where}' must not contain spaces or control characters.")
    return str(token)


def _shown(url: Any) -> Any:
    return _CREDENTIALS_IN_URL.sub("//***@", url) if isinstance(url, str) else url


def _as_sandbox_user(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 1000
    info.uname = info.gname = "sandbox"
    return info


def _failure(stderr: str, *, checking_out: bool) -> str:
    if (
        "Authentication failed" in stderr
        or "could not read Username" in stderr
        or "could not read Password" in stderr
        or "returned error: 401" in stderr
    ):
        return "repository_authentication_error"
    if "returned error: 403" in stderr:
        return "repository_forbidden_error"
    if checking_out or "Remote branch" in stderr:
        return "repository_checkout_error"
    if re.search(r"repository '[^']*' not found", stderr):
        return "repository_not_found_error"
    return "repository_clone_error"


def _note(error: RepositoryError, session_id: str, resource_id: Any) -> str | None:
    """What to do about a clone that lacked a credential, in the platform's terms (git speaks of prompts)."""
    if "returned error: 407" in str(error) or "Proxy CONNECT aborted" in str(error):
        return (
            "The egress proxy refused the worker's identity at its door (EGRESS_HARNESS_URL): give the "
            "workers the proxy's EGRESS_HARNESS_TOKEN."
        )
    if error.kind != "repository_authentication_error":
        return None
    if not harness_proxied():
        return (
            "The repository asks for credentials, and the worker clones without any: repository tokens are "
            "added by the egress proxy, which the workers reach at EGRESS_HARNESS_URL (not set here), so only "
            "public repositories clone."
        )
    return (
        "The repository refused the clone's credentials: the egress proxy adds the session's token for this "
        "URL, and the session has none for it or a wrong one; give one with "
        f'POST /v1/sessions/{session_id}/resources/{resource_id} {{"authorization_token": ...}}.'
    )


def _config(*pairs: str) -> list[str]:
    return [argument for pair in pairs for argument in ("-c", pair)]


def _environment(folder: Path, session_id: str | None) -> dict[str, str]:
    """git's whole environment: no system or user config; with the proxy's door configured, the proxy for
    http and https (its URL carries the session's identity, so it lives here and never on a command line)
    and the proxy's CA, whose certificates git meets on https. Without a session (git on local folders
    alone), no proxy."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(folder),
        "XDG_CONFIG_HOME": str(folder),
        "LC_ALL": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_PROTOCOL_FROM_USER": "0",
    }
    if session_id is not None and harness_proxied():
        env["http_proxy"] = env["https_proxy"] = harness_proxy_url(session_id)
        if settings.EGRESS_CA_FILE:
            env["GIT_SSL_CAINFO"] = settings.EGRESS_CA_FILE
    return env


def _git(url: str) -> list[str]:
    """git, speaking only `url`'s protocol, running no hook, asking no credential helper, and sending the
    proxy's identity as Basic proxy auth at once (no unauthenticated first try)."""
    return [
        "git",
        *_config(
            "protocol.allow=never",
            f"protocol.{urlsplit(url).scheme}.allow=always",
            "core.hooksPath=/dev/null",
            "credential.helper=",
            "http.proxyAuthMethod=basic",
        ),
    ]


def _clone_options(checkout: dict[str, str]) -> list[str]:
    """The clone's options for the checkout: one commit deep for a branch (or the default one); all history
    for a commit, switched to afterwards."""
    if checkout.get("type") == "branch":
        return ["--depth=1", f"--branch={checkout['name']}"]
    if checkout.get("type") == "commit":
        return ["--no-checkout"]
    return ["--depth=1"]


def _switch(git: list[str], target: Path, checkout: dict[str, str], *, env: dict[str, str]) -> None:
    if checkout.get("type") == "commit":
        _run(
            [*git, "-C", str(target), "switch", "--quiet", "--detach", "--", checkout["sha"]],
            env=env,
            checking_out=True,
        )


@dataclass(frozen=True)
class Clone:
    """A repository's clone as the sandbox gets it: `archive` (`_archive`); when it came from the repository
    cache, the `name` of what it is (`_checkout_archive`), and whether it was `kept` (read, not cloned)."""

    archive: bytes
    name: str | None = None
    kept: bool = False


def _cloned(
    repository: dict[str, Any],
    folder: Path,
    *,
    session_id: str,
    on_state: Callable[[str | None], None] | None,
) -> Clone:
    """The clone, as the repository's checkout says, for session `session_id`: from the workers' mirror of
    the repository (sandboxes/mirrors.py) when the cache is on, from the network otherwise or if the cache
    cannot serve. Either way, the remote is asked as the session. `on_state` is told, once the session's own
    fetch brought the mirror up to date, the name the clone will have (None if the mirror cannot give it)."""
    if mirrors.cache_enabled():
        try:
            with mirrors.mirror_held(repository["url"], wait_s=CLONE_TIMEOUT_SECONDS) as mirror:
                _refresh_mirror(repository, folder, mirror, session_id=session_id)
                state = _state(mirror, repository["checkout"] or {})
                name = state and _name(repository, state)
                if on_state is not None:
                    on_state(name)
                return _checkout_archive(repository, folder, mirror, name)
        except mirrors.MirrorUnavailable as error:
            logger.warning("cloning %s without the repository cache: %s", repository["url"], error)
    return Clone(
        _archive(_clone_from_network(repository, folder, session_id=session_id), repository["mount_path"])
    )


def _family(repository: dict[str, Any]) -> str:
    """What a clone is of, whatever the remote's state: the URL (as spelled: the clone's origin), the folder
    and the checkout."""
    return json.dumps(_of(repository), sort_keys=True)


def _name(repository: dict[str, Any], state: str) -> str:
    """What a clone is: what it is of (`_family`) and the mirror's `_state` it is made from."""
    return json.dumps([*_of(repository), state], sort_keys=True)


PREPARED_RESOURCES = ("github_repository", "file")  # what a session's sandbox is prepared with


def prepared_resources(resources: list[Any]) -> list[dict[str, Any]]:
    """The resources a session's sandbox is prepared with (PREPARED_RESOURCES), in order."""
    return [r for r in resources if isinstance(r, dict) and r.get("type") in PREPARED_RESOURCES]


def prepared_named(name: str) -> dict[str, Any]:
    """What a sandbox holding the clone named `name` (`_name`) was prepared with, as `prepare_checkout` says it
    for a warm pool sandbox: the same label, so a session keeps it on the same proof."""
    url, mount_path, checkout, state = json.loads(name)
    return {"url": url, "mount_path": mount_path, "checkout": checkout, "state": state}


def _of(repository: dict[str, Any]) -> list[Any]:
    return [repository["url"], repository["mount_path"], repository["checkout"] or {}]


def _clone_from_network(repository: dict[str, Any], folder: Path, *, session_id: str) -> Path:
    """The clone straight from the remote.

    The worker holds no token: the egress proxy adds it (see the module's docstring). git reads no system
    or user config (GIT_CONFIG_NOSYSTEM, HOME in the temporary folder) and no credential helper, may speak
    only the URL's protocol (so no local path, transport helper, redirect or submodule reaches another),
    runs no hook, and gets `--` before the URL and the commit.
    """
    url = repository["url"]
    checkout = repository["checkout"] or {}
    env = _environment(folder, session_id)
    target = folder / "repo"
    git = _git(url)
    _run(
        [*git, "clone", "--quiet", "--no-tags", *_clone_options(checkout), "--", url, str(target)],
        env=env,
        checking_out=False,
    )
    _switch(git, target, checkout, env=env)
    return target


def _refresh_mirror(repository: dict[str, Any], folder: Path, mirror: Path, *, session_id: str) -> None:
    """Bring `mirror` (held locked by the caller) up to date from the remote as the session: that fetch is the
    session's proof of access (sandboxes/mirrors.py), through the same door and with the same git as
    `_clone_from_network`, and a refusal raises the RepositoryError a refusal of that clone would."""
    url = repository["url"]
    env = _environment(folder, session_id)
    git = [*_git(url), *_config("gc.autoDetach=false")]
    listing = _run([*git, "ls-remote", "--symref", "--", url, "HEAD"], env=env, checking_out=False)
    _run(
        [
            *git,
            "-C",
            str(mirror),
            "fetch",
            "--quiet",
            "--prune",
            "--no-tags",
            "--",
            url,
            "+refs/heads/*:refs/heads/*",
        ],
        env=env,
        checking_out=False,
    )
    head = re.search(r"^ref: (refs/heads/[^\t]+)\tHEAD$", listing, re.MULTILINE)
    if head:
        _run([*git, "-C", str(mirror), "symbolic-ref", "HEAD", head[1]], env=env, checking_out=False)


def _local_git() -> list[str]:
    """git on local folders alone: the file protocol only, and no hook."""
    return ["git", *_config("protocol.allow=never", "protocol.file.allow=always", "core.hooksPath=/dev/null")]


def _clone_local(repository: dict[str, Any], folder: Path, mirror: Path) -> Path:
    """Clone into `folder`/repo from `mirror` (held locked by the caller) as the repository's checkout says,
    without asking the remote. The clone speaks git's pack protocol to the mirror (`--no-local`: only what
    its branches reach, and no alternates or hard links into the cache), and is left as a clone from the URL
    is: origin is the URL, and the reflogs name it."""
    url = repository["url"]
    checkout = repository["checkout"] or {}
    local = _environment(folder, None)
    target = folder / "repo"
    git = _local_git()
    clone = [*git, "clone", "--quiet", "--no-tags", "--no-local", *_clone_options(checkout)]
    _run([*clone, "--", str(mirror), str(target)], env=local, checking_out=False)
    _run([*git, "-C", str(target), "config", "remote.origin.url", url], env=local, checking_out=False)
    for log in (target / ".git" / "logs").rglob("*"):
        if log.is_file():
            log.write_text(log.read_text().replace(f"clone: from {mirror}", f"clone: from {url}"))
    _switch(git, target, checkout, env=local)
    return target


def _checkout_archive(repository: dict[str, Any], folder: Path, mirror: Path, name: str | None) -> Clone:
    """The clone of `repository` from `mirror` (held locked by the caller), named for the mirror's `_state`
    (`name`); with no name (the mirror cannot give that checkout) the clone raises git's reason.
    Two clones of one URL, folder and checkout from one state of the mirror differ in their times alone, so
    the first is kept beside the mirror (`mirrors.stored_checkout`) and the next ones are read from there: a
    clone's CPU is spent once per state of the remote, not once per session. Only the caller's lock, after
    the fetch that proved the session's access, reaches a kept one."""
    if name and (kept := mirrors.stored_checkout(mirror, name)) is not None:
        return Clone(kept, name, kept=True)
    archive = _archive(_clone_local(repository, folder, mirror), repository["mount_path"])
    if name:
        mirrors.store_checkout(mirror, name, archive)
    return Clone(archive, name)


def _scrubbed(stderr: str) -> str:
    """git's complaint without the workers' proxy token, should a message ever quote the proxy's URL."""
    token = settings.EGRESS_HARNESS_TOKEN
    for secret in {token, quote(token, safe="")} if token else ():
        stderr = stderr.replace(secret, "***")
    return stderr


def _run(command: list[str], *, env: dict[str, str], checking_out: bool) -> str:
    """Run git; its output, or a RepositoryError of the kind its complaint says."""
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=CLONE_TIMEOUT_SECONDS, env=env)
    except subprocess.TimeoutExpired:
        raise RepositoryError(
            "repository_clone_error", f"git took longer than {CLONE_TIMEOUT_SECONDS} s"
        ) from None
    if run.returncode != 0:
        stderr = _scrubbed(run.stderr.strip())
        raise RepositoryError(
            _failure(stderr, checking_out=checking_out), stderr or f"git exited {run.returncode}"
        )
    return run.stdout


def repository_archive(resource: dict[str, Any], *, session_id: str, where: str = "resource") -> bytes:
    """Clone one github_repository resource of session `session_id` and return it as a tar relative to the
    workspace."""
    return repository_clone(resource, session_id=session_id, where=where).archive


def repository_clone(
    resource: dict[str, Any],
    *,
    session_id: str,
    where: str = "resource",
    on_state: Callable[[str | None], None] | None = None,
) -> Clone:
    """`repository_archive`, with what the cache knows of the clone (`_cloned`)."""
    repository = checked_repository(resource, where)
    with tempfile.TemporaryDirectory(prefix="workbench-clone-") as folder:
        try:
            return _cloned(repository, Path(folder), session_id=session_id, on_state=on_state)
        except RepositoryError as error:
            note = _note(error, session_id, resource.get("id"))
            if note is None:
                raise
            raise RepositoryError(error.kind, f"{note} (git: {error})") from None


def _archive(target: Path, mount: str) -> bytes:
    """The clone at `target` as a tar relative to the workspace, placed at `mount`, owned by the sandbox user."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(target, arcname=mount[len(WORKSPACE) :], filter=_as_sandbox_user)
    return buffer.getvalue()


# How long a new sandbox's start may wait for the fetch that names its checkout image.
IMAGE_WAIT_SECONDS = 5.0


class ClonesAhead:
    """A session's repositories cloned (`repository_clone`, one after another) in a thread of their own while
    its sandbox starts: `checkout_repositories` takes each from here, or the error its clone raised, as if it
    had cloned it then. The clone asks no database; a clone whose sandbox never started is dropped.

    On a provider that keeps checkout images (the docker provider's `make_checkout_image`), the sandbox may
    start from an image that already holds the first repository's checkout (`sandbox_image`): the one made
    for the very clone this session's own fetch just named, so the rule of the cache holds (the bytes are
    saved, never the proof: a session the remote refuses names none). An image is made, in the background,
    for a clone read from the cache: the second session of a state of the remote pays the copy, and the later
    ones start with the checkout in place."""

    def __init__(self, resources: list[dict[str, Any]], *, session_id: str) -> None:
        self._clones: dict[int, Future[Clone]] = {}
        self._first: int | None = None  # the repository a checkout image may hold
        self._family: str | None = None
        self._named = threading.Event()
        self._name: str | None = None
        self._base: str | None = None
        self.in_image: int | None = None  # the resource the sandbox's image holds already
        self._copied: dict[int, str] = {}  # resource -> the name (`_name`) of the clone copied in
        clones = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"clones-{session_id}")
        for i, resource in enumerate(resources):
            if isinstance(resource, dict) and resource.get("type") == "github_repository":
                if self._first is None:
                    self._first = i
                    with suppress(Invalid):  # its clone raises it, as the session's error
                        self._family = _family(checked_repository(resource, f"resources[{i}]"))
                self._clones[i] = clones.submit(self._clone, i, resource, session_id)
        clones.shutdown(wait=False)  # its thread ends after the last clone
        if self._first is None:
            self._named.set()

    def _clone(self, i: int, resource: dict[str, Any], session_id: str) -> Clone:
        first = i == self._first
        try:
            return repository_clone(
                resource,
                session_id=session_id,
                where=f"resources[{i}]",
                on_state=self._named_as if first else None,
            )
        finally:
            if first:
                self._named.set()

    def _named_as(self, name: str | None) -> None:
        self._name = name
        self._named.set()

    def clone(self, i: int) -> Clone | None:
        """Resource `i`'s clone (waiting for it), or what its clone raised; None if none was started."""
        clone = self._clones.get(i)
        return None if clone is None else clone.result()

    def sandbox_image(self, provider: Any, base: str) -> str:
        """The image the session's sandbox should start from: `base`, or the provider's checkout image of the
        first repository made from `base` for the clone this session's fetch names. Waits for that fetch (up
        to IMAGE_WAIT_SECONDS) only if the provider holds an image of that repository at all."""
        self._base = base
        if self._family is None or "checkout_image" not in provider.capabilities:
            return base
        try:
            if not provider.has_checkout_images(self._family):
                return base
            if not self._named.wait(IMAGE_WAIT_SECONDS) or self._name is None:
                return base
            image = provider.checkout_image(base, self._name)
        except SandboxError as error:
            logger.warning("starting a sandbox without its checkout image: %s", error)
            return base
        if image is None:
            return base
        self.in_image = self._first
        return str(image)

    @property
    def placed(self) -> dict[int, str]:
        """Resource index -> the name (`_name`) of the clone the sandbox holds of it, from the cache: in its
        image, or copied in."""
        if self.in_image is not None and self._name is not None:
            return {**self._copied, self.in_image: self._name}
        return dict(self._copied)

    def copied(self, provider: Any, i: int, clone: Clone) -> None:
        """Resource `i`'s clone was copied into the sandbox: if it was read from the cache, have an image made
        with it, for the next sandboxes (`sandbox_image`)."""
        if clone.name:
            self._copied[i] = clone.name
        if (
            i == self._first
            and clone.kept
            and clone.name
            and self._family
            and self._base
            and "checkout_image" in provider.capabilities
        ):
            _make_image(provider.name, self._base, clone.name, self._family, clone.archive)


_images = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkout-images")
_making: dict[tuple[str, str, str], Future[None]] = {}
_making_lock = threading.Lock()


def _make_image(provider_name: str, base: str, name: str, family: str, archive: bytes) -> None:
    """Have the provider make checkout image `name` in the background, one at a time, once per process."""
    key = (provider_name, base, name)
    with _making_lock:
        if key in _making:
            return
        _making[key] = _images.submit(_made_image, key, family, archive)


def _made_image(key: tuple[str, str, str], family: str, archive: bytes) -> None:
    provider_name, base, name = key
    try:
        provider: Any = get_provider(provider_name)  # the docker provider: the one with "checkout_image"
        scope = {DEPLOYMENT_LABEL: settings.WORKBENCH_DEPLOYMENT}
        provider.make_checkout_image(
            base, name, family, archive, scope=scope, most=settings.CHECKOUT_IMAGES_MAX
        )
    except SandboxError as error:
        logger.warning("could not make a checkout image: %s", error)
    finally:
        with _making_lock:
            _making.pop(key, None)


def checkout_images_made(timeout: float) -> bool:
    """Wait until the checkout images this process was making are made; whether they are (for the tests and
    the benchmarks, which then start sandboxes from them)."""
    with _making_lock:
        pending = list(_making.values())
    return not wait(pending, timeout=timeout).not_done if pending else True


def checkout_repositories(
    provider: Any,
    handle: str,
    resources: list[dict[str, Any]],
    emit: Any,
    *,
    session_id: str,
    prepared: dict[str, Any] | None = None,
    ahead: ClonesAhead | None = None,
) -> bool:
    """Put each github_repository resource of session `session_id` into the sandbox; one that cannot be
    (whatever is wrong with it, the stored resource included) is a session.error, and the next still gets
    its turn. `prepared`: the checkout a warm pool sandbox came with (`prepare_checkout`), which stands for
    the resource it matches only once the session proved its access; otherwise it is removed first. `ahead`:
    the clones started while the sandbox did (and what its image holds already). Returns whether it stood."""
    standing = _prepared_resource(resources, prepared, session_id=session_id) if prepared else None
    if prepared and standing is None:
        _remove_prepared(provider, handle, prepared)
    for i, resource in enumerate(resources):
        if i == standing or not isinstance(resource, dict) or resource.get("type") != "github_repository":
            continue
        if ahead is not None and i == ahead.in_image:
            continue
        try:
            clone = ahead.clone(i) if ahead is not None else None
            if clone is None:
                clone = repository_clone(resource, session_id=session_id, where=f"resources[{i}]")
            provider.copy_in(handle, clone.archive)
            if ahead is not None:
                ahead.copied(provider, i, clone)
            continue
        except Invalid as error:
            kind, reason = "repository_clone_error", error.message
        except RepositoryError as error:
            kind, reason = error.kind, str(error)
        except (SandboxError, OSError, tarfile.TarError) as error:
            kind, reason = "repository_clone_error", str(error)
        url = _shown(resource.get("url"))
        emit(
            events.session_error(
                kind, f"Could not put {url} into the sandbox: {reason}", retry="retrying", repository_url=url
            )
        )
    return standing is not None


# -- A warm pool sandbox with its environment's repository already checked out
#
# An environment may name a repository (config.sandbox.pool_repository) its pooled sandboxes come with. The
# refill checks it out from the workers' mirror alone, asking no remote and as no session, so it holds only
# what a session already fetched as itself. The rule of the cache holds: the bytes are saved, never the
# proof. A session that takes such a sandbox keeps the checkout only if one of its resources names the same
# repository, folder and checkout, and the mirror, once brought up to date from the remote as that session
# (the fetch every clone from the cache makes), still gives exactly what was checked out; in every other case
# (no such resource, a refusal, the remote moved on, a mirror that cannot serve) the checkout is removed
# before the session can run anything in the sandbox, and its resources are cloned as without a pool.

PREPARE_WAIT_SECONDS = 30  # how long a refill waits for a mirror another clone holds; then it prepares none


def _state(mirror: Path, checkout: dict[str, str]) -> str | None:
    """What a clone of `checkout` from `mirror` (held locked) is made of, as a string that changes whenever
    that clone would: the mirror's HEAD (the remote's default branch: the clone's branch, or its origin/HEAD,
    is named after it), the branch and its tip; for a commit, the commit and every branch the full clone
    copies. None if the mirror cannot give that checkout."""
    env = _environment(mirror, None)

    def git(*args: str) -> str | None:
        try:
            run = subprocess.run(
                [*_local_git(), "-C", str(mirror), *args], capture_output=True, text=True, env=env, timeout=60
            )
        except subprocess.TimeoutExpired:
            return None
        return run.stdout.strip() if run.returncode == 0 else None

    head = git("symbolic-ref", "HEAD")
    if not head:
        return None

    if checkout.get("type") == "commit":
        commit = git("rev-parse", "--verify", "--quiet", "--end-of-options", f"{checkout['sha']}^{{commit}}")
        branches = git("for-each-ref", "--format=%(refname) %(objectname)", "refs/heads/")
        if (
            not commit
            or not branches
            or not git("for-each-ref", "--count=1", f"--contains={commit}", "refs/heads/")
        ):
            return None
        return f"{head}\n{commit}\n{branches}"
    branch = f"refs/heads/{checkout['name']}" if checkout.get("type") == "branch" else head
    tip = git("rev-parse", "--verify", "--quiet", "--end-of-options", f"{branch}^{{commit}}")
    return f"{head}\n{branch} {tip}" if tip else None


def stands_for(repository: dict[str, Any], prepared: dict[str, Any]) -> bool:
    return (
        repository["url"] == prepared.get("url")  # the very spelling: the clone's origin is it
        and repository["mount_path"] == prepared.get("mount_path")
        and (repository["checkout"] or {}) == (prepared.get("checkout") or {})
    )


def prepare_checkout(provider: Any, handle: str, pool_repository: dict[str, Any]) -> dict[str, Any] | None:
    """Check the environment's `pool_repository` out into a new pool sandbox from the workers' mirror alone,
    and return what it holds (the sandbox's `prepared` label); None, with nothing copied, when the cache is
    off or busy or its mirror cannot give that checkout (no session fetched it yet). A copy that fails
    raises SandboxError: the caller discards the sandbox, which may hold part of the repository."""
    if not mirrors.cache_enabled():
        return None
    try:  # checked when stored, but the installation's rules (REPOSITORY_PLAIN_HOSTS) may have changed since
        repository = checked_repository(pool_repository, "config.sandbox.pool_repository")
    except Invalid as error:
        logger.warning("warm pool: not preparing %s: %s", pool_repository.get("url"), error.message)
        return None
    checkout = repository["checkout"] or {}
    try:
        with (
            mirrors.mirror_held(repository["url"], wait_s=PREPARE_WAIT_SECONDS) as mirror,
            tempfile.TemporaryDirectory(prefix="workbench-prepare-") as folder,
        ):
            state = _state(mirror, checkout)
            if state is None:
                return None
            archive = _checkout_archive(repository, Path(folder), mirror, _name(repository, state)).archive
    except (mirrors.MirrorUnavailable, RepositoryError, OSError, tarfile.TarError) as error:
        logger.warning(
            "warm pool: could not prepare %s from the repository cache: %s", repository["url"], error
        )
        return None
    provider.copy_in(handle, archive)
    return {
        "url": repository["url"],
        "mount_path": repository["mount_path"],
        "checkout": checkout,
        "state": state,
    }


def _prepared_resource(
    resources: list[dict[str, Any]], prepared: dict[str, Any], *, session_id: str
) -> int | None:
    """The index of the session's resource the prepared checkout stands for, once the session proved its
    access and the mirror still gives what was checked out; None otherwise (also when this worker has no
    cache: the proof and the comparison need the mirror)."""
    if not mirrors.cache_enabled():
        return None
    for i, resource in enumerate(resources):
        if not isinstance(resource, dict) or resource.get("type") != "github_repository":
            continue
        try:
            repository = checked_repository(resource, f"resources[{i}]")
        except Invalid:
            continue
        if not stands_for(repository, prepared):
            continue
        try:
            with (
                mirrors.mirror_held(repository["url"], wait_s=CLONE_TIMEOUT_SECONDS) as mirror,
                tempfile.TemporaryDirectory(prefix="workbench-proof-") as folder,
            ):
                _refresh_mirror(repository, Path(folder), mirror, session_id=session_id)
                if _state(mirror, repository["checkout"] or {}) == prepared.get("state"):
                    return i
        except (mirrors.MirrorUnavailable, RepositoryError, OSError) as error:
            # The clone that follows asks again, and its error is the session's.
            logger.info(
                "session %s: the prepared checkout of %s is not used: %s",
                session_id,
                resource.get("url"),
                error,
            )
        return None
    return None


RENEW_WAIT_SECONDS = 5  # how long pool maintenance waits for a mirror a clone holds; then it renews nothing


def mirror_state(pool_repository: dict[str, Any]) -> tuple[str, float] | None:
    """What a checkout of an environment's `pool_repository` prepared now would be made of (`_state`), and
    when the workers' mirror last fetched from the remote (a session's fetch: the only one there is); None
    when the cache is off or busy, or its mirror cannot give that checkout. Asks no remote."""
    if not mirrors.cache_enabled():
        return None
    try:
        repository = checked_repository(pool_repository, "config.sandbox.pool_repository")
        with mirrors.mirror_held(repository["url"], wait_s=RENEW_WAIT_SECONDS) as mirror:
            state = _state(mirror, repository["checkout"] or {})
            fetched = (mirror / "FETCH_HEAD").stat().st_mtime
    except (Invalid, mirrors.MirrorUnavailable, OSError):
        return None
    return None if state is None else (state, fetched)


def prepared_as(pool_repository: dict[str, Any], prepared: dict[str, Any]) -> bool:
    """Whether a pool member's checkout (`prepared`) is of the environment's `pool_repository` as configured
    now: the same URL, folder and checkout."""
    try:
        return stands_for(checked_repository(pool_repository, "config.sandbox.pool_repository"), prepared)
    except Invalid:
        return False


def _remove_prepared(provider: Any, handle: str, prepared: dict[str, Any]) -> None:
    """Remove a prepared checkout the session may not keep; SandboxError if it is still there."""
    folder = shlex.quote(prepared["mount_path"])
    try:
        said = provider.execute(
            handle, "bash", {"command": f"rm -rf -- {folder}; test -e {folder} || echo gone"}
        )
    except (SandboxError, ToolFailed, ToolInputError) as error:
        raise SandboxError(
            f"could not remove the warm pool's checkout at {prepared['mount_path']}: {error}"
        ) from error
    if said.strip() != "gone":
        raise SandboxError(
            f"could not remove the warm pool's checkout at {prepared['mount_path']}: {said.strip()}"
        )
