"""``python -m offline_model``: serve the offline model until SIGINT or SIGTERM."""

import argparse
import os
import signal
import threading

from offline_model.server import OfflineModelServer
from offline_model.state import Latency


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m offline_model",
        description="A deterministic, scriptable stand-in for the Anthropic Messages API.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765, help="0 picks a free port (printed on start)")
    parser.add_argument(
        "--ttft-ms",
        type=float,
        default=float(os.environ.get("OFFLINE_MODEL_TTFT_MS", "0")),
        help="delay before the first content block (env OFFLINE_MODEL_TTFT_MS; default 0)",
    )
    parser.add_argument(
        "--tps",
        type=float,
        default=float(os.environ.get("OFFLINE_MODEL_TPS", "0")),
        help="streamed tokens per second, 0 for unlimited (env OFFLINE_MODEL_TPS; default 0)",
    )
    args = parser.parse_args(argv)

    server = OfflineModelServer((args.host, args.port), latency=Latency(ttft_ms=args.ttft_ms, tps=args.tps))
    stop_requested = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop_requested.set())
    # serve_forever runs in a thread so that the signal handler only sets a flag and the main
    # thread can call shutdown(), which would deadlock if called from serve_forever's own thread.
    threading.Thread(target=server.serve_forever, name="offline-model", daemon=True).start()
    print(f"offline model listening on {server.base_url}", flush=True)
    stop_requested.wait()
    server.stop()


if __name__ == "__main__":
    main()
