"""A self-hosted worker for the tests: the official SDK's environment worker, unmodified, in its own process.

    python tests/harness/self_hosted_worker.py serve BASE_URL ENVIRONMENT_ID --workdir DIR [--max-idle S]
    python tests/harness/self_hosted_worker.py ack BASE_URL ENVIRONMENT_ID

The environment key comes in ANTHROPIC_ENVIRONMENT_KEY (never on a command line), and the worker's id in
WORKER_ID. `serve` runs `client.beta.environments.work.worker(...).run()`: it polls, claims each item with
its first heartbeat, runs the SDK's own agent toolset in DIR, and loops. `ack` takes one item with the SDK's
poller, which acks an item before it hands it over, prints `acked <work id>` and then waits without ever
heartbeating it: the test SIGKILLs it there, between the ack and the first heartbeat.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

import anthropic


def _client(base_url: str, key: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=base_url, auth_token=key, max_retries=2)


async def serve(base_url: str, environment_id: str, *, workdir: str, max_idle: float) -> None:
    key = os.environ["ANTHROPIC_ENVIRONMENT_KEY"]
    worker = _client(base_url, key).beta.environments.work.worker(
        environment_id=environment_id,
        environment_key=key,
        workdir=workdir,
        max_idle=max_idle,
        worker_id=os.environ["WORKER_ID"],
    )
    await worker.run()


async def ack_and_wait(base_url: str, environment_id: str) -> None:
    key = os.environ["ANTHROPIC_ENVIRONMENT_KEY"]
    items = _client(base_url, key).beta.environments.work.poller(
        environment_id=environment_id, environment_key=key, worker_id=os.environ["WORKER_ID"], auto_stop=False
    )
    async for item in items:
        print(f"acked {item.id}", flush=True)
        await asyncio.Event().wait()  # until SIGKILL


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("serve", "ack"))
    parser.add_argument("base_url")
    parser.add_argument("environment_id")
    parser.add_argument("--workdir", default=os.getcwd())
    parser.add_argument("--max-idle", type=float, default=60.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    if args.mode == "serve":
        asyncio.run(serve(args.base_url, args.environment_id, workdir=args.workdir, max_idle=args.max_idle))
    else:
        asyncio.run(ack_and_wait(args.base_url, args.environment_id))


if __name__ == "__main__":
    main()
