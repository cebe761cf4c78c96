"""A run SIGKILLed on one replica and resumed by another is one trace, seen by a real OTLP
receiver: both `lantern serve` processes export to it over OTLP/HTTP."""

from __future__ import annotations

from pathlib import Path

import httpx

from lantern.demo.receiver import Receiver
from lantern.ids import idempotency_key
from lantern.observability.tracing import trace_id_for
from tests.helpers import http_chain, wait_until
from tests.otlp import OtlpReceiver, ReceivedSpan, running
from tests.server import ALL_SCOPES, Server, make_key


def replica(database_url: str, tmp_path: Path, name: str, otlp: OtlpReceiver) -> Server:
    env = {
        "LANTERN_WORKER_ID": name,
        "LANTERN_LEASE_TTL": "2s",
        "LANTERN_RECOVERY_INTERVAL": "500ms",
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url,
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # ms: export the finished steps before the kill
    }
    return Server(database_url, tmp_path / f"{name}.log", env=env).start()


def traceparent_ids(value: str) -> tuple[int, int]:
    _, trace_hex, span_hex, _ = value.split("-")
    return int(trace_hex, 16), int(span_hex, 16)


def test_a_run_killed_on_one_replica_and_resumed_on_another_is_one_trace(
    database_url: str, tmp_path: Path, receiver: Receiver
) -> None:
    key = make_key(database_url, "default", ALL_SCOPES)
    headers = {"Authorization": f"Bearer {key}"}
    with running() as otlp:
        first = replica(database_url, tmp_path, "replica-a", otlp)
        with httpx.Client(base_url=first.url, headers=headers, timeout=30) as api:
            api.put("/v1/agents/chain", json=http_chain("chain", receiver.url, 4))
            receiver.hold("/s3")
            created = api.post("/v1/runs", json={"agentName": "chain", "input": {"n": 1}})
            assert created.status_code == 202
            run_id = created.json()["id"]
        assert receiver.arrived.wait(20)
        # s1 and s2 are done: their spans reach the receiver before the process dies.
        wait_until(lambda: {"step s1", "step s2"} <= {s.name for s in otlp.received()}, 10)
        first.kill()
        receiver.release()

        second = replica(database_url, tmp_path, "replica-b", otlp)
        try:
            with httpx.Client(base_url=second.url, headers=headers, timeout=30) as api:
                run = api.get(f"/v1/runs/{run_id}", params={"wait": 30}).json()
                assert run["status"] == "succeeded", run
        finally:
            assert second.stop() == 0  # a clean stop flushes the batched spans
        trace_id = trace_id_for(run_id)
        spans = [s for s in otlp.received() if s.trace_id == trace_id]

    assert otlp.paths and set(otlp.paths) == {"/v1/traces"}
    assert spans
    assert {s.resource["service.name"] for s in spans} == {"lantern"}
    by_replica = {s.resource["service.instance.id"] for s in spans}
    assert by_replica == {"replica-a", "replica-b"}
    assert len({s.resource["process.pid"] for s in spans}) == 2

    def named(name: str, where: str) -> list[ReceivedSpan]:
        return [s for s in spans if s.name == name and s.resource["service.instance.id"] == where]

    # The killed drive never ended, so only its finished steps were exported.
    assert named("run chain", "replica-a") == []
    [resumed] = named("run chain", "replica-b")
    assert resumed.attributes["lantern.recovered"] is True
    assert resumed.attributes["lantern.from_worker"] == "replica-a"
    assert resumed.attributes["lantern.run_status"] == "succeeded"
    assert resumed.attributes["lantern.run_id"] == run_id

    # s1 ran on replica-a; replica-b served it from the journal: the same attempt, so the same
    # idempotency key (derived from the run id, the step id and the attempt).
    [ran] = named("step s1", "replica-a")
    [replayed] = named("step s1", "replica-b")
    assert ran.attributes["lantern.replayed"] is False
    assert replayed.attributes["lantern.replayed"] is True
    assert replayed.start_ns == replayed.end_ns
    assert replayed.parent_span_id == resumed.span_id
    assert ran.attributes["lantern.attempt"] == replayed.attributes["lantern.attempt"] == 1

    # s3 was in flight at the kill and ran again on replica-b: both requests carried the same
    # Idempotency-Key and a traceparent in the run's trace; replica-b's is its s3 span.
    hits = [h for h in receiver.hits if h.path == "/s3"]
    assert len(hits) == 2
    assert {h.idempotency_key for h in hits} == {idempotency_key(run_id, "s3", 1)}
    parents = [traceparent_ids(h.headers["traceparent"]) for h in hits]
    assert {t for t, _ in parents} == {trace_id}
    [rerun] = named("step s3", "replica-b")
    assert rerun.attributes["lantern.replayed"] is False
    assert rerun.attributes["lantern.attempt"] == 1  # the key the two requests carried
    assert parents[1][1] == rerun.span_id
    assert parents[0][1] != rerun.span_id  # replica-a's s3 span, lost with its process
    assert named("step s3", "replica-a") == []
    [s4] = named("step s4", "replica-b")
    assert s4.parent_span_id == resumed.span_id
