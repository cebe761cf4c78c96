"""`lantern serve --workers N`: replicas in processes of their own behind one port. A worker
SIGKILLed mid-step is started again with its id and takes its runs back at once, whatever the
kind of run; the parent's stop stops them all, and so does the parent's death."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from lantern.demo.receiver import Receiver
from lantern.engine.runs import apply_agent
from lantern.server.auth import issue_key
from lantern.store import Store
from tests.crash.processes import Serve
from tests.crash.test_sigkill import completions, wait_for, wait_for_status
from tests.fake_llm import FakeProvider, Script
from tests.helpers import http_chain
from tests.server import ALL_SCOPES

pytestmark = pytest.mark.parametrize("database_url", ["postgres"], indirect=True)

CODE_APP = "tests.crash.code_app:app"


def workers_of(parent: int) -> list[int]:
    return [int(pid) for pid in Path(f"/proc/{parent}/task/{parent}/children").read_text().split()]


def alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return status != "Z"


async def test_a_killed_worker_is_started_again_and_finishes_every_kind_of_run(
    store: Store, receiver: Receiver, fake: FakeProvider, tmp_path: Path
) -> None:
    await apply_agent(store, http_chain("chain", receiver.url, 4))
    fake.script = Script([[("ping", {"url": f"{receiver.url}/s3"})], "pinged"])
    await apply_agent(
        store, {"name": "pinger", "model": "gpt-4o-mini", "system": "Ping.", "tools": ["ping"]}
    )
    served = Serve(
        store.url,
        tmp_path / "serve.log",
        CODE_APP,
        LANTERN_WORKERS="2",
        LANTERN_WORKER_ID="wk",
        **fake.env(),
    )
    try:
        served.wait_ready()
        assert len(workers_of(served.proc.pid)) == 2
        receiver.hold("/s3")
        _, key = await issue_key(store, "default", set(ALL_SCOPES.split(",")), None)
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{served.port}", headers={"Authorization": f"Bearer {key}"}
        ) as api:
            runs = []
            for agent, given in (
                ("chain", {}),  # graph
                ("code-chain", {"url": receiver.url}),  # code-first
                ("pinger", "Ping the peer."),  # plain
            ):
                created = await api.post("/v1/runs", json={"agentName": agent, "input": given})
                assert created.status_code == 202, created.text
                runs.append(created.json()["id"])
        await wait_for(lambda: receiver.count("/s3") == 3)  # each run's third step in flight
        killed = workers_of(served.proc.pid)
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        receiver.release()
        began = time.monotonic()
        for run_id in runs:
            await wait_for_status(store, run_id, "succeeded")
        # Each worker came back under its id and took its runs back, not after the lease TTL.
        assert time.monotonic() - began < 20
        await wait_for(lambda: len(workers_of(served.proc.pid)) == 2)  # (one may hold none)
        restarted = workers_of(served.proc.pid)
        assert not set(restarted) & set(killed)
        assert served.output().count("ended (signal SIGKILL): starting it again") == 2
        for step in ("s1", "s2", "s4"):
            assert receiver.count(f"/{step}") == 2, step  # graph and code-first, once each
        assert 3 <= receiver.count("/s3") <= 6  # in flight at the kill: sent again...
        assert len(receiver.keys("/s3")) == 3  # ...with its run's key
        graph, code, plain = [completions(await store.events(r)) for r in runs]
        assert graph == {"start": 1, "s1": 1, "s2": 1, "s3": 1, "s4": 1}
        assert code == {"s1": 1, "s2": 1, "s3": 1, "s4": 1}
        assert plain == {"llm:1": 1, "tool:1:ping": 1, "llm:2": 1}
        # One port serves every worker's runs.
        async with httpx.AsyncClient() as http:
            health = await http.get(f"http://127.0.0.1:{served.port}/healthz")
        assert health.status_code == 200
    finally:
        receiver.release()
        stopped = served.stop()
    assert stopped == 0, served.output()[-3000:]
    assert not any(alive(pid) for pid in restarted)


async def test_workers_stop_when_their_parent_is_killed(store: Store, tmp_path: Path) -> None:
    served = Serve(store.url, tmp_path / "serve.log", CODE_APP, LANTERN_WORKERS="2")
    served.wait_ready()
    workers = workers_of(served.proc.pid)
    assert len(workers) == 2
    served.kill()
    await wait_for(lambda: not any(alive(pid) for pid in workers), timeout=30)
    assert served.output().count("Application shutdown complete") == 2  # stopped cleanly
