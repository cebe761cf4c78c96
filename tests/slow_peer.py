"""A slow HTTP peer in a process of its own: every request is answered after DELAY seconds.

`python -m tests.slow_peer DELAY` prints its port, then serves on 127.0.0.1 until killed. It
is asyncio, so thousands of requests can wait at once without a thread each, and being another
process it never competes with the replica under test for the GIL. The most requests it held
at once is answered at ``GET /stats``. ``POST .../chat/completions`` gets an OpenAI-compatible
answer, so it stands in for a slow model provider too.
"""

from __future__ import annotations

import asyncio
import json
import sys

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
            if lines[0].startswith("GET /stats"):
                body = json.dumps({"most": most, "served": served, "inFlight": in_flight}).encode()
            else:
                in_flight += 1
                most = max(most, in_flight)
                await asyncio.sleep(delay)
                in_flight -= 1
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
    server = await asyncio.start_server(
        lambda r, w: handle(r, w, delay), "127.0.0.1", 0, backlog=8192
    )
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(float(sys.argv[1])))
