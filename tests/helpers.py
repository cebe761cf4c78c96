"""Agent graphs the tests build, and small waits."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def http_chain(name: str, url: str, steps: int) -> dict[str, Any]:
    """trigger -> s1 -> ... -> sN, each an http POST to ``url``/sK carrying the previous answer."""
    nodes: list[dict[str, Any]] = [{"id": "start", "type": "trigger"}]
    edges = []
    previous = "start"
    for k in range(1, steps + 1):
        body: dict[str, Any] = {"step": k, "input": "{{ input }}"}
        if k > 1:
            body["previous"] = f"{{{{ steps.s{k - 1}.output.body }}}}"
        nodes.append(
            {
                "id": f"s{k}",
                "type": "connector",
                "data": {"connector": "http", "method": "POST", "url": f"{url}/s{k}", "body": body},
            }
        )
        edges.append({"source": previous, "target": f"s{k}"})
        previous = f"s{k}"
    return {"name": name, "graph": {"nodes": nodes, "edges": edges}}


def wait_until(check: Callable[[], bool], timeout: float = 30, every: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(every)
    raise AssertionError(f"condition not met within {timeout}s")
