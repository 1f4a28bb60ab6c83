"""Putting a session's repositories into a new sandbox.

The worker clones (the sandbox has no network, and a repository token must never enter it) and copies the
tree into the sandbox's workspace. The worker holds the Docker socket, so what it hands git is checked first,
by the resource's documented shape (reference §6.1): at the API, and here again for rows stored before the API
checked. git then runs with no configuration but its command line's, speaking only the URL's own protocol. A
repository that cannot be cloned is a `session.error` the session continues past, as the reference specifies.
"""

from __future__ import annotations

import io
import ipaddress
import posixpath
import re
import subprocess
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from kernel.api.validation import expect, no_unknown_fields, text
from kernel.errors import Invalid
from sandboxes.providers import SandboxError
from sessions import events

WORKSPACE = "/workspace/"
CLONE_TIMEOUT_SECONDS = 300
# The user name GitHub takes with an access token as the password.
TOKEN_USERNAME = "x-access-token"
# git check-ref-format's rules for a branch (one level allowed), and no leading '-' that git could take as
# an option: no control characters, space, ~ ^ : ? * [ \, no '..', '@{' or '//', no component that starts
# with '.' or ends with '.lock', and not ending with '/' or '.'.
_NOT_A_BRANCH = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]|\.\.|@\{|//|/\.|\.lock(/|$)|^[./-]|[./]$")
_SHA = re.compile(r"[0-9a-fA-F]{7,40}|[0-9a-fA-F]{64}")
_HOSTNAME = re.compile(r"[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?")
_CREDENTIALS_IN_URL = re.compile(r"//[^/]*@")

# git's credential helper for one clone (see `_clone`): it reads git's request on stdin and answers `get`
# with the token from its environment, only for the repository's own protocol and host.
_CREDENTIAL_HELPER = """#!/bin/sh
test "$1" = get || exit 0
while IFS= read -r line && test -n "$line"; do
  case "$line" in
    protocol=*) protocol=${line#protocol=} ;;
    host=*) host=${line#host=} ;;
  esac
done
test "$protocol://$host" = "$WORKBENCH_GIT_ORIGIN" || exit 0
printf 'username=%s\\npassword=%s\\n' "$WORKBENCH_GIT_USERNAME" "$WORKBENCH_GIT_TOKEN"
"""


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


def checked_repository(resource: dict[str, Any], where: str) -> dict[str, Any]:
    """The url, mount_path, checkout and token of a github_repository resource, each checked by its
    documented shape; raises Invalid naming the field (`where` is the resource, e.g. resources[0])."""
    url = _url(text(resource, "url", where, required=True, min_length=1, max_length=2048), f"{where}.url")
    name = PurePosixPath(urlsplit(url).path).name.removesuffix(".git") or urlsplit(url).hostname
    mount_path = text(resource, "mount_path", where, max_length=1024, default=f"{WORKSPACE}{name}")
    checked = {
        "url": url,
        "mount_path": _mount_path(mount_path, f"{where}.mount_path"),
        "checkout": _checkout(resource.get("checkout"), f"{where}.checkout"),
    }
    token = text(resource, "authorization_token", where, nullable=True, max_length=4096, default=None)
    if token:
        if not _printable(token):
            raise Invalid(f"'{where}.authorization_token' must not contain spaces or control characters.")
        checked["authorization_token"] = token
    return checked


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
    ):
        return "repository_authentication_error"
    if "returned error: 403" in stderr:
        return "repository_forbidden_error"
    if checking_out or "Remote branch" in stderr:
        return "repository_checkout_error"
    if re.search(r"repository '[^']*' not found", stderr):
        return "repository_not_found_error"
    return "repository_clone_error"


def _config(*pairs: str) -> list[str]:
    return [argument for pair in pairs for argument in ("-c", pair)]


def _clone(repository: dict[str, Any], folder: Path) -> Path:
    """Clone into `folder`/repo, as the repository's checkout says.

    The token reaches git through a credential helper, never a command line (which any host user can read
    in /proc/*/cmdline) nor a file: the helper reads the token from its own environment, which only the
    worker's uid and root can read, and writes it to git on a pipe. The helper answers only for the URL's
    own protocol and host, so a redirect elsewhere never gets the token. git reads no system or user
    config (GIT_CONFIG_NOSYSTEM, HOME in the temporary folder), may speak only the URL's protocol (so no
    local path, transport helper, redirect or submodule reaches another), and gets `--` before the URL and
    the commit.
    """
    url, token = repository["url"], repository.get("authorization_token")
    checkout = repository["checkout"] or {}
    parts = urlsplit(url)
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
    git = [
        "git",
        *_config(
            "protocol.allow=never",
            f"protocol.{parts.scheme}.allow=always",
            "core.hooksPath=/dev/null",
            "credential.helper=",
        ),
    ]
    clone, clone_env = [*git], env
    if token:
        helper = folder / "credential-helper"
        helper.write_text(_CREDENTIAL_HELPER)
        helper.chmod(0o700)
        clone += _config(f"credential.helper={helper}")
        clone_env = {
            **env,
            "WORKBENCH_GIT_ORIGIN": f"{parts.scheme}://{parts.netloc}",
            "WORKBENCH_GIT_USERNAME": TOKEN_USERNAME,
            "WORKBENCH_GIT_TOKEN": token,
        }
    clone += ["clone", "--quiet", "--no-tags"]
    if checkout.get("type") == "branch":
        clone += ["--depth=1", f"--branch={checkout['name']}"]
    elif checkout.get("type") == "commit":
        clone += ["--no-checkout"]
    else:
        clone += ["--depth=1"]
    target = folder / "repo"
    _run([*clone, "--", url, str(target)], env=clone_env, token=token, checking_out=False)
    if checkout.get("type") == "commit":
        _run(
            [*git, "-C", str(target), "switch", "--quiet", "--detach", "--", checkout["sha"]],
            env=env,
            token=token,
            checking_out=True,
        )
    return target


def _run(command: list[str], *, env: dict[str, str], token: str | None, checking_out: bool) -> None:
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=CLONE_TIMEOUT_SECONDS, env=env)
    except subprocess.TimeoutExpired:
        raise RepositoryError(
            "repository_clone_error", f"git took longer than {CLONE_TIMEOUT_SECONDS} s"
        ) from None
    if run.returncode != 0:
        stderr = run.stderr.strip().replace(token or "\0", "***")
        raise RepositoryError(
            _failure(stderr, checking_out=checking_out), stderr or f"git exited {run.returncode}"
        )


def repository_archive(resource: dict[str, Any], *, where: str = "resource") -> bytes:
    """Clone one github_repository resource and return it as a tar relative to the workspace."""
    repository = checked_repository(resource, where)
    mount = repository["mount_path"]
    with tempfile.TemporaryDirectory(prefix="workbench-clone-") as folder:
        target = _clone(repository, Path(folder))
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            tar.add(target, arcname=mount[len(WORKSPACE) :], filter=_as_sandbox_user)
        return buffer.getvalue()


def checkout_repositories(provider: Any, handle: str, resources: list[dict[str, Any]], emit: Any) -> None:
    """Put each github_repository resource into the sandbox; one that cannot be (whatever is wrong with it,
    the stored resource included) is a session.error, and the next still gets its turn."""
    for i, resource in enumerate(resources):
        if not isinstance(resource, dict) or resource.get("type") != "github_repository":
            continue
        try:
            provider.copy_in(handle, repository_archive(resource, where=f"resources[{i}]"))
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
