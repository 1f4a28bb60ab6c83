"""The workers' repository cache: a bare mirror per repository URL, which a session's clone is made from.

A mirror is a bare repository under REPOSITORY_CACHE_DIR, named by a hash of its URL (normalised: scheme and
host in lower case, no default port, no trailing `/` or `.git`), holding the branches and HEAD its remote
serves and nothing of anyone's: git fetches into it through the egress proxy, which adds the token on the
way out, and it is handed the URL on the command line, so its config holds no URL, proxy or token.

The rule that keeps the cache from being a way round a repository's access (sandboxes/repositories.py keeps
it): the cache saves the bytes, never the proof. Every clone first fetches into the mirror from the remote,
as the session it clones for, as a clone from the network would; a remote that refuses the session refuses
that fetch, and the session gets the error the clone would have got, and nothing from the mirror. Nor does
the cache stand in for an unreachable remote. The fetch prunes, so the mirror's branches are what the remote
has just shown this session, and the clone, under the same lock, takes from the mirror only what those
branches reach (git's pack protocol, not a copy of its object files): nothing another session fetched that
the remote no longer serves.

A clone is a function of its URL, folder and checkout and of the mirror's state the fetch left (its HEAD and
the tips the clone copies: sandboxes/repositories.py's `_state`), but for its times. So the first clone of
each is kept, as the tar the sandbox gets, in the mirror's `workbench-checkouts` folder (the CHECKOUTS_KEPT
used last), and a later one, once its own fetch under the lock showed the same state, is read from there:
a clone costs its CPU once per state of the remote, not once per session, and the lock is held for the
fetch and a read of the file.

One lock per mirror (`<key>.lock` beside it, flock) is held from the fetch to the end of the clone, so two
workers (or two of one worker's processes) never fill a mirror at once; a new mirror is made under a
temporary name and renamed, so a worker killed midway leaves none half made. Eviction is least recently
used: each use stamps its lock file's time, and after a use, while the mirrors weigh more than
REPOSITORY_CACHE_MAX_MB, the one used longest ago that no one holds is removed (the one just used stays,
even alone over the cap).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings

logger = logging.getLogger(__name__)

_DEFAULT_PORTS = {"https": 443, "http": 80, "git": 9418}
_LOCK_POLL_SECONDS = 0.05


class MirrorUnavailable(Exception):
    """The cache could not give a mirror (its folder unwritable, its lock held too long): clone without it."""


def cache_enabled() -> bool:
    return bool(settings.REPOSITORY_CACHE_DIR)


def _root() -> Path:
    return Path(settings.REPOSITORY_CACHE_DIR)


def mirror_key(url: str) -> str:
    """The mirror's name for `url`: the same for the spellings of one repository that git treats alike."""
    parts = urlsplit(url)
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    netloc = host if parts.port in (None, _DEFAULT_PORTS.get(scheme)) else f"{host}:{parts.port}"
    path = parts.path.rstrip("/").removesuffix(".git").rstrip("/")
    normal = urlunsplit((scheme, netloc, path, parts.query, ""))
    return hashlib.sha256(normal.encode()).hexdigest()[:40]


def mirror_path(url: str) -> Path:
    return _root() / f"{mirror_key(url)}.git"


def _locked(path: Path, *, wait_s: float) -> IO[str] | None:
    """`path` opened and flocked exclusively, waiting up to `wait_s`; None if it stayed held. The file is
    checked to be the one still at `path` once locked: eviction removes a lock file while holding it, and a
    process that had opened it before must not think itself alone with a new one."""
    deadline = time.monotonic() + wait_s
    while True:
        handle = open(path, "a")  # noqa: SIM115 (the caller closes it, which releases the lock)
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as error:
                if error.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() >= deadline:
                    handle.close()
                    if error.errno in (errno.EAGAIN, errno.EACCES):
                        return None
                    raise
                time.sleep(_LOCK_POLL_SECONDS)
        try:
            if os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
                return handle
        except FileNotFoundError:
            pass
        handle.close()


def _create(mirror: Path) -> None:
    """An empty bare repository at `mirror`, made aside and renamed into place (the caller holds its lock)."""
    if mirror.exists():  # a folder without HEAD: not a repository, whatever left it
        shutil.rmtree(mirror)
    made = mirror.with_suffix(".new")
    shutil.rmtree(made, ignore_errors=True)
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(_root()),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
    }
    run = subprocess.run(
        ["git", "init", "--quiet", "--bare", "--template=", str(made)],
        capture_output=True,
        text=True,
        env=env,
    )
    if run.returncode != 0:
        raise OSError(f"git init of a mirror failed: {run.stderr.strip()}")
    made.rename(mirror)


@contextmanager
def mirror_held(url: str, *, wait_s: float) -> Iterator[Path]:
    """The mirror of `url`, made if new, locked for the block's length; raises MirrorUnavailable (before the
    block runs) if the cache cannot give it. After the block, the cache is trimmed to its size."""
    key = mirror_key(url)
    try:
        _root().mkdir(mode=0o700, parents=True, exist_ok=True)  # private repositories: the worker's alone
        lock = _locked(_root() / f"{key}.lock", wait_s=wait_s)
        if lock is None:
            raise MirrorUnavailable(f"the mirror of {url} stayed busy for {wait_s:g} s")
    except OSError as error:
        raise MirrorUnavailable(f"the repository cache {_root()} is unusable: {error}") from error
    with lock:
        mirror = _root() / f"{key}.git"
        try:
            if not (mirror / "HEAD").is_file():
                _create(mirror)
            os.utime(lock.fileno())
        except OSError as error:
            raise MirrorUnavailable(f"could not make the mirror of {url}: {error}") from error
        yield mirror
    mirrors_evict(keep=key)


CHECKOUTS_KEPT = 4  # per mirror, the most recently used
_CHECKOUTS = "workbench-checkouts"  # a folder inside the bare mirror, which git leaves alone


def _checkout_file(mirror: Path, name: str) -> Path:
    return mirror / _CHECKOUTS / f"{hashlib.sha256(name.encode()).hexdigest()}.tar"


def stored_checkout(mirror: Path, name: str) -> bytes | None:
    """The checkout kept as `name` beside `mirror` (held locked by the caller), marked used; None if none is."""
    path = _checkout_file(mirror, name)
    try:
        archive = path.read_bytes()
        os.utime(path)
    except FileNotFoundError:
        return None
    return archive


def store_checkout(mirror: Path, name: str, archive: bytes) -> None:
    """Keep `archive` as `name` beside `mirror` (held locked by the caller), written aside and renamed so that
    none is ever read half written, and drop all but the CHECKOUTS_KEPT used last. A cache that cannot keep
    it only loses the saving: the failure is logged."""
    path = _checkout_file(mirror, name)
    try:
        path.parent.mkdir(mode=0o700, exist_ok=True)
        made = path.with_suffix(".new")
        made.write_bytes(archive)
        made.rename(path)
        kept = sorted(path.parent.glob("*.tar"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in kept[CHECKOUTS_KEPT:]:
            old.unlink(missing_ok=True)
    except OSError as error:
        logger.warning("repository cache: could not keep a checkout of %s: %s", mirror.name, error)


def _size(folder: Path) -> int:
    total = 0
    for parent, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(parent, name)).st_size
            except FileNotFoundError:
                continue
    return total


def mirrors_evict(*, keep: str | None = None) -> list[str]:
    """Remove the least recently used mirrors, not held by anyone and not `keep`, until the cache is within
    REPOSITORY_CACHE_MAX_MB; returns the removed mirrors' keys."""
    cap = settings.REPOSITORY_CACHE_MAX_MB * 1024 * 1024
    mirrors = []
    for mirror in _root().glob("*.git"):
        try:
            used = mirror.with_suffix(".lock").stat().st_mtime
        except FileNotFoundError:
            used = 0.0
        mirrors.append((used, mirror.stem, _size(mirror)))
    total = sum(size for _, _, size in mirrors)
    removed = []
    for _, key, size in sorted(mirrors):
        if total <= cap:
            break
        if key == keep:
            continue
        lock_path = _root() / f"{key}.lock"
        try:
            lock = _locked(lock_path, wait_s=0)
        except OSError:
            continue
        if lock is None:
            continue
        with lock:
            shutil.rmtree(_root() / f"{key}.git", ignore_errors=True)
            lock_path.unlink(missing_ok=True)
        total -= size
        removed.append(key)
        logger.info("repository cache: removed mirror %s (%d bytes), least recently used", key, size)
    return removed
