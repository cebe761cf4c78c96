"""`lantern runs approve|reject|cancel` and `lantern approvals list`, through a server (with
LANTERN_URL) and on the database directly, each with a bad argument and a good one."""

from __future__ import annotations

import copy
import json
import os
import secrets
import subprocess
from collections.abc import Iterator

import httpx
import pytest

from tests.api.test_cli_remote import lantern
from tests.api.test_operate import REVIEW, client, parked
from tests.conftest import sqlite_url
from tests.helpers import wait_until
from tests.server import ALL_SCOPES, LANTERN, Server, make_key

SLOW = {
    "name": "slow",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "nap", "type": "tool", "data": {"tool": "sleep", "args": {"seconds": 60}}},
            {"id": "after", "type": "tool", "data": {"tool": "noop", "args": {}}},
        ],
        "edges": [{"source": "start", "target": "nap"}, {"source": "nap", "target": "after"}],
    },
}


# A decision made on the database directly has no key, so no approver name to template.
PLAIN_REVIEW = copy.deepcopy(REVIEW)
PLAIN_REVIEW["graph"]["nodes"][2]["data"]["args"].pop("by")


def local(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LANTERN_URL", "LANTERN_API_KEY")}
    env["LANTERN_DATABASE_URL"] = database_url
    return subprocess.run([LANTERN, *args], env=env, capture_output=True, text=True, timeout=60)


def one_line_usage(done: subprocess.CompletedProcess[str], words: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], done.stderr


@pytest.mark.parametrize(
    "args, words",
    [
        (["runs", "approve"], "Missing argument 'RUN_ID'"),
        (["runs", "approve", "not-a-run"], "is not a run id"),
        (["runs", "reject", "run_x", "ok"], "is not a run id"),
        (["runs", "reject", "--comment"], "requires an argument"),
        (["runs", "cancel", "../etc"], "is not a run id"),
        (["runs", "cancel"], "Missing argument 'RUN_ID'"),
        (["runs", "retry"], "Missing argument 'RUN_ID'"),
        (["runs", "retry", "run-1"], "is not a run id"),
        (["runs", "retry", "run_" + "0" * 28, "--from", " "], "--from needs a step id"),
        (["approvals", "list", "--limit", "0"], "is not in the range"),
        (["approvals", "list", "--colour"], "No such option"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(args: list[str], words: str) -> None:
    one_line_usage(local("sqlite:////nonexistent/never.db", *args), words)


@pytest.fixture(scope="module")
def api_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One backend is enough here: the commands are the same code over the API or the store,
    whose backends the API tests cover. One server for the module: over the API each test
    works in a workspace of its own; on the database, in the CLI's, ``default``."""
    tmp = tmp_path_factory.mktemp("serve")
    server = Server(sqlite_url(tmp), tmp / "serve.log").start()
    yield server
    server.stop()


def test_approve_reject_and_cancel_through_the_server(api_server: Server) -> None:
    workspace = f"carol-{secrets.token_hex(4)}"
    key = make_key(api_server.database_url, workspace, ALL_SCOPES, name="carol")
    with client(api_server, key) as api:
        api.put("/v1/agents/review", json=REVIEW).raise_for_status()
        first, second = parked(api, "Ada"), parked(api, "Bob")

        listed = lantern(api_server, key, "approvals", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        rows = [json.loads(line) for line in listed.stdout.splitlines()]
        assert [(r["runId"], r["nodeId"], r["prompt"]) for r in rows] == [
            (first, "ok", "Refund Ada?"),
            (second, "ok", "Refund Bob?"),
        ]
        table = lantern(api_server, key, "approvals", "list")
        assert first in table.stdout and "Refund Ada?" in table.stdout

        approved = lantern(api_server, key, "runs", "approve", first, "--comment", "ok by me")
        assert approved.returncode == 0, approved.stderr
        assert approved.stdout.strip() == f"approved {first} at ok (by carol)"
        again = lantern(api_server, key, "runs", "approve", first, "ok")
        assert again.returncode == 1 and len(again.stderr.strip().splitlines()) == 1
        rejected = lantern(api_server, key, "runs", "reject", second, "ok", "--comment", "no")
        assert rejected.returncode == 0 and "rejected" in rejected.stdout, rejected.stderr

        assert api.get(f"/v1/runs/{first}", params={"wait": 30}).json()["status"] == "succeeded"
        shown = lantern(api_server, key, "runs", "show", first).stdout  # the terminal waterfall
        assert f"ok: approved by carol (key {key.split('_')[1]}): ok by me" in shown, shown
        run = api.get(f"/v1/runs/{second}", params={"wait": 30}).json()
        assert run["status"] == "failed" and "rejected by carol: no" in run["error"]["message"]
        assert lantern(api_server, key, "approvals", "list").stdout.strip() == (
            "no pending approvals"
        )

        # The rejected run, retried: its approval had not completed, so it asks again.
        retried = lantern(api_server, key, "runs", "retry", second)
        assert retried.returncode == 0, retried.stderr
        new = retried.stdout.strip()
        assert new.startswith("run_") and new != second
        wait_until(lambda: api.get(f"/v1/runs/{new}").json()["status"] == "waiting")
        assert [p["runId"] for p in api.get("/v1/approvals").json()["items"]] == [new]
        refused = lantern(api_server, key, "runs", "retry", first, "--from", "send")
        assert refused.returncode == 1 and "succeeded" in refused.stderr


def test_approve_and_cancel_on_the_database(api_server: Server) -> None:
    db = api_server.database_url
    key = make_key(db, "default", ALL_SCOPES)
    with client(api_server, key) as api:
        api.put("/v1/agents/review", json=PLAIN_REVIEW).raise_for_status()
        first, second = parked(api, "Ada"), parked(api, "Bob")
        listed = local(db, "approvals", "list", "--json")
        assert [json.loads(line)["runId"] for line in listed.stdout.splitlines()] == [
            first,
            second,
        ]
        approved = local(db, "runs", "approve", first)
        assert approved.returncode == 0 and approved.stdout.startswith(f"approved {first} at ok")
        assert api.get(f"/v1/runs/{first}", params={"wait": 30}).json()["status"] == "succeeded"
        resumed = [
            e
            for e in api.get(f"/v1/runs/{first}/events").json()["items"]
            if e["kind"] == "step_resumed"
        ]
        assert resumed[0]["data"]["by"].startswith("cli:")

        cancelled = local(db, "runs", "cancel", second)  # parked: nobody holds it
        assert cancelled.returncode == 0 and f"cancelled: {second}" in cancelled.stdout
        assert api.get(f"/v1/runs/{second}").json()["status"] == "cancelled"
        twice = local(db, "runs", "cancel", second)
        assert twice.returncode == 1 and "already finished" in twice.stderr
        missing = local(db, "runs", "approve", "run_" + "0" * 28)
        assert missing.returncode == 1 and "not found" in missing.stderr


def test_remote_needs_the_key_scope(api_server: Server) -> None:
    workspace = f"w{secrets.token_hex(4)}"
    key = make_key(api_server.database_url, workspace, ALL_SCOPES)
    reader = make_key(api_server.database_url, workspace, "runs:read")
    with httpx.Client(base_url=api_server.url, headers={"Authorization": f"Bearer {key}"}) as api:
        api.put("/v1/agents/review", json=REVIEW).raise_for_status()
        run_id = parked(api, "Ada")
    refused = lantern(api_server, reader, "runs", "approve", run_id, "ok")
    assert refused.returncode == 1 and "runs:approve" in refused.stderr
