"""An MCP server for the isolation tests, written with the official ``mcp`` SDK: it tells its
environment, and holds a call long with a child process of its own. Each call is appended as a
JSON line (the tool, this process's pid and the child's) to ``$NOTES_LOG``. Run it over stdio:
``python -m tests.mcp.probe_server``."""

from __future__ import annotations

import json
import os
import subprocess
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("probe")


def _log(tool: str, **more: int) -> None:
    path = os.environ.get("NOTES_LOG")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps({"tool": tool, "pid": os.getpid(), **more}) + "\n")


@server.tool()
def environment() -> dict[str, str]:
    """This process's environment and working folder (``PWD`` is the folder)."""
    _log("environment")
    return {**os.environ, "PWD": os.getcwd()}


@server.tool()
def hold(seconds: float) -> str:
    """Answer after ``seconds``: a long call, in a thread that finishes it even once stdin has
    closed, as many servers do, with a child process that works as long (a server's helper
    that no parent-death signal of the server's reaches)."""
    child = subprocess.Popen(["sleep", str(seconds)])
    _log("hold", child=child.pid)
    time.sleep(seconds)
    child.wait()
    return "held"


if __name__ == "__main__":
    server.run()
