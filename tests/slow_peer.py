"""A slow HTTP peer in a process of its own: every request is answered after DELAY seconds.

`python -m tests.slow_peer DELAY` prints its port, then serves on 127.0.0.1 until killed. It
is asyncio, so thousands of requests can wait at once without a thread each, and being another
process it never competes with the replica under test for the GIL. The most requests it held
at once is answered at ``GET /stats``, overall and per path (``mostByPath``).
``POST .../chat/completions`` gets an OpenAI-compatible answer, so it stands in for a slow model
provider too.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]

# An OpenAI-compatible answer, so the peer also stands in for a slow model provider.
CHAT = json.dumps(
    {
        "id": "chatcmpl-slow",
        "object": "chat.completion",
        "created": 0,
        "model": "slow",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
    }
).encode()
in_flight = 0
most = 0
served = 0
in_flight_by: dict[str, int] = {}
most_by: dict[str, int] = {}
# Closed by ``POST /hold``: requests that come are held (in flight) until ``POST /release``,
# then answered after the delay, so a test can act while it knows a call is in flight.
gate: asyncio.Event | None = None


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    global in_flight, most, served
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            if length:
                await reader.readexactly(length)
            path = lines[0].split(" ")[1].partition("?")[0]
            assert gate is not None
            if lines[0].startswith("GET /stats"):
                stats = {
                    "most": most,
                    "served": served,
                    "inFlight": in_flight,
                    "mostByPath": most_by,
                    "inFlightByPath": in_flight_by,
                }
                body = json.dumps(stats).encode()
            elif lines[0].startswith(("POST /hold ", "POST /release ")):
                (gate.clear if path == "/hold" else gate.set)()
                body = b"{}"
            else:
                in_flight += 1
                most = max(most, in_flight)
                in_flight_by[path] = in_flight_by.get(path, 0) + 1
                most_by[path] = max(most_by.get(path, 0), in_flight_by[path])
                await gate.wait()
                await asyncio.sleep(delay)
                in_flight -= 1
                in_flight_by[path] -= 1
                served += 1
                body = CHAT if "/chat/completions" in lines[0] else b'{"ok": true}'
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main(delay: float) -> None:
    global gate
    gate = asyncio.Event()
    gate.set()
    server = await asyncio.start_server(
        lambda r, w: handle(r, w, delay), "127.0.0.1", 0, backlog=8192
    )
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


class SlowPeer:
    """This module in a process of its own, answering after ``delay`` seconds."""

    def __init__(self, delay: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.slow_peer", str(delay)],
            stdout=subprocess.PIPE,
            cwd=ROOT,
            text=True,
        )
        assert self.proc.stdout is not None
        self.url = f"http://127.0.0.1:{int(self.proc.stdout.readline())}"

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = httpx.get(f"{self.url}/stats", timeout=10).json()
        return stats

    def hold(self) -> None:
        """Hold the requests that come from now on in flight, until ``release``."""
        httpx.post(f"{self.url}/hold", timeout=10).raise_for_status()

    def release(self) -> None:
        httpx.post(f"{self.url}/release", timeout=10).raise_for_status()

    @property
    def most(self) -> int:
        return int(self.stats()["most"])

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


if __name__ == "__main__":
    asyncio.run(main(float(sys.argv[1])))
