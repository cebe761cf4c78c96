"""One client process of a load test: POST /v1/runs for every entry of a plan, all at once.

    python tests/api/load_client.py URL KEY PLAN.json

PLAN.json is a list of ``{"idempotencyKey": ..., "agentName": ..., "input": ...}``. The process
opens one connection per entry, prints ``ready`` and waits for a line on stdin (so that several
processes start together), then sends every request concurrently and prints one JSON line per
answer: ``{"idempotencyKey", "status", "id", "body", "error", "sent", "answered"}`` (``error``
for a transport failure, ``body`` for an answer that is not a 202; ``sent`` and ``answered`` on
the system-wide monotonic clock), followed by ``done``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx


async def create(http: httpx.AsyncClient, entry: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {"idempotencyKey": entry["idempotencyKey"], "sent": time.monotonic()}
    for tries in (1, 2):
        try:
            response = await http.post(
                "/v1/runs",
                json={"agentName": entry["agentName"], "input": entry["input"]},
                headers={"Idempotency-Key": entry["idempotencyKey"]},
            )
            break
        except httpx.TransportError as exc:
            # A kept-alive connection the server closed while this process waited at the
            # barrier (uvicorn's 5 s keep-alive on a loaded machine): retry once, as any
            # client with an Idempotency-Key may; the key makes the retry safe.
            if tries == 2:
                return {**result, "status": None, "error": f"{type(exc).__name__}: {exc}"}
        except httpx.HTTPError as exc:
            return {**result, "status": None, "error": f"{type(exc).__name__}: {exc}"}
    result["answered"] = time.monotonic()
    result["status"] = response.status_code
    if response.status_code == 202:
        result["id"] = response.json()["id"]
    else:
        result["body"] = response.text
    return result


async def main(url: str, key: str, plan: list[dict[str, Any]]) -> None:
    limits = httpx.Limits(max_connections=len(plan), max_keepalive_connections=len(plan))
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60, limits=limits
    ) as http:
        # Open the connections first, so the timed burst is requests and not TCP handshakes.
        await asyncio.gather(*(http.get("/healthz") for _ in plan))
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        for result in await asyncio.gather(*(create(http, entry) for entry in plan)):
            print(json.dumps(result), flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    url, key, plan_path = sys.argv[1:4]
    asyncio.run(main(url, key, json.loads(Path(plan_path).read_text())))
