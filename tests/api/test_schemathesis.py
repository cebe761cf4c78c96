"""Schemathesis against the OpenAPI document a real `lantern serve` publishes (on PostgreSQL; the
found bugs' regression tests on both backends).

The fuzzer is the ``schemathesis`` CLI, run as a subprocess with a fixed seed and one worker. It
tests every operation of ``/openapi.json`` in every phase: the coverage phase (boundary values,
negative values, missing and wrong headers, unsupported methods), random fuzzing, and stateful
sequences that follow links from ``POST /v1/runs`` to the run it created. Every built-in check
is on (``not_a_server_error``, status code, content type, headers and response schema
conformance, positive and negative data acceptance, unsupported methods, ...) plus
``problem_details`` below, which this module registers as a Schemathesis hook: every 4xx and 5xx
is ``application/problem+json`` with a non-empty ``type``, ``title``, ``status`` and ``detail``.

The key has every scope and ``admin``. Before the fuzzer starts, the workspace holds the
agent ``noop`` and one finished run, and a dictionary feeds those names into path parameters
and ``agentName`` half of the time, so requests reach stored objects rather than only 404s.

Each server bug found this way (since fixed) keeps a small deterministic test below.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from schemathesis import CheckContext, Response
from schemathesis.generation.case import Case

from tests.server import ALL_SCOPES, ROOT, Server, make_key

SCHEMATHESIS = str(Path(sys.executable).parent / "schemathesis")
SEED = 20_261_130
# Random examples per operation in the fuzzing phase, most of the fuzzer's time (each example
# is a request). 40, not 80: with the fixed seed these are the same requests every run, a fixed
# corpus rather than a search; the coverage phase, whatever this number, sends every operation
# its boundary, negative, missing and wrong-type values and every unsupported method; the
# stateful phase follows a created run through the operations on it; and every bug found here
# keeps a deterministic test below on both backends.
MAX_EXAMPLES = 40
STATEFUL_EXAMPLES = 50  # scenarios of the stateful phase
PROBLEM = "application/problem+json"
NOOP = {
    "name": "noop",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "t", "type": "tool", "data": {"tool": "noop", "args": {"x": "{{ input.x }}"}}},
        ],
        "edges": [{"source": "start", "target": "t"}],
    },
}


# -- the check the fuzzer runs (loaded by the CLI through `hooks = "tests.api.test_schemathesis"`)


@schemathesis.check
def problem_details(ctx: CheckContext, response: Response, case: Case[Any]) -> bool | None:
    """A 4xx or 5xx answer is RFC 9457 problem+json with type, title, status and detail."""
    if response.status_code < 400:
        return None
    content_type = (response.headers.get("content-type") or [""])[0]
    media_type = content_type.split(";")[0].strip().lower()
    assert media_type == PROBLEM, f"{response.status_code} answered as {content_type!r}"
    body = json.loads(response.content)
    assert isinstance(body, dict), f"a problem is a JSON object, not {body!r}"
    for field, kind in (("type", str), ("title", str), ("status", int), ("detail", str)):
        value = body.get(field)
        assert isinstance(value, kind) and value != "", f"problem {field!r} missing in {body}"
    assert body["status"] == response.status_code, f"status {body['status']} in a {response}"
    return None


# -- the fuzzing run -------------------------------------------------------------------------


def with_links(doc: dict[str, Any]) -> dict[str, Any]:
    """The published document plus OpenAPI links from a created run to the operations on it."""
    paths = doc["paths"]
    by_run = {
        "GetRun": paths["/v1/runs/{run_id}"]["get"],
        "GetEvents": paths["/v1/runs/{run_id}/events"]["get"],
        "CancelRun": paths["/v1/runs/{run_id}/cancel"]["post"],
        "Approve": paths["/v1/runs/{run_id}/approvals/{node_id}"]["post"],
    }
    links = {
        name: {"operationId": op["operationId"], "parameters": {"run_id": "$response.body#/id"}}
        for name, op in by_run.items()
    }
    paths["/v1/runs"]["post"]["responses"]["202"]["links"] = links
    paths["/v1/runs/{run_id}/cancel"]["post"]["responses"]["202"]["links"] = {
        "GetRun": links["GetRun"]
    }
    agent = paths["/v1/agents/{name}"]
    agent["put"]["responses"]["200"]["links"] = {
        "GetAgent": {
            "operationId": agent["get"]["operationId"],
            "parameters": {"name": "$response.body#/name"},
        }
    }
    return doc


def toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def config(key: str, run_id: str) -> str:
    """schemathesis.toml: seed, size, auth, realistic ids, and the checks' expectations."""
    return f"""\
seed = {SEED}
workers = 1
hooks = "tests.api.test_schemathesis"
headers = {{ Authorization = {toml_string("Bearer " + key)} }}
request-timeout = 30

[generation]
max-examples = {MAX_EXAMPLES}

[phases.stateful.generation]
max-examples = {STATEFUL_EXAMPLES}

[dictionaries.runs]
values = [{toml_string(run_id)}]

[dictionaries.agents]
values = ["noop"]

[dictionaries.nodes]
values = ["t", "start"]

[parameters]
"path.run_id" = {{ dictionary = "runs", probability = 0.5 }}
"path.name" = {{ dictionary = "agents", probability = 0.5 }}
"path.node_id" = {{ dictionary = "nodes", probability = 0.5 }}
"query.agentName" = {{ dictionary = "agents", probability = 0.5 }}
"body.agentName" = {{ dictionary = "agents", probability = 0.5 }}

# Data valid to the OpenAPI types may still be refused as invalid input (422): a cursor the API
# did not give out, an agent definition the graph parser refuses (docs/tutorial.md), and any string
# with a NUL character or a lone surrogate, which no backend stores. A run that has finished
# or is not waiting at an approval answers 409.
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "404", "409", "422"]

# The microVM harness's operations take a per-VM token (docs/runtime.md) that no fuzzer can hold:
# an API key there is refused, and that refusal is the answer to check.
[[operations]]
include-path-regex = "^/v1/runtime/(report|steps|step|call)$"
checks.positive_data_acceptance.expected-statuses = ["401"]

# The runtime scheduler and nodes serve every workspace: they answer only an operator key
# (lantern keys create --operator), and the fuzzer's workspace admin key is refused (403).
[[operations]]
include-path-regex = "^/v1/runtime/(nodes|scheduler)$"
checks.positive_data_acceptance.expected-statuses = ["2xx", "403"]

# A rate limit of the whole server (``"scope": "server"``) is an operator's (docs/rate-limits.md):
# the fuzzer's workspace admin key is refused it, and that refusal is the answer to check.
[[operations]]
include-path-regex = "^/v1/limits"
checks.positive_data_acceptance.expected-statuses = ["2xx", "403", "404", "409", "422"]

"""


def seed_workspace(server: Server, key: str) -> str:
    """Apply ``noop`` and finish one run of it; return the run's id."""
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as http:
        assert http.put("/v1/agents/noop", json=NOOP).status_code == 200
        created = http.post("/v1/runs", json={"agentName": "noop", "input": {"x": 1}})
        assert created.status_code == 202, created.text
        run_id: str = created.json()["id"]
        run = http.get(f"/v1/runs/{run_id}", params={"wait": 20}).json()
        assert run["status"] == "succeeded", run
        return run_id


def crashes(log: Path) -> list[str]:
    """The exception (with its DETAIL line, if any) of every traceback in a server log."""
    found: list[str] = []
    lines = log.read_text(errors="replace").splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("Traceback (most recent call last)"):
            continue
        j = i + 1
        while j < len(lines) and (lines[j].startswith(" ") or not lines[j].strip()):
            j += 1
        found.append(" ".join(lines[j : j + 2]) if j < len(lines) else "?")
    return found


def failed_checks(ndjson: Path) -> list[tuple[int | None, str, str]]:
    """(response status, check, operation) of every failed check in an NDJSON report."""
    failed: list[tuple[int | None, str, str]] = []
    for line in ndjson.read_text().splitlines():
        event = json.loads(line)
        finished = event.get("ScenarioFinished")
        if finished is None:
            continue
        recorder = finished["recorder"]
        for case_id, checks in recorder.get("checks", {}).items():
            interaction = recorder.get("interactions", {}).get(case_id) or {}
            status = (interaction.get("response") or {}).get("status_code")
            for check in checks:
                if check["status"] != "success":
                    failed.append((status, check["name"], recorder["label"]))
    return failed


# The fuzzer runs against PostgreSQL only. What it tests is the API layer (validation, problem
# details, status codes, the document), one code for both stores; the stores differ below the
# Store protocol, where tests/conformance runs every store test on both. PostgreSQL is the
# stricter of the two (no NUL, no lone surrogate, 64-bit integers): every store-specific bug the
# fuzzer found was there, and each keeps a deterministic test below on both backends.
# A fixed number of examples: on a loaded machine they take longer than the suite's 120 s.
@pytest.mark.timeout(300)
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_api_conforms_to_its_openapi(api_server: Server, tmp_path: Path) -> None:
    key = make_key(api_server.database_url, "fuzz", ALL_SCOPES + ",admin")
    run_id = seed_workspace(api_server, key)
    doc = httpx.get(f"{api_server.url}/openapi.json", timeout=10).json()
    schema_path = tmp_path / "openapi.json"
    schema_path.write_text(json.dumps(with_links(doc)))
    config_path = tmp_path / "schemathesis.toml"
    config_path.write_text(config(key, run_id))
    summary, cases = tmp_path / "report.json", tmp_path / "report.ndjson"

    done = subprocess.run(
        [
            *(SCHEMATHESIS, "--config-file", str(config_path), "--no-color", "run"),
            *(str(schema_path), "--url", api_server.url, "--report", "json,ndjson"),
            *("--report-json-path", str(summary), "--report-ndjson-path", str(cases)),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = done.stdout[-12_000:] + done.stderr[-4_000:]
    assert summary.exists() and cases.exists(), output
    result = json.loads(summary.read_text())
    assert result["complete"] and result["errors"] == [], output
    operations = result["operations"]
    documented = sum(len(item) for item in doc["paths"].values())
    assert operations["selected"] == operations["tested"] == documented, output
    assert result["test_cases"]["generated"] >= 300, output
    assert all(p["status"] != "error" for p in result["phases"].values()), output

    failed = failed_checks(cases)
    wrong = sorted({(s, c, o) for s, c, o in failed if s is None or s < 500})
    assert wrong == [], f"{wrong}\n{output}"
    assert failed == [], f"{failed}\n{output}"
    assert crashes(api_server.log) == [], output
    assert done.returncode == 0 and result["failures"] == [], output


# -- the bugs the fuzzer found, one deterministic case each -----------------------------------


@pytest.fixture(scope="module")
def http(module_server: Server) -> Any:
    _, key = module_server.workspace_key()
    with httpx.Client(
        base_url=module_server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as client:
        assert client.put("/v1/agents/noop", json=NOOP).status_code == 200
        yield client


def test_the_openapi_document_describes_problems_and_metrics(module_server: Server) -> None:
    doc = httpx.get(f"{module_server.url}/openapi.json", timeout=10).json()
    errors = doc["paths"]["/v1/runs"]["post"]["responses"]["404"]["content"]
    metrics = doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert "schema" in errors.get(PROBLEM, {}) and "application/json" not in errors, errors
    assert "application/json" not in metrics, metrics
    assert any(t.startswith("text/plain") for t in metrics), metrics
    assert "securitySchemes" in doc.get("components", {})
    assert doc["paths"]["/v1/runs"]["post"]["security"] == [{"apiKey": []}]


def test_a_405_lists_every_method_of_the_path(http: httpx.Client) -> None:
    response = http.request("DELETE", "/v1/runs")
    assert response.status_code == 405
    allowed = {m.strip() for m in response.headers.get("allow", "").split(",")}
    assert allowed == {"GET", "POST"}, response.headers.get("allow")


# Request bodies that are valid JSON to Python's parser but that a store cannot keep or the
# response cannot echo. Each must be refused with a problem (400 or 422) and create nothing.
STRANGE_INPUTS = {
    "nul-in-string": b'{"agentName": "noop", "input": {"x": "a\\u0000b"}}',
    "nul-in-key": b'{"agentName": "noop", "input": {"a\\u0000": 1}}',
    "nul-in-agent-name": b'{"agentName": "no\\u0000op", "input": null}',
    "lone-surrogate": b'{"agentName": "noop", "input": {"x": "\\ud800"}}',
    "infinity": b'{"agentName": "noop", "input": {"x": 1e400}}',
    "nan": b'{"agentName": "noop", "input": {"x": NaN}}',
}


@pytest.mark.parametrize("body", STRANGE_INPUTS.values(), ids=list(STRANGE_INPUTS))
def test_a_create_the_store_cannot_keep_is_refused(http: httpx.Client, body: bytes) -> None:
    headers = {"content-type": "application/json"}
    before = http.get("/v1/runs").json()["items"]
    response = http.post("/v1/runs", content=body, headers=headers)
    runs = http.get("/v1/runs").json()["items"]
    # Every backend refuses what the strictest cannot store, so they behave alike.
    assert response.status_code in (400, 422), response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    assert runs == before


STRANGE_LOOKUPS = {
    "run-id": "/v1/runs/run_\x00x",
    "agent-name": "/v1/agents/a\x00b",
    "agent-filter": "/v1/runs?agentName=a%00b",
    "runs-cursor": "/v1/runs?cursor=YQA",  # base64url of "a\0"
    "agents-cursor": "/v1/agents?cursor=YQA",
}


@pytest.mark.parametrize("path", STRANGE_LOOKUPS.values(), ids=list(STRANGE_LOOKUPS))
def test_a_lookup_with_a_nul_character_is_not_a_server_error(http: httpx.Client, path: str) -> None:
    response = http.get(path.replace("\x00", "%00"))
    assert response.status_code in (404, 422), response.text
    assert response.headers["content-type"].startswith(PROBLEM)


@pytest.mark.parametrize("query", ["events?after", "agent?version"])
def test_an_integer_beyond_64_bits_is_not_a_server_error(http: httpx.Client, query: str) -> None:
    big = str(2**70)
    if query == "agent?version":
        path = f"/v1/agents/noop?version={big}"
    else:
        run_id = http.post("/v1/runs", json={"agentName": "noop", "input": {"x": 1}}).json()["id"]
        path = f"/v1/runs/{run_id}/events?after={big}"
    response = http.get(path)
    assert response.status_code == 422, response.text
