"""Model Context Protocol servers' tools as Lantern tools (docs/integrations.md), through the
official ``mcp`` SDK.

``app.mcp("notes", command=[...])`` (stdio) or ``app.mcp("search", url=...)`` (streamable
HTTP) registers a server; its tools become Lantern tools named ``notes.<tool>``, each with the
server's own JSON schema and description. A call runs as a step like any tool's (journaled,
never re-sent once completed) and carries the step's idempotency key in the request's
``_meta`` (``lantern/idempotencyKey``), so a server can de-duplicate the one call a crash may
repeat: the step that was in flight.

A server is started (or connected to) once per process, on first use, and shared by every
run; its connection lives in a task of its own, since the SDK's transports must be closed by
the task that opened them. Before each call the connection is checked with a ping: a server
that died since the last call is started again, so a crash between calls costs nothing. A
server that cannot be reached, or dies during a call, fails the step with class ``tool``,
retryable (whether a call cut off mid-way took effect is the server's to know: it has the key).

Only the application's code names these servers (commands and URLs are the operator's), so the
egress policy on tenant-controlled URLs does not apply to them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sys
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack, suppress
from dataclasses import dataclass
from typing import Any

from lantern.errors import StepError, ToolUnavailable, UsageError

log = logging.getLogger("lantern.mcp")

KEY_META = "lantern/idempotencyKey"
CONNECT_TIMEOUT_S = 30.0
PING_TIMEOUT_S = 5.0
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

# What a stdio server inherits of this process's environment: where programs are, the home
# folder, the locale and the terminal; never LANTERN_*, a provider's key or anything else.
INHERITED = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "TZ", "TMPDIR", "LANG", "LANGUAGE"}
)

# Run as ``python -c _GUARD PARENT_PID COMMAND...``, a process group of its own (the SDK starts
# it in a new session; setsid makes sure). A parent-death signal reaches only the process that
# asked for it, never what that process started, so the guard does not become the server: it
# asks the kernel for SIGTERM when the thread that started it ends (PR_SET_PDEATHSIG), makes
# sure that parent is still the one that asked (it may have died before the request), starts
# the server as its child and waits. When the parent dies, or the server ends, it SIGKILLs its
# whole process group: the server and every process the server started (one that leaves the
# group on purpose, with setsid, is the server's own doing). A SIGKILLed `lantern serve` so
# takes its servers and their helpers with it, mid-call or not.
_GUARD = (
    "import ctypes, os, signal, sys\n"
    "try:\n"
    "    os.setsid()\n"
    "except OSError:\n"
    "    pass\n"
    "def end(*_):\n"
    "    if os.getpgid(0) == os.getpid():\n"
    "        os.killpg(0, signal.SIGKILL)\n"
    "    os._exit(1)\n"
    "signal.signal(signal.SIGTERM, end)\n"
    "signal.signal(signal.SIGHUP, end)\n"
    "if sys.platform.startswith('linux'):\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    end()\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    signal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
    "    signal.signal(signal.SIGHUP, signal.SIG_DFL)\n"
    "    try:\n"
    "        os.execvp(sys.argv[2], sys.argv[2:])\n"
    "    finally:\n"
    "        os._exit(127)\n"
    "null = os.open(os.devnull, os.O_RDWR)\n"
    "os.dup2(null, 0)\n"
    "os.dup2(null, 1)\n"  # the server's pipes are the server's: its end is seen at once
    "os.waitpid(pid, 0)\n"
    "end()\n"
)


def allowed_environment() -> dict[str, str]:
    """The part of this process's environment a stdio MCP server is given (INHERITED and the
    locale's LC_* variables)."""
    return {
        k: v
        for k, v in os.environ.items()
        if (k in INHERITED or k.startswith("LC_")) and not v.startswith("()")
    }


@dataclass(frozen=True)
class McpTool:
    """One tool a server lists: ``name`` as the server knows it."""

    server: str
    name: str
    description: str
    schema: Mapping[str, Any]  # the JSON schema of its arguments

    @property
    def qualified(self) -> str:
        return f"{self.server}.{self.name}"


class _Connection:
    """One live session with the server, held open by ``task``."""

    def __init__(self) -> None:
        self.session: Any = None  # mcp.ClientSession once initialised
        self.closing = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def close(self) -> None:
        self.closing.set()
        if self.task is not None:
            with suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self.task, 10)


class McpServer:
    """A registered MCP server: how to reach it, and its connection in this process."""

    def __init__(
        self,
        name: str,
        *,
        command: Sequence[str] | None = None,
        url: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> None:
        if not _NAME.match(name):
            raise UsageError(
                f"MCP server name {name!r}: use letters, digits, '_' or '-' (its tools are"
                f" named {name}.<tool>)"
            )
        if (command is None) == (url is None):
            raise UsageError(f"MCP server {name!r}: give command=[...] (stdio) or url=...")
        if command is not None and (isinstance(command, str) or not command):
            raise UsageError(f"MCP server {name!r}: command is a list, such as ['python', 's.py']")
        if url is not None and not url.startswith(("http://", "https://")):
            raise UsageError(f"MCP server {name!r}: url must start with http:// or https://")
        self.name = name
        self.command = None if command is None else [str(c) for c in command]
        self.url = url
        self.env = None if env is None else dict(env)
        self.cwd = cwd
        self.tools: dict[str, McpTool] = {}  # by tool name, once connected
        self.starts = 0  # how many times this process started or connected to it
        self._conn: _Connection | None = None
        self._lock: asyncio.Lock | None = None

    def __repr__(self) -> str:
        where = " ".join(self.command) if self.command else self.url
        return f"McpServer({self.name!r}, {where!r})"

    async def connect(self) -> dict[str, McpTool]:
        """The server's tools, starting or reconnecting to it when it is not live."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            conn = self._conn
            if conn is not None and conn.session is not None and not conn.closing.is_set():
                if await self._alive(conn):
                    return self.tools
                log.warning("MCP server %r stopped answering; starting it again", self.name)
            if conn is not None:
                await conn.close()
                self._conn = None
            self._conn = await self._open()
            return self.tools

    async def _alive(self, conn: _Connection) -> bool:
        try:
            await asyncio.wait_for(conn.session.send_ping(), PING_TIMEOUT_S)
        except Exception:
            return False
        return True

    async def _open(self) -> _Connection:
        conn = _Connection()
        ready: asyncio.Future[list[McpTool]] = asyncio.get_running_loop().create_future()
        conn.task = asyncio.create_task(self._hold(conn, ready), name=f"mcp {self.name}")
        try:
            listed = await asyncio.wait_for(asyncio.shield(ready), CONNECT_TIMEOUT_S)
        except BaseException as exc:
            await conn.close()
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise self._down(exc) from exc
        self.tools = {t.name: t for t in listed}
        self.starts += 1
        return conn

    async def _hold(self, conn: _Connection, ready: asyncio.Future[list[McpTool]]) -> None:
        from mcp import ClientSession

        try:
            async with AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport())
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                listed = await _list_tools(self.name, session)
                conn.session = session
                ready.set_result(listed)
                await conn.closing.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(exc))
            elif not isinstance(exc, asyncio.CancelledError):
                log.warning("MCP server %r: connection ended: %s", self.name, _describe(exc))
        finally:
            conn.session = None
            conn.closing.set()

    def _transport(self) -> Any:
        if self.command is not None:
            from mcp import StdioServerParameters, stdio_client

            # Started through a guard that takes the server's process group with it when
            # this process dies (_GUARD), with only the allow-listed environment and env=.
            params = StdioServerParameters(
                command=sys.executable,
                args=["-c", _GUARD, str(os.getpid()), *self.command],
                env={**allowed_environment(), **(self.env or {})},
                cwd=self.cwd,
            )
            return stdio_client(params)
        from mcp.client.streamable_http import streamable_http_client

        assert self.url is not None
        return streamable_http_client(self.url)

    async def call(self, tool: str, arguments: Mapping[str, Any], key: str) -> Any:
        """Call ``tool`` with the step's idempotency key in ``_meta``; its result as JSON."""
        await self.connect()
        conn = self._conn
        if conn is None or conn.session is None:
            raise self._down(RuntimeError("no connection"))
        try:
            # No timeout of its own: the step's (its node's, its agent's or
            # LANTERN_STEP_TIMEOUT) cancels the call.
            result = await conn.session.call_tool(tool, dict(arguments), meta={KEY_META: key})
        except Exception as exc:
            # The server died, hung or broke the protocol mid-call: whether the call took
            # effect is unknown here, so the step fails retryable and keeps its key.
            conn.closing.set()
            raise ToolUnavailable(
                f"MCP server {self.name!r}: tool {tool!r} got no answer: {_describe(exc)}"
            ) from exc
        return _result(self.name, tool, result)

    def _down(self, exc: BaseException) -> ToolUnavailable:
        where = " ".join(self.command) if self.command else self.url
        return ToolUnavailable(f"MCP server {self.name!r} ({where}) is down: {_describe(exc)}")

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()


async def _list_tools(server: str, session: Any) -> list[McpTool]:
    out: list[McpTool] = []
    cursor: str | None = None
    for _ in range(100):  # a server that pages forever cannot hang the start
        page = await session.list_tools(cursor=cursor) if cursor else await session.list_tools()
        for t in page.tools:
            schema = dict(t.input_schema or {"type": "object"})
            out.append(McpTool(server, t.name, t.description or "", schema))
        cursor = getattr(page, "next_cursor", None)
        if not cursor:
            break
    return out


def _result(server: str, tool: str, result: Any) -> Any:
    """A call's result as the step's JSON output: the structured content when the server
    gives one, else the text of its content (one block: its text alone)."""
    if result.is_error:
        text = " ".join(getattr(c, "text", "") for c in result.content).strip()
        raise StepError(
            f"MCP tool {server}.{tool} failed: {text or 'an error with no message'}",
            error_class="tool",
            retryable=True,
        )
    if result.structured_content is not None:
        return result.structured_content
    texts = [c.text for c in result.content if getattr(c, "type", None) == "text"]
    if len(texts) == len(result.content):
        return texts[0] if len(texts) == 1 else texts
    return [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in result.content]


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _describe(exc.exceptions[0])
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
