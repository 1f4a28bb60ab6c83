"""A git server on loopback for tests: smart HTTP (`git http-backend` as CGI), optionally behind a token.

Repositories are folders under `root` (`make_repository` makes one); `url(name)` is its plain http:// URL on
127.0.0.1, so a test that clones from it must allow that host (`REPOSITORY_PLAIN_HOSTS`).
"""

from __future__ import annotations

import base64
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

USERNAME = "x-access-token"


def make_repository(
    folder: Path, files: dict[str, str], *, branches: dict[str, dict[str, str]] | None = None
) -> str:
    """A bare repository at `folder` whose `main` holds `files` (one commit); each of `branches` is one more
    commit on a branch of that name. Returns main's commit."""
    work = folder.with_name(folder.name + "-work")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(work)]
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True)
    for name, content in files.items():
        (work / name).write_text(content)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "first"], check=True)
    head = subprocess.run(
        [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    for branch, extra in (branches or {}).items():
        subprocess.run([*git, "checkout", "-qb", branch, "main"], check=True)
        for name, content in extra.items():
            (work / name).write_text(content)
        subprocess.run([*git, "add", "."], check=True)
        subprocess.run([*git, "commit", "-qm", branch], check=True)
    subprocess.run([*git, "checkout", "-q", "main"], check=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(folder)], check=True)
    return head


def push_commit(bare: Path, name: str, content: str) -> str:
    """One more commit (the file `name` with `content`) on the served repository's main; returns it."""
    work = bare.with_name(bare.name + "-more")
    if not work.exists():
        subprocess.run(["git", "clone", "-q", str(bare), str(work)], check=True)
    (work / name).write_text(content)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(work)]
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", name], check=True)
    subprocess.run([*git, "push", "-q", "origin", "main"], check=True)
    return subprocess.run(
        [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()


@dataclass
class GitServer:
    root: Path
    port: int = 0
    token: str | None = None
    # Each request waits this long, so that a clone's processes live long enough to be seen.
    delay_s: float = 0.0
    requests: list[tuple[str, str, bool]] = field(default_factory=list)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"


def _handler(server: GitServer) -> type[BaseHTTPRequestHandler]:
    expected = None
    if server.token is not None:
        expected = "Basic " + base64.b64encode(f"{USERNAME}:{server.token}".encode()).decode()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self._backend()

        def do_POST(self) -> None:
            self._backend()

        def _backend(self) -> None:
            time.sleep(server.delay_s)
            authorized = expected is None or self.headers.get("Authorization") == expected
            server.requests.append((self.command, self.path, authorized))
            if not authorized:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="git"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            path, _, query = self.path.partition("?")
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            env = {
                "PATH": "/usr/bin:/bin",
                "GIT_PROJECT_ROOT": str(server.root),
                "GIT_HTTP_EXPORT_ALL": "1",
                "GIT_CONFIG_NOSYSTEM": "1",
                "HOME": str(server.root),
                "REQUEST_METHOD": self.command,
                "PATH_INFO": path,
                "QUERY_STRING": query,
                "CONTENT_LENGTH": str(len(body)),
                "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                "REMOTE_ADDR": "127.0.0.1",
                "REMOTE_USER": USERNAME,
                "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
                "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
            }
            output = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True).stdout
            # Only the CGI head's line ends are normalised: the payload is binary (a pack), and a CR LF
            # inside it, rewritten, broke the client's pkt-line framing now and then ("bad line length").
            head, blank, payload = output.partition(b"\r\n\r\n")
            if not blank:
                head, _, payload = output.partition(b"\n\n")
            headers = [
                line.split(b":", 1) for line in head.replace(b"\r\n", b"\n").split(b"\n") if b":" in line
            ]
            status = next(
                (int(value.split()[0]) for name, value in headers if name.lower() == b"status"), 200
            )
            self.send_response(status)
            for name, value in headers:
                if name.lower() != b"status":
                    self.send_header(name.decode(), value.decode().strip())
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    return Handler


@contextmanager
def git_http_server(root: Path, *, token: str | None = None, delay_s: float = 0.0) -> Iterator[GitServer]:
    """Serve the repositories under `root` on 127.0.0.1 until the block ends; with `token`, only to a client
    that sends it as the password of HTTP Basic auth (as GitHub takes an access token)."""
    server = GitServer(root=root, token=token, delay_s=delay_s)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(server))
    server.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, name="git-http-server", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
