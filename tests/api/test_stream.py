"""GET /v1/runs/{id}/stream against a real `lantern serve`, read with a plain HTTP client."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from lantern.ids import idempotency_key
from lantern.sdk.models import Event
from lantern.sdk.stream import LiveTexts, TextDelta, TextReset
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


@pytest.fixture
async def http(api_server: Server) -> AsyncIterator[httpx.AsyncClient]:
    client = await client_for(api_server)
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
    api_server: Server, http: httpx.AsyncClient
) -> None:
    run_id = await start(http, chain("mine", 1), {})
    bob = await client_for(api_server, "bob")
    try:
        answer = await bob.get(f"/v1/runs/{run_id}/stream")
        assert answer.status_code == 403
        async with httpx.AsyncClient(base_url=api_server.url) as nobody:
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


@pytest.fixture
def slow_words(database_url: str, tmp_path: Path) -> Iterator[Server]:
    env = {"LANTERN_OFFLINE_WORD_DELAY": "20ms"}
    server = Server(database_url, tmp_path / "serve.log", env=env).start()
    yield server
    server.stop()


async def test_a_model_steps_text_arrives_as_deltas_that_are_never_journaled(
    slow_words: Server,
) -> None:
    http = await client_for(slow_words)
    try:
        await _live_deltas(http)
    finally:
        await http.aclose()


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


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    provider = FakeProvider(script=Script(["Hello there, Ada Lovelace."]), chunk_delay=0.01)
    provider.start()
    yield provider
    provider.close()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_retried_steps_deltas_replace_the_failed_attempts(
    database_url: str, tmp_path: Path, fake: FakeProvider
) -> None:
    server = Server(database_url, tmp_path / "serve.log", env=fake.env()).start()
    http = await client_for(server)
    try:
        retry = {"maxAttempts": 2, "backoffMs": 50, "retryableClasses": ["llm"]}
        definition = gated_model("flaky", "gpt-4o-mini", retry=retry)
        run_id = await start(http, definition, {"text": "Greet Ada"})
        fake.cut("gpt-4o-mini", 2)  # the first attempt breaks off after two words
        stream = frames(http, run_id)
        got: list[Frame] = []
        await until_waiting(stream, got)
        await approve(http, run_id)
        got += [f async for f in stream]
    finally:
        await http.aclose()
        server.stop()
    kinds = [(f.event, f.data.get("kind") or f.data.get("attempt")) for f in got]
    deltas = [f.data for f in got if f.event == "delta"]
    first = [d["text"] for d in deltas if d["attempt"] == 1]
    second = [d["text"] for d in deltas if d["attempt"] == 2]
    assert "".join(first) == "Hello there, "
    assert "".join(second) == "Hello there, Ada Lovelace."
    (reset,) = [f for f in got if f.event == "reset"]
    assert reset.data == {"stepId": "draft", "attempt": 2, "replaces": 1}
    retrying = next(i for i, f in enumerate(got) if f.data.get("kind") == "step_retrying")
    # The stream says so before the new attempt's text: after the retry, before its deltas.
    assert (
        retrying
        < got.index(reset)
        < min(i for i, f in enumerate(got) if f.event == "delta" and f.data["attempt"] == 2)
    ), kinds
    # A client applying the frames shows the text once: the second attempt's, not both.
    assert _texts(got) == {"draft": "Hello there, Ada Lovelace."}
    first_key, second_key = (r.key for r in fake.calls())
    assert first_key != second_key  # each attempt its own key


async def test_a_code_agents_model_step_streams_and_a_retry_replaces_its_text(
    database_url: str, tmp_path: Path, fake: FakeProvider
) -> None:
    """ctx.model streams as a graph's model step does: deltas on the stream, live before the
    step's end is journaled, never journaled, a retry's text replacing the broken attempt's."""
    app = "tests.crash.code_app:app"
    server = Server(database_url, tmp_path / "serve.log", env=fake.env(), app=app).start()
    http = await client_for(server)
    try:
        created = await http.post(
            "/v1/runs", json={"agentName": "streamed", "input": {"text": "Greet Ada"}}
        )
        created.raise_for_status()
        run_id = str(created.json()["id"])
        fake.cut("gpt-4o-mini", 2)  # the first attempt breaks off after two words
        # Words far enough apart that a loaded machine still passes them on one by one.
        fake.chunk_delay = 0.15
        stream = frames(http, run_id)
        got: list[Frame] = []
        await until_waiting(stream, got)
        await approve(http, run_id)
        got += [f async for f in stream]
        stored = await journal_of(http, run_id)
    finally:
        await http.aclose()
        server.stop()
    deltas = [f for f in got if f.event == "delta"]
    assert {d.data["stepId"] for d in deltas} == {"draft"}
    assert "".join(d.data["text"] for d in deltas if d.data["attempt"] == 1) == "Hello there, "
    second = [d for d in deltas if d.data["attempt"] == 2]
    assert len(second) >= 2  # it came in pieces
    assert "".join(d.data["text"] for d in second) == "Hello there, Ada Lovelace."
    (reset,) = [f for f in got if f.event == "reset"]
    assert reset.data == {"stepId": "draft", "attempt": 2, "replaces": 1}
    completed = next(
        i
        for i, f in enumerate(got)
        if f.event == "journal"
        and f.data["kind"] == "step_completed"
        and f.data["stepId"] == "draft"
    )
    assert got.index(second[-1]) < completed  # live, before the step's end was journaled
    assert _texts(got) == {"draft": "Hello there, Ada Lovelace."}
    assert [f.data for f in journal(got)] == stored
    assert not any("delta" in e["kind"] for e in stored)
    assert stored[-1]["kind"] == "run_succeeded"
    assert stored[-1]["data"]["output"] == "Hello there, Ada Lovelace."


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_pydantic_ai_agents_run_stream_streams_and_a_retry_replaces_its_text(
    database_url: str, tmp_path: Path, fake: FakeProvider
) -> None:
    """durable(agent).run_stream with a real OpenAIChatModel streams each model request's text
    as ctx.model does (the same test above, for a code-first ctx.model): deltas live before the
    step's end, never journaled, a retried request's text replacing the broken attempt's, and
    each attempt sent with its own key."""
    app = "tests.crash.pydantic_app:app"
    env = {**fake.env(), "PAI_LOG": str(tmp_path / "calls.jsonl")}
    server = Server(database_url, tmp_path / "serve.log", env=env, app=app).start()
    http = await client_for(server)
    try:
        created = await http.post(
            "/v1/runs", json={"agentName": "clerk", "input": {"question": "Hi", "stream": True}}
        )
        created.raise_for_status()
        run_id = str(created.json()["id"])
        fake.cut("gpt-4o-mini", 2)  # the first attempt breaks off after two words
        fake.chunk_delay = 0.15
        stream = frames(http, run_id)
        got: list[Frame] = []
        await until_waiting(stream, got)
        await approve(http, run_id)
        got += [f async for f in stream]
        stored = await journal_of(http, run_id)
    finally:
        await http.aclose()
        server.stop()
    deltas = [f for f in got if f.event == "delta"]
    assert {d.data["stepId"] for d in deltas} == {"clerk.model"}
    assert "".join(d.data["text"] for d in deltas if d.data["attempt"] == 1) == "Hello there, "
    second = [d for d in deltas if d.data["attempt"] == 2]
    assert len(second) >= 2  # it came in pieces
    assert "".join(d.data["text"] for d in second) == "Hello there, Ada Lovelace."
    (reset,) = [f for f in got if f.event == "reset"]
    assert reset.data == {"stepId": "clerk.model", "attempt": 2, "replaces": 1}
    completed = next(
        i
        for i, f in enumerate(got)
        if f.event == "journal"
        and f.data["kind"] == "step_completed"
        and f.data["stepId"] == "clerk.model"
    )
    assert got.index(second[-1]) < completed  # live, before the step's end was journaled
    assert _texts(got) == {"clerk.model": "Hello there, Ada Lovelace."}
    assert not any("delta" in e["kind"] for e in stored)
    assert stored[-1]["data"]["output"] == {"answer": "Hello there, Ada Lovelace."}
    assert [r.key for r in fake.calls()] == [
        idempotency_key(run_id, "clerk.model", 1),
        idempotency_key(run_id, "clerk.model", 2),
    ]


async def test_lantern_runs_follow_prints_events_and_live_text(slow_words: Server) -> None:
    http = await client_for(slow_words, "default")
    key = http.headers["authorization"].removeprefix("Bearer ")
    text = "alpha beta gamma delta"
    try:
        run_id = await start(http, gated_model("follow-me", "offline/echo"), {"text": text})
        env = {k: v for k, v in os.environ.items() if k != "LANTERN_DATABASE_URL"}
        env |= {"LANTERN_URL": slow_words.url, "LANTERN_API_KEY": key, "PYTHONUNBUFFERED": "1"}
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
