"""Agent graphs the tests build, small waits, and a sender killed mid-request."""

from __future__ import annotations

import socket
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


def cut_off_after_headers(url: str, path: str, headers: dict[str, str], length: int) -> None:
    """What a sender SIGKILLed right after writing a POST's headers leaves at ``url`` (a
    test peer on 127.0.0.1): the headers, announcing ``length`` bytes of body, then the
    connection closed. Returns once the peer has closed its side (it is done with them)."""
    host, _, port = url.removeprefix("http://").partition(":")
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {length}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        sock.shutdown(socket.SHUT_WR)  # the kernel's FIN for the dead process
        while sock.recv(4096):
            pass
