"""`lantern runs export` and `lantern receipt verify` on both backends: a clean export
verifies; one changed byte of any event, of the output or of the receipt fails, named."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import lantern
from lantern.cli.main import runs
from lantern.cli.receipts import export_command, receipt
from lantern.engine.chain import GENESIS, canonical, link
from lantern.engine.runs import apply_agent, create_run
from lantern.engine.worker import Worker
from lantern.store import open_store

AGENT = {
    "name": "pair",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "a", "type": "tool", "data": {"tool": "echo", "args": {"x": "{{ input.x }}"}}},
            {"id": "b", "type": "tool", "data": {"tool": "echo", "args": {"y": "{{ input.y }}"}}},
        ],
        "edges": [{"source": "start", "target": "a"}, {"source": "a", "target": "b"}],
    },
}
LANTERN = str(Path(sys.executable).parent / "lantern")
INPUT = {"x": "Ada Lovelace", "y": 1815.5}


def tools() -> lantern.App:
    app = lantern.App()

    @app.tool("echo")
    async def echo(**kwargs: Any) -> dict[str, Any]:
        return dict(kwargs)

    return app


async def make_runs(url: str) -> tuple[str, str]:
    """A finished run (with no receipt yet: the CLI issues it) and a queued one."""
    store = open_store(url)
    await store.open()
    try:
        await apply_agent(store, AGENT)
        created = await create_run(store, "pair", INPUT)
        async with Worker(store, tools(), worker_id="w", lease_ttl=30) as w:
            assert w.runner is not None
            done = await w.runner.drive(created.id)
        assert done is not None and done.status == "succeeded"
        queued = await create_run(store, "pair", INPUT)
    finally:
        await store.close()
    return created.id, queued.id


class Cli:
    def __init__(self, database_url: str, tmp_path: Path) -> None:
        self.runner = CliRunner()
        self.env = {
            "LANTERN_DATABASE_URL": database_url,
            "LANTERN_DATA_DIR": str(tmp_path / "data"),
            "LANTERN_URL": "",
            "LANTERN_API_KEY": "",
        }
        self.tmp = tmp_path

    def receipt(self, *args: str) -> Result:
        return self.runner.invoke(receipt, list(args), env=self.env)

    def export(self, *args: str) -> Result:
        runs.add_command(export_command)
        return self.runner.invoke(runs, ["export", *args], env=self.env)

    def verify(self, doc: Any) -> Result:
        path = self.tmp / "changed.json"
        path.write_text(json.dumps(doc))
        return self.receipt("verify", str(path), "--keys", str(self.tmp / "jwks.json"))


@pytest.fixture
def setup(database_url: str, tmp_path: Path) -> tuple[Cli, dict[str, Any], str]:
    run_id, queued = asyncio.run(make_runs(database_url))
    cli = Cli(database_url, tmp_path)
    exported = cli.export(run_id, "-o", str(tmp_path / "export.json"))
    assert exported.exit_code == 0, exported.output
    keys = cli.receipt("keys")
    assert keys.exit_code == 0, keys.output
    (tmp_path / "jwks.json").write_text(keys.stdout)
    return cli, json.loads((tmp_path / "export.json").read_text()), queued


def flip(value: str) -> str:
    """``value`` with its last letter or digit changed: one byte."""
    i = max(m.start() for m in re.finditer(r"[A-Za-z0-9]", value))
    c = value[i]
    other = str((int(c) + 1) % 10) if c.isdigit() else c.swapcase()
    return value[:i] + other + value[i + 1 :]


def flip_json(value: Any) -> Any:
    return json.loads(flip(json.dumps(value)))


def fails(result: Result, *named: str) -> None:
    assert result.exit_code == 1, result.output
    for what in named:
        assert what in result.stderr, result.stderr
    assert "receipt verified" not in result.stdout


def test_an_export_verifies_offline_and_by_run_id(setup: tuple[Cli, dict[str, Any], str]) -> None:
    cli, doc, _ = setup
    assert set(doc) == {"events", "receipt", "signature", "keyId"}
    assert doc["receipt"]["eventCount"] == len(doc["events"]) == 8
    ok = cli.verify(doc)
    assert ok.exit_code == 0, ok.output
    assert ok.stdout.startswith("receipt verified") and ok.stdout.count("\n") == 1
    by_id = cli.receipt("verify", doc["receipt"]["runId"])  # keys from the database
    assert by_id.exit_code == 0, by_id.output
    again = cli.export(doc["receipt"]["runId"])
    assert json.loads(again.stdout) == doc  # the stored receipt, not a new one


def test_one_changed_byte_of_any_event_fails_naming_the_event(
    setup: tuple[Cli, dict[str, Any], str],
) -> None:
    cli, doc, _ = setup
    for i, event in enumerate(doc["events"]):
        for field in ("kind", "at", "data", "stepId"):
            if event[field] is None:
                continue
            changed = copy.deepcopy(doc)
            value = changed["events"][i][field]
            changed["events"][i][field] = (
                flip(value) if isinstance(value, str) else flip_json(value)
            )
            fails(cli.verify(changed), f"event {event['seq']}: hash does not match its content")


def test_a_changed_output_fails_naming_the_output_digest(
    setup: tuple[Cli, dict[str, Any], str],
) -> None:
    cli, doc, _ = setup
    last = doc["events"][-1]
    assert last["kind"] == "run_succeeded"
    changed = copy.deepcopy(doc)
    changed["events"][-1]["data"]["output"] = flip_json(last["data"]["output"])
    fails(cli.verify(changed), "outputDigest differs", f"event {last['seq']}: hash does not match")


def test_one_changed_byte_of_the_receipt_fails_the_signature(
    setup: tuple[Cli, dict[str, Any], str],
) -> None:
    cli, doc, _ = setup
    for field, value in doc["receipt"].items():
        changed = copy.deepcopy(doc)
        changed["receipt"][field] = flip_json(value)
        expected = "differs from the receipt's keyId" if field == "keyId" else "signature does not"
        fails(cli.verify(changed), expected)
    changed = copy.deepcopy(doc)
    changed["signature"] = flip(doc["signature"])
    fails(cli.verify(changed), f"signature does not verify with key {doc['keyId']}")


def test_a_rewritten_chain_or_a_dropped_event_still_fails(
    setup: tuple[Cli, dict[str, Any], str],
) -> None:
    cli, doc, _ = setup
    # Change an event and recompute every hash after it: only the signed head can tell.
    changed = copy.deepcopy(doc)
    changed["events"][3]["data"] = flip_json(changed["events"][3]["data"])
    previous = GENESIS
    for e in changed["events"]:
        at = datetime.fromisoformat(e["at"])
        body = canonical(
            e["runId"], e["seq"], e["kind"], e["stepId"], e["nodeId"], e["attempt"], at, e["data"]
        )
        e["hash"] = previous = link(previous, body)
    result = cli.verify(changed)
    fails(result, "journalHead differs")
    assert "hash does not match" not in result.stderr
    dropped = copy.deepcopy(doc)
    del dropped["events"][2]
    fails(cli.verify(dropped), "eventCount differs", "event 4: found where event 3 belongs")


def test_keys_that_did_not_sign_it_fail(setup: tuple[Cli, dict[str, Any], str]) -> None:
    cli, doc, _ = setup
    (cli.tmp / "jwks.json").write_text(json.dumps({"keys": []}))
    fails(cli.verify(doc), f"no key {doc['keyId']!r} in the key set")


def test_bad_usage_and_failed_operations(setup: tuple[Cli, dict[str, Any], str]) -> None:
    cli, _, queued = setup
    (cli.tmp / "broken.json").write_text("{not json")
    bad = cli.receipt("verify", str(cli.tmp / "broken.json"))
    assert bad.exit_code == 2 and "is not a JSON export" in bad.stderr
    no_keys = cli.receipt("verify", str(cli.tmp / "export.json"), "--keys", "/nonexistent.json")
    assert no_keys.exit_code == 2 and "cannot read a JWK set" in no_keys.stderr
    unknown = cli.receipt("verify", "run_nothere")
    assert unknown.exit_code == 1 and "run run_nothere not found" in unknown.stderr
    early = cli.export(queued)
    assert early.exit_code == 1 and "has not finished" in early.stderr


def test_rotate_key_signs_new_receipts_and_old_ones_still_verify(
    setup: tuple[Cli, dict[str, Any], str], database_url: str
) -> None:
    cli, doc, _ = setup
    rotated = cli.receipt("rotate-key")
    assert rotated.exit_code == 0 and "new signing key" in rotated.stdout, rotated.output
    new_kid = rotated.stdout.split()[3]
    run_id = asyncio.run(one_more_run(database_url))
    fresh = json.loads(cli.export(run_id).stdout)
    assert fresh["keyId"] == new_kid != doc["keyId"]
    keys = json.loads(cli.receipt("keys").stdout)["keys"]
    assert {k["kid"] for k in keys} == {doc["keyId"], new_kid}
    (cli.tmp / "jwks.json").write_text(json.dumps({"keys": keys}))
    assert cli.verify(doc).exit_code == 0
    assert cli.verify(fresh).exit_code == 0


async def one_more_run(url: str) -> str:
    """A finished run of the agent ``setup`` applied, with no receipt yet."""
    store = open_store(url)
    await store.open()
    try:
        created = await create_run(store, "pair", INPUT)
        async with Worker(store, tools(), worker_id="w", lease_ttl=30) as w:
            assert w.runner is not None
            await w.runner.drive(created.id)
    finally:
        await store.close()
    return created.id


def test_serve_refuses_a_bad_signing_key_in_one_line(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "LANTERN_DATABASE_URL": f"sqlite:///{tmp_path / 'l.db'}",
        "LANTERN_SIGNING_KEY": "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----",
    }
    done = subprocess.run(
        [LANTERN, "serve", "--port", "0"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: LANTERN_SIGNING_KEY: PEM block 1 cannot be read")
    assert done.stderr.count("\n") == 1
