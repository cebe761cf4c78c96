"""GET /v1/runs/{id}/stream against a real `lantern serve`, read with a plain HTTP client."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

from lantern.ids import idempotency_key
from lantern.sdk.models import Event
from lantern.sdk.stream import LiveTexts, TextDelta, TextReset
from tests.conftest import BACKENDS, pg_schema, sqlite_url
from tests.fake_llm import FakeProvider, Script
from tests.server import ALL_SCOPES, LANTERN, Server, make_key
from tests.sse import Frame, collect, frames, journal

TERMINAL = {"run_succeeded", "run_failed", "run_cancelled"}


def chain(name: str, steps: int) -> dict[str, Any]:
    nodes: list[dict[str, Any]] = [{"id": "start", "type": "trigger"}]
    edges = []
    for i in range(1, steps + 1):
        nodes.append({"id": f"s{i}", "type": "tool", "data": {"tool": "noop", "args": {"i": i}}})
        edges.append({"source": "start" if i == 1 else f"s{i - 1}", "target": f"s{i}"})
    return {"name": name, "graph": {"nodes": nodes, "edges": edges}}


def gated_model(name: str, model: str, **data: Any) -> dict[str, Any]:
    """An approval first (so followers are in place), then a model step."""
    step = {"model": model, "prompt": "{{ input.text }}", **data}
    return {
        "name": name,
        "graph": {
            "nodes": [
                {"id": "start", "type": "trigger"},
                {"id": "ok", "type": "approval", "data": {"prompt": "Go?"}},
                {"id": "draft", "type": "ai-step", "data": step},
            ],
            "edges": [
                {"source": "start", "target": "ok"},
                {"source": "ok", "target": "draft"},
            ],
        },
    }


async def client_for(server: Server, workspace: str = "alice") -> httpx.AsyncClient:
    key = await asyncio.to_thread(make_key, server.database_url, workspace, ALL_SCOPES)
    return httpx.AsyncClient(
        base_url=server.url,
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
        limits=httpx.Limits(max_connections=400, max_keepalive_connections=400),
    )


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeProvider]:
    # Words far enough apart that a loaded machine still passes them on one by one.
    provider = FakeProvider(script=Script(["Hello there, Ada Lovelace."]), chunk_delay=0.15)
    provider.start()
    yield provider
    provider.close()


@pytest.fixture(scope="module", params=BACKENDS)
def server(
    request: pytest.FixtureRequest,
    fake: FakeProvider,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Server]:
    """One server per backend for the module: the offline model's words 20 ms apart, the fake
    provider for gpt-4o-mini, and the code-first agents of tests/api/stream_app.py."""
    tmp = tmp_path_factory.mktemp("stream")
    env = {**fake.env(), "PAI_LOG": str(tmp / "calls.jsonl"), "LANTERN_OFFLINE_WORD_DELAY": "20ms"}
    with ExitStack() as stack:
        url = (
            sqlite_url(tmp)
            if request.param == "sqlite"
            else stack.enter_context(pg_schema(request.getfixturevalue("pg_base_url")))
        )
        started = Server(url, tmp / "serve.log", env=env, app="tests.api.stream_app:app")
        started.start(timeout=120)  # it imports Pydantic AI: slow on a loaded machine
        stack.callback(started.stop)
        yield started


@pytest.fixture
async def http(server: Server) -> AsyncIterator[httpx.AsyncClient]:
    client = await client_for(server, f"alice-{secrets.token_hex(4)}")
    yield client
    await client.aclose()


async def start(http: httpx.AsyncClient, definition: dict[str, Any], input: Any) -> str:
    (await http.put(f"/v1/agents/{definition['name']}", json=definition)).raise_for_status()
    created = await http.post("/v1/runs", json={"agentName": definition["name"], "input": input})
    created.raise_for_status()
    return str(created.json()["id"])


async def journal_of(http: httpx.AsyncClient, run_id: str) -> list[dict[str, Any]]:
    page = await http.get(f"/v1/runs/{run_id}/events")
    page.raise_for_status()
    return list(page.json()["items"])


async def until_waiting(stream: AsyncIterator[Frame], got: list[Frame]) -> None:
    async for frame in stream:
        got.append(frame)
        if frame.event == "journal" and frame.data["kind"] == "step_waiting":
            return
    raise AssertionError("the stream ended before the run parked")


async def test_every_event_in_seq_order_then_the_end_and_resume_after_an_id(
    http: httpx.AsyncClient,
) -> None:
    run_id = await start(http, chain("chain", 4), {})
    got = await collect(http, run_id)
    stored = await journal_of(http, run_id)
    events = journal(got)
    assert [f.seq for f in events] == [e["seq"] for e in stored] == list(range(1, len(stored) + 1))
    assert [f.data for f in events] == stored  # each frame is the event as /events shows it
    assert [f.id for f in events] == [str(e["seq"]) for e in stored]
    assert events[-1].data["kind"] == "run_succeeded"
    # Reconnecting with Last-Event-ID resumes right after it.
    resumed = journal(await collect(http, run_id, last_event_id=3))
    assert [f.seq for f in resumed] == list(range(4, len(stored) + 1))
    # Once the last event was seen, the answer is 204: an EventSource stops reconnecting.
    done = await http.get(f"/v1/runs/{run_id}/stream", headers={"Last-Event-ID": str(len(stored))})
    assert done.status_code == 204
    # Hostile or bad input: a clear problem, nothing streamed.
    bad = await http.get(f"/v1/runs/{run_id}/stream", headers={"Last-Event-ID": "x1"})
    assert bad.status_code in (400, 422)
    assert bad.headers["content-type"] == "application/problem+json"
    missing = await http.get("/v1/runs/nope/stream")
    assert missing.status_code == 404


async def test_another_workspace_cannot_follow_the_run(
    server: Server, http: httpx.AsyncClient
) -> None:
    run_id = await start(http, chain("mine", 1), {})
    bob = await client_for(server, "bob")
    try:
        answer = await bob.get(f"/v1/runs/{run_id}/stream")
        assert answer.status_code == 403
        async with httpx.AsyncClient(base_url=server.url) as nobody:
            anonymous = await nobody.get(f"/v1/runs/{run_id}/stream")
        assert anonymous.status_code == 401
    finally:
        await bob.aclose()


async def approve(http: httpx.AsyncClient, run_id: str) -> None:
    answer = await http.post(f"/v1/runs/{run_id}/approvals/ok", json={"decision": "approve"})
    answer.raise_for_status()


def items(got: list[Frame]) -> list[Event | TextDelta | TextReset]:
    out: list[Event | TextDelta | TextReset] = []
    for f in got:
        if f.event == "journal":
            out.append(Event.from_json(f.data))
        elif f.event == "delta":
            out.append(TextDelta.from_json(f.data))
        elif f.event == "reset":
            out.append(TextReset.from_json(f.data))
    return out


async def test_a_model_steps_text_arrives_as_deltas_that_are_never_journaled(
    http: httpx.AsyncClient,
) -> None:
    await _live_deltas(http)


async def _live_deltas(http: httpx.AsyncClient) -> None:
    text = "one two three four five six seven eight"
    run_id = await start(http, gated_model("live", "offline/echo"), {"text": text})
    stream = frames(http, run_id)
    got: list[Frame] = []
    await until_waiting(stream, got)
    await approve(http, run_id)
    got += [f async for f in stream]
    deltas = [f for f in got if f.event == "delta"]
    assert len(deltas) >= 2  # it came in pieces
    assert all(d.data["stepId"] == "draft" and d.data["attempt"] == 1 for d in deltas)
    assert "".join(d.data["text"] for d in deltas) == text
    assert [d.data["offset"] for d in deltas] == [
        sum(len(x.data["text"]) for x in deltas[:i]) for i in range(len(deltas))
    ]
    completed = next(
        i
        for i, f in enumerate(got)
        if f.event == "journal"
        and f.data["kind"] == "step_completed"
        and f.data["stepId"] == "draft"
    )
    assert got.index(deltas[-1]) < completed  # live, before the step's end was journaled
    assert _texts(got) == {"draft": text}
    assert all(d.id is None for d in deltas)  # a delta is no journal position
    stored = await journal_of(http, run_id)
    assert [f.data for f in journal(got)] == stored
    assert not any("delta" in e["kind"] for e in stored)


def _texts(got: list[Frame]) -> dict[str, str]:
    live = LiveTexts()
    for item in items(got):
        live.apply(item)
    return live.texts


# The same model step, broken off after two words and retried, in each kind of run that streams a
# model's text: a graph's ai-step, a code-first ctx.model, and a Pydantic AI agent's run_stream
# (durable(agent) with a real OpenAIChatModel) inside a code-first agent. (A microVM workload's
# ctx.model is a call to the control plane, which streams it: tests/runtime.)
KINDS: dict[str, tuple[str, Callable[[Any], Any]]] = {  # the model step, the answer in the output
    "graph": ("draft", lambda output: output["text"]),
    "code": ("draft", lambda output: output),
    "pydantic-ai": ("clerk.model", lambda output: output["answer"]),
}


async def start_retried(http: httpx.AsyncClient, kind: str) -> str:
    if kind == "graph":
        retry = {"maxAttempts": 2, "backoffMs": 50, "retryableClasses": ["llm"]}
        return await start(http, gated_model("flaky", "gpt-4o-mini", retry=retry), {"text": "Hi"})
    agent, input = (
        ("streamed", {"text": "Greet Ada"})
        if kind == "code"
        else ("clerk", {"question": "Hi", "stream": True})
    )
    created = await http.post("/v1/runs", json={"agentName": agent, "input": input})
    created.raise_for_status()
    return str(created.json()["id"])


@pytest.mark.parametrize("kind", list(KINDS))
async def test_a_retried_model_steps_deltas_replace_the_failed_attempts(
    http: httpx.AsyncClient, fake: FakeProvider, kind: str
) -> None:
    """Deltas on the stream, live before the step's end is journaled, never journaled; the
    stream says `reset` after the retry and before the new attempt's text, so a client shows
    the second attempt's text once, not both; each attempt sent with its own key."""
    step, answer = KINDS[kind]
    sent = len(fake.calls())
    run_id = await start_retried(http, kind)
    fake.cut("gpt-4o-mini", 2)  # the first attempt breaks off after two words
    stream = frames(http, run_id)
    got: list[Frame] = []
    await until_waiting(stream, got)
    await approve(http, run_id)
    got += [f async for f in stream]
    stored = await journal_of(http, run_id)
    kinds = [(f.event, f.data.get("kind") or f.data.get("attempt")) for f in got]
    deltas = [f for f in got if f.event == "delta"]
    assert {d.data["stepId"] for d in deltas} == {step}
    assert "".join(d.data["text"] for d in deltas if d.data["attempt"] == 1) == "Hello there, "
    second = [d for d in deltas if d.data["attempt"] == 2]
    assert len(second) >= 2  # it came in pieces
    assert "".join(d.data["text"] for d in second) == "Hello there, Ada Lovelace."
    (reset,) = [f for f in got if f.event == "reset"]
    assert reset.data == {"stepId": step, "attempt": 2, "replaces": 1}
    retrying = next(i for i, f in enumerate(got) if f.data.get("kind") == "step_retrying")
    assert retrying < got.index(reset) < got.index(second[0]), kinds
    completed = next(
        i
        for i, f in enumerate(got)
        if f.event == "journal" and f.data["kind"] == "step_completed" and f.data["stepId"] == step
    )
    assert got.index(second[-1]) < completed  # live, before the step's end was journaled
    assert _texts(got) == {step: "Hello there, Ada Lovelace."}
    assert [f.data for f in journal(got)] == stored
    assert not any("delta" in e["kind"] for e in stored)
    assert stored[-1]["kind"] == "run_succeeded"
    assert answer(stored[-1]["data"]["output"]) == "Hello there, Ada Lovelace."
    assert [r.key for r in fake.calls()[sent:]] == [
        idempotency_key(run_id, step, 1),
        idempotency_key(run_id, step, 2),
    ]


async def test_lantern_runs_follow_prints_events_and_live_text(server: Server) -> None:
    http = await client_for(server, f"follow-{secrets.token_hex(4)}")
    key = http.headers["authorization"].removeprefix("Bearer ")
    text = "alpha beta gamma delta"
    try:
        run_id = await start(http, gated_model("follow-me", "offline/echo"), {"text": text})
        env = {k: v for k, v in os.environ.items() if k != "LANTERN_DATABASE_URL"}
        env |= {"LANTERN_URL": server.url, "LANTERN_API_KEY": key, "PYTHONUNBUFFERED": "1"}
        proc = await asyncio.create_subprocess_exec(
            LANTERN, "runs", "follow", run_id, env=env, stdout=asyncio.subprocess.PIPE
        )
        assert proc.stdout is not None
        lines: list[str] = []
        while not any("step_waiting ok" in line for line in lines):
            lines.append((await asyncio.wait_for(proc.stdout.readline(), 60)).decode())
        await approve(http, run_id)
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        await http.aclose()
    printed = "".join(lines) + out.decode()
    assert proc.returncode == 0, printed
    assert f"draft ▸ {text}\n" in printed  # the live text, on one line
    assert printed.index("draft ▸") < printed.index("step_completed draft")
    assert printed.rstrip().endswith("run_succeeded")
    missing = await asyncio.to_thread(
        subprocess.run,
        [LANTERN, "runs", "follow", "run_nope"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 1 and missing.stderr.startswith("error: ")
