"""200 concurrent POST /v1/runs from several client processes: every run created once, all finish.

Four client processes (tests/api/load_client.py) hold 50 requests each and start together
behind a barrier, each sending its 50 at once over 50 connections. Every request carries an
Idempotency-Key: 160 keys in all, and 40 of them are sent twice, with the same body, from two
different processes at the same moment. The API must then hold exactly one run per key (none
lost, none doubled), give every request of a key the same run, and run every one to success.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from tests.server import ROOT, Server, make_key

PROCESSES = 4
PER_PROCESS = 50
SHARED = 10  # keys a process also sends on behalf of the next process
CLIENT = Path(__file__).with_name("load_client.py")
NOOP = {
    "name": "noop",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "t", "type": "tool", "data": {"tool": "noop", "args": {"n": "{{ input.n }}"}}},
        ],
        "edges": [{"source": "start", "target": "t"}],
    },
}


def plans() -> list[list[dict[str, Any]]]:
    """Per process: the first 10 keys of the next process again, then its own 40 keys."""
    own = PER_PROCESS - SHARED

    def entry(n: int) -> dict[str, Any]:
        return {"idempotencyKey": f"order-{n:04d}", "agentName": "noop", "input": {"n": n}}

    result = []
    for p in range(PROCESSES):
        mine = [entry(p * own + i) for i in range(own)]
        neighbour = (p + 1) % PROCESSES
        repeated = [entry(neighbour * own + i) for i in range(SHARED)]
        # A process sends all 50 at once, so both requests of a shared key reach the server
        # at about the same time (the test checks that they were in flight together).
        result.append(repeated + mine)
    return result


def run_clients(server: Server, key: str, tmp_path: Path) -> list[dict[str, Any]]:
    procs = []
    for p, plan in enumerate(plans()):
        path = tmp_path / f"plan-{p}.json"
        path.write_text(json.dumps(plan))
        procs.append(
            subprocess.Popen(
                [sys.executable, str(CLIENT), server.url, key, str(path)],
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        for proc in procs:  # the barrier: every client has its connections open
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            assert line == "ready", f"{line!r} {proc.stderr.read() if proc.stderr else ''}"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results: list[dict[str, Any]] = []
        for p, proc in enumerate(procs):
            out, err = proc.communicate(timeout=60)
            lines = out.splitlines()
            assert proc.returncode == 0 and lines[-1] == "done", f"client {p}: {err[-2000:]}"
            results += [{**json.loads(line), "process": p} for line in lines[:-1]]
        return results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()  # waits, and closes the pipes


def all_runs(http: httpx.Client) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 200, **({"cursor": cursor} if cursor else {})}
        page = http.get("/v1/runs", params=params).json()
        runs += page["items"]
        cursor = page["nextCursor"]
        if cursor is None:
            return runs


def test_concurrent_creates_make_each_run_once(api_server: Server, tmp_path: Path) -> None:
    key = make_key(api_server.database_url, "load", "runs:execute,runs:read,agents:write")
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=api_server.url, headers=headers, timeout=60) as http:
        assert http.put("/v1/agents/noop", json=NOOP).status_code == 200

        results = run_clients(api_server, key, tmp_path)

        assert len(results) == PROCESSES * PER_PROCESS
        refused = [r for r in results if r["status"] != 202]
        assert refused == [], refused[:5]
        ids_by_key: dict[str, set[str]] = {}
        processes_by_key: dict[str, set[int]] = {}
        for r in results:
            ids_by_key.setdefault(r["idempotencyKey"], set()).add(r["id"])
            processes_by_key.setdefault(r["idempotencyKey"], set()).add(r["process"])
        distinct_keys = PROCESSES * (PER_PROCESS - SHARED)
        assert len(ids_by_key) == distinct_keys
        shared = [k for k, procs in processes_by_key.items() if len(procs) == 2]
        assert len(shared) == PROCESSES * SHARED  # sent from two processes each
        # The two requests of a shared key were in flight together (the race was run), for
        # most keys; time.monotonic is one clock for every process on Linux.
        spans: dict[str, list[tuple[float, float]]] = {}
        for r in results:
            spans.setdefault(r["idempotencyKey"], []).append((r["sent"], r["answered"]))
        raced = [k for k in shared if max(s for s, _ in spans[k]) < min(a for _, a in spans[k])]
        assert len(raced) >= len(shared) // 2, f"only {len(raced)} of {len(shared)} raced"
        # Each key's answers all name the same run, and no two keys share a run.
        split = {k: ids for k, ids in ids_by_key.items() if len(ids) != 1}
        assert split == {}, f"keys answered with more than one run: {split}"
        run_of = {k: next(iter(ids)) for k, ids in ids_by_key.items()}
        assert len(set(run_of.values())) == distinct_keys

        # The store holds exactly those runs: none lost, none doubled.
        stored = all_runs(http)
        assert len(stored) == distinct_keys
        assert {r["id"] for r in stored} == set(run_of.values())

        def finished(run_id: str) -> dict[str, Any]:
            body: dict[str, Any] = http.get(f"/v1/runs/{run_id}", params={"wait": 30}).json()
            return body

        with ThreadPoolExecutor(16) as pool:
            done = dict(zip(run_of, pool.map(finished, run_of.values()), strict=True))
        not_succeeded = {k: r["status"] for k, r in done.items() if r["status"] != "succeeded"}
        assert not_succeeded == {}
        for idempotency_key, run in done.items():
            n = int(idempotency_key.removeprefix("order-"))
            assert run["input"] == {"n": n} and run["output"] == {"n": n}, run
