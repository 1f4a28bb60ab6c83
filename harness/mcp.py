"""MCP tools: an agent's `mcp_toolset`s listed, offered to the model and called over streamable HTTP.

Names. The model sees an MCP tool as `mcp__<server>__<tool>` (the server being the agent's
`mcp_servers[].name`), the naming Claude's own MCP clients use. Names keep to the Messages API's
`[A-Za-z0-9_-]{1,64}`: a name that had to be changed or cut, or whose `__` could be read two ways, carries
a short hash of the pair instead, so two pairs never meet under one name. The log records what the API
defines: `agent.mcp_tool_use` with the tool's own `name` and its `mcp_server_name`; the exposed name is
recomputed from those two (`exposed_name`), so nothing about it has to be stored.

Listings are cached per session and server for `MCP_TOOLS_TTL_SECONDS` (short): a turn makes a model
request after every tool call, and listing a server each time would add a connection per request; per
session, because the proxy answers each session with that session's vault credentials, so two sessions
may be shown different tools by the same server. A failed listing is not cached.

Sessions with a server are kept open (`_Pool`): a brain process keeps a Workbench session's MCP session with
each server for `MCP_SESSION_IDLE_SECONDS` after its last use, so a call is one request (the tool call)
instead of six. It is a cache, not state: another process opens its own, and a session that fails or is
interrupted is dropped and the next request connects again.

Failures are `session.error`s (`mcp_connection_failed_error`: down, timed out, not speaking MCP, any other
HTTP error; `mcp_authentication_failed_error`: the server's 401/403), with `retry_status` "retrying": the
turn goes on, the model told that the call failed (or offered the other servers' tools when a listing
failed), and the next listing or call connects again.

The credential boundary: the harness never adds, holds or sees a credential. With
`settings.EGRESS_HARNESS_URL` set, every MCP request goes through the egress proxy's door for the workers
(plain http as absolute-form requests; https through a CONNECT tunnel, the proxy's CA, `EGRESS_CA_FILE`,
trusted for the intercepted TLS), speaking for the session with the identity `kernel.egress` defines, on each
plain request and on each CONNECT (never inside a tunnel, so the proxy ties the tunnel to it). The proxy
checks it (a 407 if wrong: the harness reports a connection error naming EGRESS_HARNESS_TOKEN), picks the
credential of the session's vaults whose `mcp_server_url` matches the request's URL (as `vault.rules`
normalises it), refreshes an expired `mcp_oauth` token, sets `Authorization: Bearer …` upstream, and takes
the token out of whatever comes back. Without a credential it forwards the request as it is, so the
server's own 401 comes back (`mcp_authentication_failed_error`). Without EGRESS_HARNESS_URL the harness
connects directly, and only servers that need no credential work.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import json
import re
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2
import mcp_types
from django.conf import settings
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from harness.tools import McpTarget, Tool
from kernel.egress import harness_authorization
from sessions import events

PREFIX = "mcp__"
MAX_NAME = 64
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
CONNECTION_FAILED = "mcp_connection_failed_error"
AUTHENTICATION_FAILED = "mcp_authentication_failed_error"


def exposed_name(server: str, tool: str) -> str:
    """The name the model calls (server, tool) by: deterministic, within the API's rule, unique per pair."""
    plain = f"{PREFIX}{server}__{tool}"
    safe = _UNSAFE.sub("_", plain)
    # Plain only when its one "__" between two non-underscores can be read back one way.
    unambiguous = (
        "__" not in server and "__" not in tool and not server.endswith("_") and not tool.startswith("_")
    )
    if safe == plain and len(plain) <= MAX_NAME and unambiguous:
        return plain
    digest = hashlib.sha256(f"{server}\0{tool}".encode()).hexdigest()[:8]
    return f"{safe[: MAX_NAME - 9]}_{digest}"


def exposed_name_of(use: Any) -> str:
    """The name the model used for a recorded call (an `agent.mcp_tool_use` or any other tool use)."""
    payload = use.payload
    if use.type == "agent.mcp_tool_use":
        return exposed_name(payload["mcp_server_name"], payload["name"])
    return str(payload["name"])


# -- the agent's configuration


def servers(agent: dict[str, Any]) -> dict[str, str]:
    """The agent's MCP servers that an mcp_toolset uses: name -> URL."""
    urls = {server["name"]: server["url"] for server in agent.get("mcp_servers") or []}
    used = {entry["mcp_server_name"] for entry in agent.get("tools") or [] if entry["type"] == "mcp_toolset"}
    return {name: url for name, url in urls.items() if name in used}


def _toolset(agent: dict[str, Any], server: str) -> dict[str, Any] | None:
    return next(
        (
            entry
            for entry in agent.get("tools") or []
            if entry["type"] == "mcp_toolset" and entry["mcp_server_name"] == server
        ),
        None,
    )


def permission(agent: dict[str, Any], server: str, tool: str) -> str | None:
    """ "allow" or "ask" for the server's tool as the toolset configures it; None when it is not enabled."""
    toolset = _toolset(agent, server)
    if toolset is None:
        return None
    config = next((c for c in toolset["configs"] if c["name"] == tool), toolset["default_config"])
    if not config["enabled"]:
        return None
    return "ask" if config["permission_policy"]["type"] == "always_ask" else "allow"


def recorded_tool(agent: dict[str, Any], use: Any) -> Tool | None:
    """The tool a recorded `agent.mcp_tool_use` calls, from the agent alone (no listing): what deciding on a
    logged call (confirm, run, close) needs. None when the agent no longer has that server or tool enabled.
    The call keeps the permission it was recorded with, as `pending` reads it, whatever the agent says now."""
    server, name = use.payload["mcp_server_name"], use.payload["name"]
    url = servers(agent).get(server)
    policy = permission(agent, server, name)
    if url is None or policy is None:
        return None
    recorded = use.payload.get("evaluated_permission")
    if recorded in ("allow", "ask"):
        policy = recorded
    exposed = exposed_name(server, name)
    definition = {"name": exposed, "input_schema": {"type": "object"}}
    return Tool(exposed, "mcp", definition, policy, mcp=McpTarget(server, url, name))


# -- failures


class McpFailure(Exception):
    """A server could not be listed or called: what the `session.error` says. Never carries a secret: the
    messages are ours, with the server's HTTP status at most."""

    def __init__(self, kind: str, server: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.server = server
        self.message = message

    def event(self) -> dict[str, Any]:
        # "retrying": the turn goes on (the model is told, or goes without the server's tools), and the next
        # listing or call connects again, as the API's repository errors let a session go on without a repo.
        return events.session_error(self.kind, self.message, retry="retrying", mcp_server_name=self.server)


@dataclass
class _Seen:
    """What the HTTP layer saw of the server (the MCP SDK turns a status into a generic JSON-RPC error)."""

    status: int | None = None
    refused_by_proxy: bool = False

    async def response(self, response: httpx2.Response) -> None:
        if response.status_code >= 400 and self.status is None:
            self.status = response.status_code
            self.refused_by_proxy = "x-workbench-egress" in response.headers


def _failure(server: str, seen: _Seen, error: BaseException | None) -> McpFailure:
    status = seen.status
    text = f"{type(error).__name__}: {error}" if error is not None else ""
    if status is None and "407" in text:
        status = 407
    proxied = bool(settings.EGRESS_HARNESS_URL)
    if status == 407:
        return McpFailure(
            CONNECTION_FAILED,
            server,
            f"The egress proxy refused the harness's identity for MCP server {server!r} (HTTP 407); "
            "check EGRESS_HARNESS_TOKEN.",
        )
    if status in (401, 403) and not seen.refused_by_proxy:
        if proxied:
            why = "the session's vaults hold no valid credential for its URL, or the server refused it"
        else:
            why = "the egress proxy is not configured (EGRESS_HARNESS_URL), so no vault credential can be attached"
        return McpFailure(
            AUTHENTICATION_FAILED,
            server,
            f"MCP server {server!r} refused the request (HTTP {status}): {why}.",
        )
    if seen.refused_by_proxy:
        return McpFailure(
            CONNECTION_FAILED,
            server,
            f"The egress proxy refused the request to MCP server {server!r} (HTTP {status}).",
        )
    if status is not None:
        return McpFailure(CONNECTION_FAILED, server, f"MCP server {server!r} answered HTTP {status}.")
    if isinstance(error, TimeoutError):
        return McpFailure(
            CONNECTION_FAILED,
            server,
            f"MCP server {server!r} did not answer within {settings.MCP_TIMEOUT_SECONDS:g} s.",
        )
    route = " through the egress proxy" if proxied else ""
    return McpFailure(
        CONNECTION_FAILED, server, f"Could not talk to MCP server {server!r}{route}: {_short(text)}"
    )


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


# -- talking to a server


def _http_client(session_id: str, seen: _Seen) -> httpx2.AsyncClient:
    timeout = httpx2.Timeout(settings.MCP_TIMEOUT_SECONDS)
    options: dict[str, Any] = {
        "timeout": timeout,
        "trust_env": False,  # the route out is the proxy setting, never an inherited HTTP(S)_PROXY
        "event_hooks": {"response": [seen.response]},
    }
    if settings.EGRESS_HARNESS_URL:
        options["proxy"] = httpx2.Proxy(
            settings.EGRESS_HARNESS_URL, headers={"Proxy-Authorization": harness_authorization(session_id)}
        )
        if settings.EGRESS_CA_FILE:
            options["verify"] = ssl.create_default_context(cafile=settings.EGRESS_CA_FILE)
    return httpx2.AsyncClient(**options)


Work = Callable[[ClientSession], Any]


@dataclass
class _Request:
    work: Work
    done: asyncio.Future[Any]
    seen: _Seen


class _Connection:
    """One MCP session with a server, for one Workbench session, kept open between calls on the pool's loop.

    A task of its own enters the client's contexts (anyio's scopes must be left by the task that entered
    them), serves requests one at a time, and closes after MCP_SESSION_IDLE_SECONDS without one, or at the
    first request that fails or is cancelled: the next request connects again."""

    def __init__(self, key: tuple[str, ...], session_id: str, url: str, pool: _Pool):
        self.key, self.session_id, self.url, self.pool = key, session_id, url, pool
        self.requests: asyncio.Queue[_Request] = asyncio.Queue()
        self.seen = _Seen()
        self.open = True

    async def serve(self) -> None:
        first = await self.requests.get()
        try:
            async with contextlib.AsyncExitStack() as stack:
                self.seen = first.seen
                # Connecting and initializing, within the one call's time (ours, not the SDK's read timeout,
                # which is set past it, so a slow server says how long it was given).
                async with asyncio.timeout(settings.MCP_TIMEOUT_SECONDS):
                    client = await stack.enter_async_context(_http_client(self.session_id, _Relay(self)))
                    read, write = await stack.enter_async_context(
                        streamable_http_client(self.url, http_client=client)
                    )
                    session = await stack.enter_async_context(
                        ClientSession(read, write, read_timeout_seconds=settings.MCP_TIMEOUT_SECONDS + 5)
                    )
                    await session.initialize()
                request: _Request | None = first
                while request is not None:
                    self.seen = request.seen
                    if not await self._answer(session, request):
                        break
                    request = await self._next()
        except BaseException as error:  # noqa: BLE001 - connecting failed: the waiting request says why
            if not first.done.done():
                first.done.set_exception(error if isinstance(error, Exception) else RuntimeError(str(error)))
            if not isinstance(error, Exception):
                raise
        finally:
            self.close()

    async def _answer(self, session: ClientSession, request: _Request) -> bool:
        """Run one request; False when the connection should not serve another."""
        if request.done.cancelled():
            return True
        work = asyncio.ensure_future(request.work(session))
        request.done.add_done_callback(lambda done: work.cancel() if done.cancelled() else None)
        try:
            value = await asyncio.wait_for(work, settings.MCP_TIMEOUT_SECONDS)
        except BaseException as error:  # noqa: BLE001 - handed to the caller, and the connection dropped
            if not request.done.done():  # not the caller's cancel: the session broke under the call
                request.done.set_exception(
                    error
                    if isinstance(error, Exception)
                    else ConnectionResetError("the MCP session with the server ended during the call")
                )
            if isinstance(error, asyncio.CancelledError) and asyncio.current_task().cancelling():  # type: ignore[union-attr]
                raise  # the connection itself is being cancelled (the pool's loop is closing)
            return False
        if not request.done.done():
            request.done.set_result(value)
        return True

    async def _next(self) -> _Request | None:
        try:
            return await asyncio.wait_for(self.requests.get(), settings.MCP_SESSION_IDLE_SECONDS)
        except TimeoutError:
            return None

    def close(self) -> None:
        self.open = False
        self.pool.forget(self)
        while not self.requests.empty():  # asked for while it closed: they connect again
            self.pool.resubmit(self.key, self.session_id, self.url, self.requests.get_nowait())


class _Relay(_Seen):
    """The HTTP client's response hook, for whichever request the connection serves now."""

    def __init__(self, connection: _Connection):
        super().__init__()
        self.connection = connection

    async def response(self, response: httpx2.Response) -> None:
        await self.connection.seen.response(response)


class _Pool:
    """The process's open MCP sessions, on one event loop in a thread of their own: a call on a session that
    is open is one request (the tool call) instead of six (initialize and its notification, the SDK's GET
    stream, the call, the listing the SDK adds to check the result, the session's end), through the egress
    proxy or not. The credential is the proxy's to add on each request, so a changed one applies at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connections: dict[tuple[str, ...], _Connection] = {}

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="mcp-sessions", daemon=True).start()
                self._loop = loop
            return self._loop

    def forget(self, connection: _Connection) -> None:
        if self._connections.get(connection.key) is connection:
            del self._connections[connection.key]

    def resubmit(self, key: tuple[str, ...], session_id: str, url: str, request: _Request) -> None:
        self._submit(key, session_id, url, request)

    def _submit(self, key: tuple[str, ...], session_id: str, url: str, request: _Request) -> None:
        """On the loop: hand `request` to the key's open connection, opening one if there is none."""
        connection = self._connections.get(key)
        if connection is None or not connection.open:
            connection = self._connections[key] = _Connection(key, session_id, url, self)
            asyncio.ensure_future(connection.serve())
        connection.requests.put_nowait(request)

    def run(
        self,
        session_id: str,
        server: str,
        url: str,
        work: Work,
        cancelled: Callable[[], bool] | None,
        seen: _Seen,
    ) -> Any:
        """`work(session)` on the session's open MCP session with the server, from a brain's thread;
        `cancelled` is polled, so an interrupt stops a call midway."""
        loop = self._running_loop()
        key = (
            session_id,
            server,
            url,
            settings.EGRESS_HARNESS_URL,
            settings.EGRESS_HARNESS_TOKEN,
            settings.EGRESS_CA_FILE,
        )

        async def submit() -> Any:
            request = _Request(work, loop.create_future(), seen)
            self._submit(key, session_id, url, request)
            return await request.done

        future = asyncio.run_coroutine_threadsafe(submit(), loop)
        deadline = time.monotonic() + 2 * settings.MCP_TIMEOUT_SECONDS + 5
        while True:
            try:
                return future.result(timeout=0.1)
            except concurrent.futures.TimeoutError:
                if cancelled is not None and cancelled():
                    future.cancel()
                    raise Interrupted() from None
                if time.monotonic() > deadline:
                    future.cancel()
                    raise TimeoutError() from None

    def close_all(self) -> None:
        """Close every open session (tests; a process about to exit needs none of this)."""
        loop = self._loop
        if loop is None:
            return

        async def close() -> None:
            for connection in list(self._connections.values()):
                connection.requests.put_nowait(_Request(_closing, loop.create_future(), _Seen()))

        asyncio.run_coroutine_threadsafe(close(), loop).result(5)


async def _closing(session: ClientSession) -> Any:
    raise ConnectionResetError("closed by the pool")


pool = _Pool()


def _run(
    session_id: str,
    server: str,
    url: str,
    work: Work,
    *,
    cancelled: Callable[[], bool] | None = None,
) -> Any:
    """`work(session)` on the session's MCP session with the server (kept open between calls, `_Pool`),
    from synchronous code (a brain's thread). Raises McpFailure, or Interrupted."""
    seen = _Seen()
    try:
        return pool.run(session_id, server, url, work, cancelled, seen)
    except Interrupted:
        raise
    except concurrent.futures.CancelledError:
        raise Interrupted() from None
    except Exception as error:  # noqa: BLE001 - whatever broke (network, server, its answer) is classified
        raise _failure(server, seen, _leaf(error)) from error


class Interrupted(Exception):
    """The call was stopped by a user.interrupt or the lease's loss before it finished."""


def _leaf(error: BaseException) -> BaseException:
    """The first real error inside the task groups' exception groups."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def list_tools(session_id: str, server: str, url: str) -> list[dict[str, Any]]:
    """The server's tools, as `{"name", "description", "input_schema"}`. Raises McpFailure."""

    async def work(session: ClientSession) -> list[dict[str, Any]]:
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            params = None if cursor is None else mcp_types.PaginatedRequestParams(cursor=cursor)
            page = await session.list_tools(params=params)
            tools.extend(
                {"name": t.name, "description": t.description or "", "input_schema": t.input_schema}
                for t in page.tools
            )
            cursor = page.next_cursor
            if not cursor:
                return tools

    return list(_run(session_id, server, url, work))


def call_tool(
    session_id: str, target: McpTarget, arguments: dict[str, Any], *, cancelled: Callable[[], bool]
) -> tuple[list[dict[str, Any]], bool]:
    """Call the tool: the result's content as the log's blocks, and whether the tool said it failed. Raises
    McpFailure when the server cannot be reached or answers something that is not a tool result."""

    async def work(session: ClientSession) -> Any:
        return await session.call_tool(target.tool, arguments)

    result = _run(session_id, target.server, target.url, work, cancelled=cancelled)
    content = [_block(item.model_dump(mode="json", by_alias=True)) for item in result.content]
    if not content and result.structured_content is not None:
        content = [{"type": "text", "text": json.dumps(result.structured_content)}]
    return _capped(content) or [{"type": "text", "text": "(no output)"}], bool(result.is_error)


def _capped(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """At most MCP_RESULT_MAX_CHARS of text and image data: a result goes into the log and every later
    model request, as the toolbox caps a command's output."""
    limit = settings.MCP_RESULT_MAX_CHARS
    kept: list[dict[str, Any]] = []
    used = 0
    for block in content:
        size = len(block["text"]) if block["type"] == "text" else len(str(block["source"].get("data") or ""))
        if used + size > limit:
            note = f"[the rest of this result was cut: it passed {limit} characters]"
            if block["type"] == "text" and limit > used:
                kept.append({"type": "text", "text": block["text"][: limit - used] + "\n" + note})
            else:
                kept.append({"type": "text", "text": note})
            return kept
        used += size
        kept.append(block)
    return kept


def _block(item: dict[str, Any]) -> dict[str, Any]:
    """An MCP content item as a block the log and the Messages API take (text and images; others as text)."""
    if item.get("type") == "text":
        return {"type": "text", "text": item.get("text", "")}
    if item.get("type") == "image":
        return {
            "type": "image",
            "source": {"type": "base64", "media_type": item.get("mimeType"), "data": item.get("data")},
        }
    if item.get("type") == "resource" and isinstance(item.get("resource"), dict):
        resource = item["resource"]
        if "text" in resource:
            return {"type": "text", "text": f"[resource {resource.get('uri', '')}]\n{resource['text']}"}
    if item.get("type") == "resource_link":
        return {
            "type": "text",
            "text": f"[resource link {item.get('uri', '')}] {item.get('name', '')}".strip(),
        }
    return {"type": "text", "text": f"[{item.get('type', 'content')} content the model cannot read]"}


# -- the listing cache, and the tools a model request offers


@dataclass
class _Listings:
    entries: dict[tuple[str, str, str], tuple[float, list[dict[str, Any]]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, key: tuple[str, str, str]) -> list[dict[str, Any]] | None:
        with self.lock:
            entry = self.entries.get(key)
            if entry is None or entry[0] < time.monotonic():
                self.entries.pop(key, None)
                return None
            return entry[1]

    def put(self, key: tuple[str, str, str], tools: list[dict[str, Any]]) -> None:
        with self.lock:
            now = time.monotonic()
            self.entries = {k: v for k, v in self.entries.items() if v[0] >= now}
            self.entries[key] = (now + settings.MCP_TOOLS_TTL_SECONDS, tools)

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()


listings = _Listings()


def model_tools(
    session_id: str, agent: dict[str, Any], *, on_failure: Callable[[McpFailure], object]
) -> dict[str, Tool]:
    """The agent's enabled MCP tools, by exposed name, for one model request. A server that cannot be listed
    is reported through `on_failure` and left out, and the request goes on with the rest."""
    tools: dict[str, Tool] = {}
    for server, url in servers(agent).items():
        key = (session_id, server, url)
        listed = listings.get(key)
        if listed is None:
            try:
                listed = list_tools(session_id, server, url)
            except McpFailure as failure:
                on_failure(failure)
                continue
            listings.put(key, listed)
        for entry in listed:
            policy = permission(agent, server, entry["name"])
            if policy is None:
                continue
            exposed = exposed_name(server, entry["name"])
            schema = entry["input_schema"] if isinstance(entry["input_schema"], dict) else {"type": "object"}
            definition = {
                "name": exposed,
                "description": entry["description"] or f"{entry['name']} (MCP server {server})",
                "input_schema": schema,
            }
            tools[exposed] = Tool(
                exposed, "mcp", definition, policy, mcp=McpTarget(server, url, entry["name"])
            )
    return tools


def mcp_tool_use(target: McpTarget, value: dict[str, Any], permission: str) -> dict[str, Any]:
    return {
        "type": "agent.mcp_tool_use",
        "name": target.tool,
        "mcp_server_name": target.server,
        "input": value,
        "evaluated_permission": permission,
        "evaluation": {"type": "always_ask" if permission == "ask" else "always_allow"},
    }


def mcp_tool_result(use_id: str, content: list[dict[str, Any]], *, is_error: bool) -> dict[str, Any]:
    return {
        "type": "agent.mcp_tool_result",
        "mcp_tool_use_id": use_id,
        "content": content,
        "is_error": is_error,
    }
