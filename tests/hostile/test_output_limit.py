"""A code step's output is limited like an HTTP answer (LANTERN_MAX_OUTPUT_BYTES, default
10 MiB), on a real `lantern serve`: a 60 MB output fails its step, class ``tool``, not retried,
naming the limit, before anything large is written, while /healthz keeps answering. The check
is the step ledger's one output check (``ledger.encoded``), so graph, plain and microVM steps
get the same limit (a VM's report past the body limit is already refused with 413)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hostile.kit import Tenant, attack
from tests.server import Server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp: Path = tmp_path_factory.mktemp("outputs")
    app = "tests.hostile.big_output_app:app"
    server = Server(f"sqlite:///{tmp / 'lantern.db'}", tmp / "serve.log", app=app).start()
    yield server
    server.stop()


def test_a_60_mb_code_step_output_is_refused(server: Server) -> None:
    tenant = Tenant(server, "default", "runs:execute,runs:read")
    try:
        with attack(server, "outputs", 1):
            run = tenant.finished(tenant.start("huge", {"mb": 60}), timeout=30)
        assert run["status"] == "failed", run
        assert "LANTERN_MAX_OUTPUT_BYTES" in run["error"]["message"], run["error"]
        events = tenant.events(run["id"])
        failed = [e for e in events if e["kind"] == "step_failed"]
        assert failed and failed[0]["stepId"] == "make", [e["kind"] for e in events]
        assert failed[0]["data"]["error"]["class"] == "tool"
        assert failed[0]["data"]["error"]["retryable"] is False
        assert not [e for e in events if e["kind"] == "step_retrying"]
        assert len(json.dumps(events)) < 100_000
        # A small one still goes through.
        small = tenant.finished(tenant.start("huge", {"mb": 1}), timeout=30)
        assert small["status"] == "succeeded" and small["output"] == 1_000_000, small
    finally:
        tenant.close()
    db = Path(server.database_url.removeprefix("sqlite:///"))
    assert sum(f.stat().st_size for f in db.parent.glob("lantern.db*")) < 20_000_000
