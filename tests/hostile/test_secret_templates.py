"""Templates over secrets against a real `lantern serve` and a real peer (docs/security.md).

A template that names a secret its workspace lacks fails its step, naming the template and the
node, wherever it stands (a URL, a header, a body): it never strands the run ``running``.
Templates apply to graph agents only; plain, code-first and microVM runs render none, and the
drive's own net (any exception of a step fails that step; a drive that dies fails its run or
hands it on) is tested for them in tests/unit/test_drive_contained.py.
"""

from __future__ import annotations

import json
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


TRANSFORMS = {
    "reverse": "{{ secrets.TOK | reverse }}",
    "join": '{{ secrets.TOK | list | join(" ") }}',
    "slice": "{{ secrets.TOK[1:] }}",
    "concat": '{{ secrets.TOK ~ "x" }}',
    "upper": "{{ secrets.TOK.upper() }}",
    "test": "{{ 'y' if secrets.TOK is string else 'n' }}",
    "capture": "{% set t %}{{ secrets.TOK }}{% endset %}{{ t | reverse }}",
}


def transformed_forms() -> list[str]:
    forms = {VALUE[::-1], " ".join(VALUE), VALUE[1:], VALUE + "x", VALUE.upper()}
    return sorted(forms | {f.replace(" ", "%20") for f in forms})


def test_a_secret_is_inserted_as_it_is_never_transformed(world: dict[str, Any]) -> None:
    server, peer = world["server"], world["peer"]
    alice: Tenant = world["alice"]
    assert alice.http.put("/v1/secrets/TOK", json={"value": VALUE}).status_code == 200
    runs = {}
    with attack(server, "secrets", len(TRANSFORMS)):
        for name, template in TRANSFORMS.items():
            for field, data in {
                "body": {"url": peer.url + "/t", "method": "POST", "body": {"t": template}},
                "headers": {"url": peer.url + "/t", "headers": {"X-T": template}},
            }.items():
                agent = f"transform-{name}-{field}"
                assert alice.apply(call(agent, **data)).status_code == 200
                runs[agent] = alice.start(agent)
        finished = {agent: alice.finished(run_id) for agent, run_id in runs.items()}
    texts = [server.log.read_text()]
    for agent, run in finished.items():
        assert run["status"] == "failed", (agent, run)
        assert "TOK" in run["error"]["message"], run["error"]
        assert f"charge.{agent.rsplit('-', 1)[1]}" in run["error"]["message"], run["error"]
        texts += [json.dumps(run), json.dumps(alice.events(run["id"]))]
        texts.append(alice.http.get(f"/v1/runs/{run['id']}/receipt").text)
    for form in transformed_forms():
        for text in texts:
            assert form not in text, f"a transformed secret ({form!r}) got out"
        for received in peer.received:
            assert form.encode() not in received
    assert not any(hit.startswith("/t") for hit in peer.hits)
    # As it is, it goes through, and only to its peer.
    plain = call("as-is", url=peer.url + "/t", headers={"X-T": "k {{ secrets.TOK }}"})
    assert alice.apply(plain).status_code == 200
    run = alice.finished(alice.start("as-is"))
    assert run["status"] == "succeeded", run
    assert VALUE not in json.dumps(run) and VALUE not in json.dumps(alice.events(run["id"]))
    assert any(f"k {VALUE}".encode() in r for r in peer.received)


def test_a_secret_in_an_ai_step_is_refused_at_apply(world: dict[str, Any]) -> None:
    alice: Tenant = world["alice"]
    for field in ("prompt", "system"):
        data = {"model": "offline/echo", "prompt": "hi"}
        data[field] = "Use {{ secrets.TOK }} to sign in"
        definition = {
            "name": f"model-{field}",
            "graph": {
                "nodes": [
                    {"id": "start", "type": "trigger"},
                    {"id": "draft", "type": "ai-step", "data": data},
                ],
                "edges": [{"source": "start", "target": "draft"}],
            },
        }
        answer = alice.apply(definition)
        assert answer.status_code == 422, answer.text
        assert answer.headers["content-type"].startswith("application/problem+json")
        assert f"data.{field} uses secrets" in answer.text
        assert alice.http.get(f"/v1/agents/model-{field}").status_code == 404
    # Prose that merely says the word is fine.
    prose = {"model": "offline/echo", "prompt": "Never tell anyone secrets."}
    ok = {
        "name": "model-prose",
        "graph": {
            "nodes": [
                {"id": "start", "type": "trigger"},
                {"id": "draft", "type": "ai-step", "data": prose},
            ],
            "edges": [{"source": "start", "target": "draft"}],
        },
    }
    assert alice.apply(ok).status_code == 200
