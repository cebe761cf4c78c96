"""PostgreSQL going away under 20 runs in flight, on a private cluster this module starts
(the shared server the other tests use stays up): a crash restart (`pg_ctl restart -m
immediate`) and a stop of 5 s. Lantern is not restarted; every run succeeds, the step in
flight runs at most once more with its one key, and nothing journaled is lost.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from lantern.demo.receiver import Receiver
from tests.helpers import http_chain, wait_until
from tests.pg_server import PrivateCluster
from tests.server import ALL_SCOPES, Server, make_key

RUNS = 20


@pytest.fixture(scope="module")
def cluster() -> Iterator[PrivateCluster]:
    try:
        c = PrivateCluster().start()
    except RuntimeError as exc:
        pytest.skip(str(exc)) if "no PostgreSQL binaries" in str(exc) else pytest.fail(str(exc))
    yield c
    c.destroy()


def outage(
    cluster: PrivateCluster, tmp_path: Path, receiver: Receiver, blink: Callable[[Server], None]
) -> None:
    key = make_key(cluster.url, "default", ALL_SCOPES)
    env = {"LANTERN_RECOVERY_INTERVAL": "1s", "LANTERN_EGRESS_ALLOW": "127.0.0.1"}
    server = Server(cluster.url, tmp_path / "serve.log", env=env).start()
    try:
        with httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
        ) as api:
            name = f"chain-{tmp_path.name}"[:60]
            api.put(f"/v1/agents/{name}", json=http_chain(name, receiver.url, 3)).raise_for_status()
            receiver.hold("/s2")
            ids = [
                api.post("/v1/runs", json={"agentName": name, "input": {"n": n}}).json()["id"]
                for n in range(RUNS)
            ]
            wait_until(lambda: receiver.count("/s2") == RUNS, timeout=60)
            blink(server)  # with every run's step s2 in flight
            receiver.release()
            runs = []
            for run_id in ids:
                deadline = time.monotonic() + 90
                while True:
                    try:
                        run = api.get(f"/v1/runs/{run_id}", params={"wait": 20}).json()
                    except httpx.HTTPError:
                        run = {"status": "unknown"}
                    if run.get("status") in ("succeeded", "failed", "cancelled"):
                        break
                    assert time.monotonic() < deadline, run
                    time.sleep(0.2)
                runs.append(run)
            journals = [api.get(f"/v1/runs/{i}/events").json()["items"] for i in ids]
            assert api.get("/readyz").status_code == 200
            assert api.get("/healthz").status_code == 200
    finally:
        server.stop()
    log = (tmp_path / "serve.log").read_text(errors="replace")
    assert [r["status"] for r in runs] == ["succeeded"] * RUNS, (runs, log[-3000:])
    assert receiver.count("/s1") == RUNS and receiver.count("/s3") == RUNS
    assert RUNS <= receiver.count("/s2") <= 2 * RUNS
    assert len(receiver.keys("/s2")) == RUNS  # one key per run, however often it was sent
    for events in journals:
        completed = [e["stepId"] for e in events if e["kind"] == "step_completed"]
        assert sorted(completed) == ["s1", "s2", "s3", "start"]
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        assert events[-1]["kind"] == "run_succeeded"
    assert "Traceback" not in log, log[-3000:]


def test_postgres_crash_restart_mid_run(
    cluster: PrivateCluster, tmp_path: Path, receiver: Receiver
) -> None:
    outage(cluster, tmp_path, receiver, lambda _: cluster.restart("immediate"))


def test_postgres_stopped_for_five_seconds_mid_run(
    cluster: PrivateCluster, tmp_path: Path, receiver: Receiver
) -> None:
    def stop_for_five_seconds(server: Server) -> None:
        cluster.stop("fast")
        receiver.release()  # the steps finish, and their commits meet the outage
        time.sleep(1)
        # Alive, but not ready: a load balancer stops sending work here.
        assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200
        ready = httpx.get(f"{server.url}/readyz", timeout=10)
        assert ready.status_code == 503, ready.text
        assert "not ready" in ready.json()["detail"]
        time.sleep(4)
        cluster.start()

    outage(cluster, tmp_path, receiver, stop_for_five_seconds)
