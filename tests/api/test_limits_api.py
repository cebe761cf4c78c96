"""/v1/limits and `lantern limits` against a real `lantern serve` (both backends): a
workspace's own limits and the server's (an operator's), and hostile input answered with
problem+json (one line from the CLI) that changes nothing."""

from __future__ import annotations

import json
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from tests.api.test_cli_remote import lantern
from tests.server import ALL_SCOPES, LANTERN, Server, make_key

TPM = {"match": {"model": "openai/*"}, "tokensPerMinute": 200000, "requestsPerMinute": 500}


def client(server: Server, workspace: str, scopes: str, *, operator: bool = False) -> httpx.Client:
    key = make_key(server.database_url, workspace, scopes, operator=operator)
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def names(c: httpx.Client) -> list[tuple[str, str]]:
    return [(x["scope"], x["name"]) for x in c.get("/v1/limits").json()["items"]]


BAD: list[tuple[Any, str]] = [
    ({"match": {"model": "openai/*"}}, "tokensPerMinute, requestsPerMinute or both"),
    ({**TPM, "tokensPerMinute": 0}, "tokensPerMinute must be an integer"),
    ({**TPM, "requestsPerMinute": 1.5}, "requestsPerMinute must be an integer"),
    ({**TPM, "tokensPerMinute": True}, "tokensPerMinute must be an integer"),
    ({**TPM, "match": {"model": ""}}, "match.model"),
    ({**TPM, "match": {"model": "x", "provider": "y"}}, "match must be"),
    ({**TPM, "match": "openai/*"}, "match must be"),
    ({**TPM, "burst": 3}, "unknown field 'burst'"),
    ({**TPM, "scope": "galaxy"}, "scope must be one of"),
    ([1, 2], "dictionary"),
]


def test_limits_round_trip_validation_and_who_may_set_them(module_server: Server) -> None:
    admin = client(module_server, "acme", "admin")
    user = client(module_server, "acme", ALL_SCOPES)
    other = client(module_server, "beta", "admin")
    operator = client(module_server, "ops", "", operator=True)
    with admin, user, other, operator:
        put = admin.put("/v1/limits/openai-tpm", json=TPM)
        assert put.status_code == 200, put.text
        assert put.json() | {"createdAt": None, "updatedAt": None} == {
            "name": "openai-tpm",
            "scope": "workspace",
            "match": {"model": "openai/*"},
            "tokensPerMinute": 200000,
            "requestsPerMinute": 500,
            "createdAt": None,
            "updatedAt": None,
            "used": {"tokens": 0, "requests": 0},  # nothing sent in its last minute
        }
        for body, says in BAD:
            bad = admin.put("/v1/limits/openai-tpm", json=body)
            assert bad.status_code == 422, (body, bad.text)
            assert bad.headers["content-type"].startswith("application/problem+json")
            assert says in bad.json()["detail"], (body, bad.json())
        assert admin.put("/v1/limits/a%20b", json=TPM).status_code == 422  # the name
        assert admin.put("/v1/limits/x", content=b"{nope").status_code in (400, 422)
        # Nothing a bad request sent changed the limit.
        assert admin.get("/v1/limits").json()["items"][0]["tokensPerMinute"] == 200000
        # Scope admin: a key without it reads and writes nothing.
        assert user.get("/v1/limits").status_code == 403
        assert user.put("/v1/limits/mine", json=TPM).status_code == 403
        # The server's limits hold every workspace's calls: an operator's, not an admin's.
        denied = admin.put("/v1/limits/fleet", json={**TPM, "scope": "server"})
        assert denied.status_code == 403 and "operator" in denied.json()["detail"]
        fleet = operator.put("/v1/limits/fleet", json={**TPM, "scope": "server"})
        assert fleet.status_code == 200 and fleet.json()["scope"] == "server"
        assert names(admin) == [("server", "fleet"), ("workspace", "openai-tpm")]
        assert names(other) == [("server", "fleet")]  # another workspace's own are not shown
        assert other.delete("/v1/limits/openai-tpm").status_code == 404
        assert admin.delete("/v1/limits/fleet", params={"scope": "server"}).status_code == 403
        assert admin.delete("/v1/limits/openai-tpm").status_code == 204
        assert admin.delete("/v1/limits/openai-tpm").status_code == 404
        assert operator.delete("/v1/limits/fleet", params={"scope": "server"}).status_code == 204
        assert names(admin) == []
        # A workspace holds at most 100 (every model call reads them); replacing one is fine.
        with ThreadPoolExecutor(8) as pool:
            made = pool.map(lambda n: other.put(f"/v1/limits/l{n}", json=TPM), range(100))
            assert {r.status_code for r in made} == {200}
        full = other.put("/v1/limits/one-more", json=TPM)
        assert full.status_code == 422 and "at most 100" in full.json()["detail"]
        assert other.put("/v1/limits/l7", json={**TPM, "tokensPerMinute": 5}).status_code == 200
        assert admin.put("/v1/limits/mine", json=TPM).status_code == 200  # another workspace


def test_the_limits_command_sets_lists_and_deletes(module_server: Server, tmp_path: Path) -> None:
    """`lantern limits` through LANTERN_URL (an admin key; an operator's for the server's
    limits) and on the database; a bad limit is one line and changes nothing."""
    workspace, admin = module_server.workspace_key("admin")
    operator = make_key(module_server.database_url, "ops", "", operator=True)
    set_ = lantern(
        module_server, admin, "limits", "set", "offline-tpm",
        "--model", "offline/*", "--tokens-per-minute", "1000",
    )  # fmt: skip
    assert set_.returncode == 0, set_.stderr
    assert json.loads(set_.stdout)["tokensPerMinute"] == 1000
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps({"match": {"model": "nobody/*"}, "requestsPerMinute": 500}))
    server = lantern(module_server, operator, "limits", "set", "fleet", str(fleet), "--server")
    assert server.returncode == 0 and json.loads(server.stdout)["scope"] == "server", server
    bad = lantern(
        module_server, admin, "limits", "set", "x", "--model", "a", "--tokens-per-minute", "0"
    )
    assert bad.returncode == 1 and len(bad.stderr.splitlines()) == 1, bad
    assert "tokensPerMinute must be an integer" in bad.stderr
    usage = lantern(module_server, admin, "limits", "set", "x")
    assert usage.returncode == 2 and usage.stderr.startswith("error: give --model"), usage
    listed = lantern(module_server, admin, "limits", "list")
    assert listed.returncode == 0, listed.stderr
    header, *lines = listed.stdout.splitlines()  # columns two or more spaces apart
    assert re.split(r"\s{2,}", header)[3:] == ["tokens/min used", "requests/min used"]
    assert [re.split(r"\s{2,}", line) for line in lines] == [
        ["fleet", "server", "nobody/*", "0 (no limit)", "0 of 500"],
        ["offline-tpm", "workspace", "offline/*", "0 of 1000", "0 (no limit)"],
    ]
    gone = lantern(module_server, admin, "limits", "delete", "offline-tpm")
    assert gone.returncode == 0 and gone.stdout.strip() == "deleted offline-tpm", gone
    assert lantern(module_server, operator, "limits", "delete", "fleet", "--server").returncode == 0
    # Without LANTERN_URL, on the database, in --workspace.
    env = {**os.environ, "LANTERN_DATABASE_URL": module_server.database_url}
    env.pop("LANTERN_URL", None)
    local = subprocess.run(
        [LANTERN, "limits", "set", "local", "--workspace", workspace,
         "--model", "offline/*", "--requests-per-minute", "7"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert local.returncode == 0, local.stderr
    with httpx.Client(
        base_url=module_server.url, headers={"Authorization": f"Bearer {admin}"}, timeout=30
    ) as http:
        [only] = http.get("/v1/limits").json()["items"]
    assert (only["name"], only["requestsPerMinute"]) == ("local", 7)
