"""Putting a session's repositories into a new sandbox.

The worker clones (the sandbox has no network, and a repository token must never enter it), rewrites the
remote to the token-free URL, and copies the tree into the sandbox's workspace. A repository that cannot be
cloned is a `session.error` the session continues past, as the reference specifies.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from sandboxes.providers import SandboxError

WORKSPACE = "/workspace/"
CLONE_TIMEOUT_SECONDS = 300


def _with_token(url: str, token: str | None) -> str:
    if not token:
        return url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return url
    return urlunsplit(parts._replace(netloc=f"x-access-token:{token}@{parts.hostname}"
                                            + (f":{parts.port}" if parts.port else "")))


def _as_sandbox_user(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 1000
    info.uname = info.gname = "sandbox"
    return info


def repository_archive(resource: dict[str, Any]) -> bytes:
    """Clone one github_repository resource and return it as a tar relative to the workspace."""
    mount = resource["mount_path"]
    if not mount.startswith(WORKSPACE) or ".." in Path(mount).parts:
        raise ValueError(f"mount_path {mount!r} must be a folder under {WORKSPACE}")
    checkout = resource.get("checkout") or {}
    with tempfile.TemporaryDirectory(prefix="workbench-clone-") as folder:
        target = Path(folder) / "repo"
        command = ["git", "clone", "--quiet", "--no-tags"]
        if checkout.get("type") == "branch":
            command += ["--depth", "1", "--branch", checkout["name"]]
        elif checkout.get("type") != "commit":
            command += ["--depth", "1"]
        run = subprocess.run([*command, _with_token(resource["url"], resource.get("authorization_token")),
                              str(target)], capture_output=True, text=True, timeout=CLONE_TIMEOUT_SECONDS,
                             env={"GIT_TERMINAL_PROMPT": "0", "PATH": "/usr/bin:/bin"})
        if run.returncode != 0:
            raise RuntimeError(run.stderr.strip().replace(resource.get("authorization_token") or "\0", "***")
                               or f"git clone exited {run.returncode}")
        if checkout.get("type") == "commit":
            subprocess.run(["git", "-C", str(target), "checkout", "--quiet", checkout["sha"]], check=True,
                           capture_output=True, timeout=CLONE_TIMEOUT_SECONDS)
        subprocess.run(["git", "-C", str(target), "remote", "set-url", "origin", resource["url"]], check=True,
                       capture_output=True)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            tar.add(target, arcname=mount[len(WORKSPACE):].strip("/"), filter=_as_sandbox_user)
        return buffer.getvalue()


def checkout_repositories(provider: Any, handle: str, resources: list[dict[str, Any]], emit: Any) -> None:
    for resource in resources:
        if resource.get("type") != "github_repository":
            continue
        try:
            provider.copy_in(handle, repository_archive(resource))
        except (RuntimeError, ValueError, SandboxError, subprocess.SubprocessError, OSError) as error:
            emit({"type": "session.error", "error": {
                "type": "repository_clone_error", "repository_url": resource["url"],
                "message": f"Could not put {resource['url']} into the sandbox: {error}",
                "retry_status": {"type": "retrying"}}})
