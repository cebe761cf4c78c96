"""An MCP server for the tests, written with the official ``mcp`` SDK: a notes store.

Every call is appended as one JSON line to ``$NOTES_LOG`` (the tool, its arguments, the
request's ``_meta`` and this process's pid), so a test counts the calls a server received,
which key each carried, and which process served it. ``crash`` exits the process mid-call.
Run it over stdio (``python -m tests.mcp.notes_server``) or streamable HTTP (``--http PORT``).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("notes")
NOTES: list[str] = []


def _log(tool: str, args: dict[str, Any], ctx: Context) -> None:
    path = os.environ.get("NOTES_LOG")
    if not path:
        return
    meta = ctx.request_context.meta
    line = {"tool": tool, "args": args, "meta": dict(meta or {}), "pid": os.getpid()}
    with open(path, "a") as out:
        out.write(json.dumps(line, default=str) + "\n")


@server.tool()
def add(text: str, ctx: Context) -> dict[str, Any]:
    """Add a note; answers how many notes there are."""
    _log("add", {"text": text}, ctx)
    NOTES.append(text)
    return {"count": len(NOTES), "text": text}


@server.tool()
def search(query: str, ctx: Context, limit: int = 5) -> list[str]:
    """Notes containing the query, newest first."""
    _log("search", {"query": query, "limit": limit}, ctx)
    return [n for n in reversed(NOTES) if query in n][:limit]


@server.tool()
def crash(ctx: Context) -> str:
    """Exit the server process at once (a server that dies)."""
    _log("crash", {}, ctx)
    os._exit(3)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
