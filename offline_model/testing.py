"""Start an offline model for a test or a benchmark, and drive its control endpoints.

    with start_offline_model(ttft_ms=50) as model:
        client = anthropic.Anthropic(base_url=model.base_url, api_key="test")
        model.inject_fault("529", count=2)

In-process is fastest to start; ``in_subprocess=True`` runs the real CLI in its own process, so
a benchmark's 50 client threads do not share a GIL with the server.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from offline_model.server import OfflineModelServer
from offline_model.state import FaultKind, Latency

_REPO_ROOT = Path(__file__).resolve().parents[2]


class OfflineModel:
    def __init__(self, base_url: str, stop: Callable[[], None]) -> None:
        self.base_url = base_url
        self._stop = stop

    def inject_fault(self, kind: FaultKind, *, count: int = 1) -> None:
        self._post("/_control/faults", {"kind": kind, "count": count})

    def set_latency(self, *, ttft_ms: float = 0, tps: float = 0) -> None:
        self._post("/_control/latency", {"ttft_ms": ttft_ms, "tps": tps})

    def reset(self) -> None:
        self._post("/_control/reset", {})

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.base_url}/_control/stats", timeout=5) as response:
            return json.load(response)

    def stop(self) -> None:
        self._stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _post(self, path: str, body: dict[str, Any]) -> None:
        request = urllib.request.Request(
            f"{self.base_url}{path}",
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=5):
            pass


def start_offline_model(*, ttft_ms: float = 0, tps: float = 0, in_subprocess: bool = False) -> OfflineModel:
    """A running offline model on a free loopback port; stop it (or leave the `with` block) when done."""
    if in_subprocess:
        return _start_subprocess(ttft_ms=ttft_ms, tps=tps)
    server = OfflineModelServer(("127.0.0.1", 0), latency=Latency(ttft_ms=ttft_ms, tps=tps))
    threading.Thread(target=server.serve_forever, name="offline-model", daemon=True).start()
    return OfflineModel(server.base_url, server.stop)


def _start_subprocess(*, ttft_ms: float, tps: float) -> OfflineModel:
    command = [sys.executable, "-m", "offline_model", "--port", "0"]
    command += ["--ttft-ms", str(ttft_ms), "--tps", str(tps)]
    python_path = os.pathsep.join(filter(None, [str(_REPO_ROOT), os.environ.get("PYTHONPATH")]))
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": python_path}
    )
    stdout = process.stdout
    assert stdout is not None
    banner = stdout.readline()
    if not banner:
        process.wait(timeout=5)
        raise RuntimeError(f"offline model exited with {process.returncode} before listening")

    def stop() -> None:
        process.send_signal(signal.SIGTERM)
        returncode = process.wait(timeout=10)
        stdout.close()
        if returncode != 0:
            raise RuntimeError(f"offline model exited with {process.returncode} on SIGTERM")

    return OfflineModel(banner.split()[-1], stop)
