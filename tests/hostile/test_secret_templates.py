"""Templates over secrets against a real `lantern serve` and a real peer (docs/security.md).

A template that names a secret its workspace lacks fails its step, naming the template and the
node, wherever it stands (a URL, a header, a body): it never strands the run ``running``.
Templates apply to graph agents only; plain, code-first and microVM runs render none, and the
drive's own net (any exception of a step fails that step; a drive that dies fails its run or
hands it on) is tested for them in tests/unit/test_drive_contained.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.hostile.kit import Peer, Tenant, attack
from tests.server import Server

SCOPES = "runs:execute,runs:read,agents:write,agents:read,secrets:write,secrets:read"
VALUE = "tok-9c1f7e2a5b3d4f60"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp: Path = tmp_path_factory.mktemp("secret-templates")
    peer = Peer(echo=True)
    env = {"LANTERN_EGRESS_ALLOW": f"127.0.0.1:{peer.port}"}
    server = Server(f"sqlite:///{tmp / 'lantern.db'}", tmp / "serve.log", env=env).start()
    alice = Tenant(server, "alice", SCOPES)
    yield {"server": server, "peer": peer, "alice": alice, "tmp": tmp}
    alice.close()
    server.stop()
    peer.close()


def call(name: str, **data: Any) -> dict[str, Any]:
    return {
        "name": name,
        "graph": {
            "nodes": [
                {"id": "start", "type": "trigger"},
                {"id": "charge", "type": "connector", "data": {"connector": "http", **data}},
            ],
            "edges": [{"source": "start", "target": "charge"}],
        },
    }


def test_a_missing_secret_fails_its_step_wherever_it_stands(world: dict[str, Any]) -> None:
    server, peer = world["server"], world["peer"]
    alice: Tenant = world["alice"]
    places = {
        "url": {"url": peer.url + "/pay?key={{ secrets.PSP_KEY }}"},
        "headers": {"url": peer.url + "/pay", "headers": {"X-Key": "k {{ secrets.PSP_KEY }}"}},
        "body": {"url": peer.url + "/pay", "method": "POST", "body": "{{ secrets.PSP_KEY }}"},
    }
    with attack(server, "secrets", len(places)):
        runs = {}
        for field, data in places.items():
            assert alice.apply(call(f"missing-{field}", **data)).status_code == 200
            runs[field] = alice.start(f"missing-{field}")
        for field, run_id in runs.items():
            run = alice.finished(run_id, timeout=20)
            assert run["status"] == "failed", run
            error = run["error"]
            assert error["step"] == "charge", error
            # The template (node and field) and the secret are named.
            assert f"charge.{field}" in error["message"], error
            assert "PSP_KEY" in error["message"], error
            kinds = [e["kind"] for e in alice.events(run_id)]
            assert kinds[-2:] == ["step_failed", "run_failed"], kinds
    assert not any("/pay" in hit for hit in peer.hits)
    assert "Traceback" not in server.log.read_text()
