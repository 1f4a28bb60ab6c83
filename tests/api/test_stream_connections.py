"""An open SSE stream holds none of its process's pooled database connections (found by bench/load.py: with the
pool's default of 40, about 35 open streams left every other request of that Daphne waiting 30 s and failing)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from bench.common.processes import daphne
from tests.conftest import ROOT, child_env, make_agent, make_environment

pytestmark = pytest.mark.server

POOL_MAX = 3
STREAMS = 3 * POOL_MAX


async def _open_streams(url: str, key: str, session_ids: list[str]) -> list[str]:
    """Open a stream on each session at once, keep them all open, and say how each one started."""
    outcomes: list[str] = []
    opened = asyncio.Event()
    async with httpx.AsyncClient(
        headers={"x-api-key": key},
        timeout=httpx.Timeout(30, read=None),
        limits=httpx.Limits(max_connections=None),
    ) as client:

        async def follow(session_id: str) -> None:
            try:
                async with client.stream("GET", f"{url}/v1/sessions/{session_id}/events/stream") as response:
                    if response.status_code != 200:
                        outcomes.append(f"answered {response.status_code}")
                        return
                    async for line in response.aiter_lines():
                        if line == "event: ping":
                            outcomes.append("pinged")
                            await opened.wait()  # held open until every stream has started
                            return
            except httpx.HTTPError as failed:
                outcomes.append(type(failed).__name__)

        tasks = [asyncio.create_task(follow(s)) for s in session_ids]
        deadline = time.monotonic() + 20
        while len(outcomes) < len(session_ids) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        # With every stream still open, an ordinary request of the same process is served at once.
        answer = await client.get(f"{url}/v1/sessions/{session_ids[0]}", timeout=5)
        outcomes.append(f"GET while they are open: {answer.status_code}")
        opened.set()
        await asyncio.gather(*tasks)
    return outcomes


def test_more_open_streams_than_the_database_pool_holds_all_start_and_other_requests_are_served(
    transactional_db, redis_url, api_key
):
    env = child_env(DATABASE_POOL_MAX=str(POOL_MAX), DATABASE_POOL_MIN="1", DATABASE_POOL_TIMEOUT="3")
    with daphne(env, ROOT / ".pytest-daphne-pool.log", timeout=90) as url:
        session_ids = []
        for _ in range(STREAMS):
            made = httpx.post(
                f"{url}/v1/sessions",
                headers={"x-api-key": api_key},
                json={"agent": make_agent(), "environment_id": make_environment()},
                timeout=30,
            )
            assert made.status_code == 200, made.text
            session_ids.append(made.json()["id"])
        outcomes = asyncio.run(_open_streams(url, api_key, session_ids))
    assert outcomes.count("pinged") == STREAMS, outcomes
    assert outcomes[-1] == "GET while they are open: 200", outcomes
