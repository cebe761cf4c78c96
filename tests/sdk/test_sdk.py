"""The Python SDK: its pure parts, then the whole client against a real `lantern serve`."""

from __future__ import annotations

import asyncio
import inspect
import json
import secrets
import threading
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

import lantern
from lantern import errors as lantern_errors
from lantern.demo.receiver import Receiver
from lantern.sdk import (
    Agent,
    ApiError,
    AsyncClient,
    AuthenticationError,
    BadRequest,
    Client,
    ConflictError,
    ConnectionFailed,
    Event,
    InvalidResponse,
    NotFoundError,
    Page,
    PayloadTooLarge,
    PermissionDenied,
    RateLimited,
    Run,
    ServerError,
    Unprocessable,
    Usage,
    WaitTimeout,
    retry,
)
from lantern.sdk.client import retry_transport_error
from lantern.sdk.errors import error_for, error_from_body
from lantern.sdk.retry import Backoff, parse_retry_after, retry_status
from tests.helpers import http_chain
from tests.server import ALL_SCOPES, Server, free_port, make_key

RUN_JSON: dict[str, Any] = {
    "id": "run_1",
    "agentName": "onboard",
    "agentVersion": 2,
    "status": "succeeded",
    "input": {"name": "Ada"},
    "output": {"ok": True},
    "error": None,
    "createdAt": "2025-01-02T03:04:05.123456+00:00",
    "updatedAt": "2025-01-02T03:04:06Z",
    "usage": {"inputTokens": 10, "outputTokens": 5, "costUsd": 0.25},
    "cancelRequested": False,
}


# Retry delays and when to retry


def test_backoff_ceiling_doubles_from_base_up_to_the_cap() -> None:
    b = Backoff()
    assert [b.ceiling(n) for n in range(7)] == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0])
    assert b.ceiling(10_000) == 5.0


def test_backoff_delay_is_full_jitter_within_bounds() -> None:
    b = Backoff()
    for attempt in range(8):
        delays = [b.delay(attempt) for _ in range(300)]
        assert all(0.0 <= d <= b.ceiling(attempt) for d in delays)
        assert max(delays) > b.ceiling(attempt) / 2  # spread over the range, not a constant
        assert min(delays) < b.ceiling(attempt) / 2


def test_retry_after_wins_over_backoff_and_is_capped() -> None:
    b = Backoff()
    assert b.delay(0, retry_after=3.0) == 3.0
    assert b.delay(5, retry_after=0.0) == 0.0
    assert b.delay(0, retry_after=3600.0) == b.max_retry_after


def test_parse_retry_after_seconds_and_http_dates() -> None:
    now = datetime(2025, 1, 1, tzinfo=UTC)
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 1.5 ") == 1.5
    assert parse_retry_after("-4") == 0.0
    assert parse_retry_after(format_datetime(now + timedelta(seconds=7), usegmt=True), now) == 7.0
    assert parse_retry_after(format_datetime(now - timedelta(seconds=7), usegmt=True), now) == 0.0
    for bad in (None, "", "soon", "nan", "inf"):
        assert parse_retry_after(bad) is None


def test_which_answers_are_retried() -> None:
    for status in (429, 502, 503, 504):
        assert retry_status(status, safe=True)
    for status in (400, 401, 403, 404, 409, 413, 422, 500, 501):
        assert not retry_status(status, safe=True)
    # cancel, approve and PUT agent: never on a 5xx (maybe done), but a 429 was refused outright
    for status in (500, 502, 503, 504):
        assert not retry_status(status, safe=False)
    assert retry_status(429, safe=False)


def test_which_transport_errors_are_retried() -> None:
    sent = httpx.ReadTimeout("slow")
    broken = httpx.RemoteProtocolError("closed")
    assert retry_transport_error(sent, safe=True)
    assert retry_transport_error(broken, safe=True)
    assert not retry_transport_error(sent, safe=False)
    assert not retry_transport_error(broken, safe=False)
    for unsent in (
        httpx.ConnectError("refused"),
        httpx.ConnectTimeout("t"),
        httpx.PoolTimeout("p"),
    ):
        assert retry_transport_error(unsent, safe=False)
    assert not retry_transport_error(httpx.UnsupportedProtocol("ftp"), safe=True)


# The error tree


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, BadRequest),
        (401, AuthenticationError),
        (403, PermissionDenied),
        (404, NotFoundError),
        (409, ConflictError),
        (413, PayloadTooLarge),
        (422, Unprocessable),
        (429, RateLimited),
        (500, ServerError),
        (503, ServerError),
        (418, ApiError),
    ],
)
def test_a_problem_maps_by_status(status: int, cls: type[ApiError]) -> None:
    problem = {"type": "https://x/t", "title": "T", "status": status, "detail": "why", "more": 1}
    err = error_for(status, problem)
    assert type(err) is cls
    assert isinstance(err, lantern.LanternError)
    assert (err.status, err.title, err.detail, err.type) == (status, "T", "why", "https://x/t")
    assert err.problem is problem
    assert str(err) == f"{status} T: why"


def test_errors_join_the_embedded_tree() -> None:
    assert isinstance(error_for(404, {}), lantern.NotFound)
    assert isinstance(error_for(401, {}), lantern_errors.Unauthorized)
    assert isinstance(error_for(403, {}), lantern_errors.Forbidden)
    assert isinstance(error_for(409, {}), lantern_errors.Conflict)
    for status in (400, 413, 422):
        assert isinstance(error_for(status, {}), lantern.UsageError)
    for status in (401, 403, 409, 500):
        assert not isinstance(error_for(status, {}), lantern.UsageError)
    assert issubclass(ConnectionFailed, lantern.LanternError)
    assert issubclass(ConnectionFailed, ConnectionError)
    assert issubclass(WaitTimeout, lantern.LanternError)
    assert issubclass(WaitTimeout, TimeoutError)
    assert issubclass(InvalidResponse, lantern.LanternError)


def test_unprocessable_carries_every_problem() -> None:
    problem = {"title": "Invalid agent definition", "detail": "2 problems", "errors": ["a", "b"]}
    err = error_for(422, problem)
    assert isinstance(err, Unprocessable)
    assert err.errors == ["a", "b"]
    assert error_for(422, {"detail": "bad input"}).errors == []  # type: ignore[attr-defined]


def test_a_body_that_is_not_a_problem_still_maps_by_status() -> None:
    err = error_from_body(502, "<html>Bad gateway</html>\n")
    assert isinstance(err, ServerError)
    assert (err.title, err.detail, err.type) == (
        "Bad Gateway",
        "<html>Bad gateway</html>",
        "about:blank",
    )
    empty = error_from_body(401, "")
    assert isinstance(empty, AuthenticationError)
    assert str(empty) == "401 Unauthorized"
    listed = error_from_body(422, json.dumps({"detail": [{"loc": ["body"], "msg": "missing"}]}))
    assert isinstance(listed, Unprocessable)
    assert "missing" in listed.detail
    assert isinstance(error_from_body(404, "[1, 2]"), NotFoundError)


# Typed results


def test_run_parses_camel_case_times_usage_and_ignores_unknown_fields() -> None:
    run = Run.from_json({**RUN_JSON, "someFutureField": {"x": 1}})
    assert run.id == "run_1"
    assert (run.agent_name, run.agent_version, run.status) == ("onboard", 2, "succeeded")
    assert run.input == {"name": "Ada"} and run.output == {"ok": True} and run.error is None
    assert run.created_at == datetime(2025, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    assert run.updated_at == datetime(2025, 1, 2, 3, 4, 6, tzinfo=UTC)
    assert run.usage == Usage(input_tokens=10, output_tokens=5, cost_usd=0.25)
    assert run.finished and not run.cancel_requested
    with pytest.raises(AttributeError):
        run.status = "failed"  # type: ignore[misc]


def test_run_without_usage_or_cancel_flag_gets_defaults() -> None:
    bare = {k: v for k, v in RUN_JSON.items() if k not in ("usage", "cancelRequested")}
    run = Run.from_json({**bare, "status": "running"})
    assert run.usage == Usage() and run.cancel_requested is False and not run.finished


def test_event_agent_and_page_parse() -> None:
    event = Event.from_json(
        {
            "seq": 3,
            "runId": "run_1",
            "stepId": "s1",
            "nodeId": "notify",
            "kind": "step_completed",
            "attempt": 1,
            "data": {"output": 1},
            "at": "2025-01-02T03:04:05+00:00",
            "hash": "ignored",
        }
    )
    assert (event.seq, event.run_id, event.step_id, event.node_id) == (3, "run_1", "s1", "notify")
    assert (event.kind, event.attempt, event.data) == ("step_completed", 1, {"output": 1})
    started = Event.from_json(
        {"seq": 1, "runId": "r", "stepId": None, "nodeId": None, "kind": "run_started",
         "attempt": None, "data": {}, "at": "2025-01-02T03:04:05Z"}
    )  # fmt: skip
    assert started.step_id is None and started.attempt is None
    definition = {"name": "a", "graph": {"nodes": [], "edges": []}}
    agent = Agent.from_json(
        {"name": "a", "version": 4, "definition": definition, "createdAt": "2025-01-02T03:04:05Z"}
    )
    assert (agent.name, agent.version, agent.definition) == ("a", 4, definition)
    page = Page.from_json({"items": [RUN_JSON, RUN_JSON], "nextCursor": "c2"}, Run.from_json)
    assert len(page.items) == 2 and page.next_cursor == "c2"
    assert Page.from_json({"items": []}, Run.from_json) == Page(items=())


# Configuration and the shape of the two clients


def test_url_and_key_come_from_the_arguments_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LANTERN_URL", raising=False)
    monkeypatch.delenv("LANTERN_API_KEY", raising=False)
    with pytest.raises(lantern.UsageError, match="LANTERN_URL"):
        AsyncClient(api_key="k")
    with pytest.raises(lantern.UsageError, match="LANTERN_API_KEY"):
        AsyncClient("http://127.0.0.1:1")
    with pytest.raises(lantern.UsageError, match="http"):
        AsyncClient("127.0.0.1:8787", "k")
    monkeypatch.setenv("LANTERN_URL", "http://127.0.0.1:1/")
    monkeypatch.setenv("LANTERN_API_KEY", "k")
    with Client() as client:
        assert client.base_url == "http://127.0.0.1:1"
        assert "k" not in repr(client)


def test_the_sync_client_has_every_method_of_the_async_one_with_the_same_signature() -> None:
    public = {n for n in dir(AsyncClient) if not n.startswith("_")} - {"aclose"}
    methods = {n for n in public if inspect.isfunction(getattr(AsyncClient, n))}
    assert methods <= set(dir(Client))
    for name in methods:
        a = inspect.signature(getattr(AsyncClient, name))
        s = inspect.signature(getattr(Client, name))
        assert list(a.parameters.values()) == list(s.parameters.values()), name
        iterator = inspect.isasyncgenfunction(getattr(AsyncClient, name))
        assert (str(s.return_annotation).startswith("Iterator[")) == iterator, name


async def test_a_get_where_nothing_listens_fails_after_retries_with_backoff(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(retry._random, "random", lambda: 1.0)  # the longest jittered waits
    caplog.set_level("INFO", logger="lantern.sdk")
    async with AsyncClient(f"http://127.0.0.1:{free_port()}", "key", max_retries=3) as client:
        started = time.monotonic()
        with pytest.raises(ConnectionFailed, match="after 4 attempts") as caught:
            await client.get_run("run_x")
        took = time.monotonic() - started
    assert isinstance(caught.value.__cause__, httpx.ConnectError)
    assert took >= 0.2 + 0.4 + 0.8
    assert [r.getMessage().split(" in ")[0] for r in caplog.records] == [
        "retrying GET /v1/runs/run_x"
    ] * 3
    async with AsyncClient(f"http://127.0.0.1:{free_port()}", "key") as down:
        assert not await down.health()  # one attempt, no retries: at once


def test_the_sync_client_raises_the_same_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry._random, "random", lambda: 0.0)
    with Client(f"http://127.0.0.1:{free_port()}", "key", max_retries=2) as client:
        with pytest.raises(ConnectionFailed, match="after 3 attempts"):
            client.list_runs()
        # Not idempotent by key, but a refused connection means the request never left.
        with pytest.raises(ConnectionFailed, match="after 3 attempts"):
            client.cancel("run_x")
        assert not client.health()
    with pytest.raises(lantern.UsageError, match="closed"):
        client.get_run("run_x")


# Against a real `lantern serve`, on SQLite and PostgreSQL

BARE = {"name": "bare", "graph": {"nodes": [{"id": "start", "type": "trigger"}], "edges": []}}
ECHO = {
    "name": "echo",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "t", "type": "tool", "data": {"tool": "noop", "args": {"x": "{{ input.x }}"}}},
        ],
        "edges": [{"source": "start", "target": "t"}],
    },
}


@pytest.fixture
def api_server(module_server: Server) -> Server:
    """The module's server (both backends): each test's keys are in workspaces of their own."""
    return module_server


@pytest.fixture
def workspace() -> str:
    return f"sdk-{secrets.token_hex(4)}"


@pytest.fixture
def key(api_server: Server, workspace: str) -> str:
    """A key with every scope in the test's workspace."""
    return make_key(api_server.database_url, workspace, ALL_SCOPES)


@pytest.fixture
def reader_key(api_server: Server, workspace: str) -> str:
    """A key of the test's workspace that may only read runs."""
    return make_key(api_server.database_url, workspace, "runs:read")


@pytest.fixture
def outsider_key(api_server: Server, workspace: str) -> str:
    """A key with every scope in another workspace."""
    return make_key(api_server.database_url, f"elsewhere-{workspace}", ALL_SCOPES)


def release_when_held(receiver: Receiver, after: float) -> list[float]:
    """Let the held request go ``after`` seconds after it arrived; gives the release time."""
    released: list[float] = []

    def run() -> None:
        if receiver.arrived.wait(20):
            time.sleep(after)
        released.append(time.monotonic())
        receiver.release()

    threading.Thread(target=run, daemon=True).start()
    return released


async def test_apply_get_and_list_agents(api_server: Server, key: str) -> None:
    async with AsyncClient(api_server.url, key) as client:
        assert await client.health()
        first = await client.apply_agent(ECHO)
        second = await client.apply_agent(ECHO)
        assert (first.name, first.version, second.version) == ("echo", 1, 2)
        assert first.definition == ECHO and first.created_at.tzinfo is not None
        assert (await client.get_agent("echo")).version == 2
        assert (await client.get_agent("echo", version=1)).version == 1
        for name in ("a1", "a2", "a3"):
            await client.apply_agent({**BARE, "name": name})
        page = await client.list_agents(limit=2)
        assert len(page.items) == 2 and page.next_cursor is not None
        names = [a.name async for a in client.iter_agents(limit=2)]
        assert sorted(names) == ["a1", "a2", "a3", "echo"]

        broken = {
            "name": "broken",
            "graph": {
                "nodes": [{"id": "start", "type": "trigger"}, {"id": "x", "type": "teleport"}],
                "edges": [{"source": "start", "target": "nowhere"}],
            },
        }
        with pytest.raises(Unprocessable) as caught:
            await client.apply_agent(broken)
        assert caught.value.status == 422 and len(caught.value.errors) >= 2, caught.value.problem
        assert isinstance(caught.value, lantern.UsageError)
        with pytest.raises(NotFoundError):
            await client.get_agent("broken")


async def test_create_idempotently_wait_and_read_the_journal(
    api_server: Server, key: str, receiver: Receiver
) -> None:
    async with AsyncClient(api_server.url, key) as client:
        await client.apply_agent(BARE)
        await client.apply_agent(ECHO)
        await client.apply_agent(http_chain("chain", receiver.url, 3))

        bare = await client.create_run("bare")
        assert bare.agent_name == "bare" and bare.agent_version == 1
        assert (await client.wait(bare.id, timeout=20)).status == "succeeded"

        first = await client.create_run("echo", {"x": 1}, idempotency_key="order-42")
        again = await client.create_run("echo", {"x": 1}, idempotency_key="order-42")
        assert again.id == first.id and again.input == {"x": 1}
        with pytest.raises(ConflictError) as conflict:
            await client.create_run("echo", {"x": 2}, idempotency_key="order-42")
        assert conflict.value.status == 409 and "order-42" in conflict.value.detail
        other = await client.create_run("echo", {"x": 1})  # a fresh random key: a new run
        assert other.id != first.id
        done = await client.wait(first.id, timeout=20)
        assert done.status == "succeeded" and done.finished and done.updated_at >= done.created_at

        run = await client.create_run("chain", {"n": 1})
        got = await client.get_run(run.id, wait=20)
        assert got.status == "succeeded" and got.id == run.id
        journal = await client.events(run.id)
        assert [e.seq for e in journal] == sorted({e.seq for e in journal})
        assert journal[0].kind == "run_started" and journal[-1].kind == "run_succeeded"
        assert {e.node_id for e in journal if e.kind == "step_completed"} >= {"s1", "s2", "s3"}
        assert all(e.run_id == run.id for e in journal)
        assert await client.events(run.id, after=journal[1].seq, limit=2) == journal[2:4]
        assert [e async for e in client.follow(run.id)] == journal  # a finished run: at once
        assert [e async for e in client.follow(run.id, after=journal[-2].seq)] == journal[-1:]


async def test_follow_a_live_run_to_its_end(
    api_server: Server, key: str, receiver: Receiver
) -> None:
    async with AsyncClient(api_server.url, key) as client:
        await client.apply_agent(http_chain("chain", receiver.url, 3))
        receiver.hold("/s2")
        released = release_when_held(receiver, after=0.5)
        run = await client.create_run("chain", {"n": 2})
        seen: list[tuple[float, Event]] = []
        async for event in client.follow(run.id, poll=0.2):
            seen.append((time.monotonic(), event))
        events = [e for _, e in seen]
        assert events == await client.events(run.id)
        assert events[-1].kind == "run_succeeded"
        assert seen[0][0] < released[0]  # yielded while the run was still in flight


async def test_list_runs_page_by_page(api_server: Server, key: str) -> None:
    async with AsyncClient(api_server.url, key) as client:
        await client.apply_agent(BARE)
        await client.apply_agent(ECHO)
        ids = [(await client.create_run("bare", {"i": i})).id for i in range(5)]
        await client.create_run("echo", {"x": 0})
        newest_first = list(reversed(ids))

        pages: list[Page[Run]] = [await client.list_runs(agent_name="bare", limit=2)]
        while pages[-1].next_cursor is not None:
            cursor = pages[-1].next_cursor
            pages.append(await client.list_runs(agent_name="bare", limit=2, cursor=cursor))
        assert [len(p.items) for p in pages] == [2, 2, 1]
        assert [r.id for p in pages for r in p.items] == newest_first
        assert [r.id async for r in client.iter_runs(agent_name="bare", limit=2)] == newest_first
        assert len([r async for r in client.iter_runs()]) == 6
        for run_id in ids:
            await client.wait(run_id, timeout=20)
        done = [r.id async for r in client.iter_runs(status="succeeded", agent_name="bare")]
        assert done == newest_first


async def test_cancel_a_running_run(api_server: Server, key: str, receiver: Receiver) -> None:
    async with AsyncClient(api_server.url, key) as client:
        await client.apply_agent(http_chain("chain", receiver.url, 2))
        receiver.hold("/s1")
        run = await client.create_run("chain", {"n": 3})
        assert await asyncio.to_thread(receiver.arrived.wait, 20)  # s1 is in flight
        cancelled = await client.cancel(run.id)
        assert cancelled.status == "cancelled" or cancelled.cancel_requested
        final = await client.wait(run.id, timeout=20)
        receiver.release()
        assert final.status == "cancelled", final
        assert (await client.events(run.id))[-1].kind == "run_cancelled"
        with pytest.raises(ConflictError):
            await client.cancel(run.id)  # already finished


async def test_decide_at_an_approval_and_see_a_runs_children(api_server: Server, key: str) -> None:
    noop = {"tool": "noop", "args": {"n": "{{ input.n }}"}}
    child = {
        "name": "kid",
        "graph": {
            "nodes": [
                {"id": "start", "type": "trigger"},
                {"id": "t", "type": "tool", "data": noop},
            ],
            "edges": [{"source": "start", "target": "t"}],
        },
    }
    parent = {
        "name": "gated",
        "graph": {
            "nodes": [
                {"id": "start", "type": "trigger"},
                {"id": "ok", "type": "approval", "data": {"prompt": "Go?"}},
                {
                    "id": "sub",
                    "type": "subagent",
                    "data": {"agentName": "kid", "input": "{{ input }}"},
                },
            ],
            "edges": [{"source": "start", "target": "ok"}, {"source": "ok", "target": "sub"}],
        },
    }
    async with AsyncClient(api_server.url, key) as client:
        await client.apply_agent(child)
        await client.apply_agent(parent)
        run = await client.create_run("gated", {"n": 5})
        for _ in range(400):
            if (await client.get_run(run.id)).status == "waiting":
                break
            await asyncio.sleep(0.05)
        decided = await client.approve(run.id, "ok", "approve", "looks right")
        assert decided["decision"] == "approved" and decided["comment"] == "looks right"
        with pytest.raises(ConflictError):
            await client.approve(run.id, "ok", "reject")
        done = await client.wait(run.id, timeout=20)
        assert done.status == "succeeded" and done.output == {"n": 5}
        assert len(done.children) == 1
        kid = await client.get_run(done.children[0])
        assert kid.parent_run_id == run.id and kid.agent_name == "kid"


async def test_errors_carry_the_problem(
    api_server: Server, key: str, reader_key: str, outsider_key: str
) -> None:
    url = api_server.url
    async with AsyncClient(url, "lk_nobody_secret") as stranger:
        with pytest.raises(AuthenticationError) as unknown:
            await stranger.list_runs()
        assert unknown.value.status == 401 and unknown.value.detail
        assert unknown.value.problem["status"] == 401

    async with AsyncClient(url, key) as client:
        await client.apply_agent(BARE)
        run = await client.create_run("bare")
        with pytest.raises(NotFoundError) as missing:
            await client.get_run("run_000000000000")
        assert isinstance(missing.value, lantern.NotFound) and missing.value.status == 404
        assert "run_000000000000" in missing.value.detail
        with pytest.raises(NotFoundError):
            await client.create_run("nobody")
        with pytest.raises(Unprocessable):
            await client.get_run(run.id, wait=120)  # the server waits at most 60 s
        with pytest.raises(ConflictError):
            await client.approve(run.id, "start")  # not waiting at an approval
        with pytest.raises(PayloadTooLarge) as large:
            await client.create_run("bare", "x" * (10 * 1024 * 1024 + 1))
        assert isinstance(large.value, lantern.UsageError) and large.value.status == 413

    # The sync client from inside a running event loop: it blocks this loop for the call
    # (its own loop runs in its own thread), but it does not deadlock.
    with Client(url, key) as blocking:
        assert blocking.get_run(run.id).id == run.id

    async with AsyncClient(url, reader_key) as reader:
        assert (await reader.get_run(run.id)).id == run.id
        with pytest.raises(PermissionDenied) as denied:
            await reader.create_run("bare")
        assert denied.value.status == 403 and "runs:execute" in denied.value.detail
        with pytest.raises(PermissionDenied):
            await reader.apply_agent(BARE)
    async with AsyncClient(url, outsider_key) as outsider:
        with pytest.raises(PermissionDenied):
            await outsider.get_run(run.id)


def test_the_sync_client_does_the_same(api_server: Server, key: str, receiver: Receiver) -> None:
    with Client(api_server.url, key) as client:
        assert client.health()
        assert client.apply_agent(http_chain("chain", receiver.url, 2)).version == 1
        run = client.create_run("chain", {"n": 4}, idempotency_key="sync-1")
        assert client.create_run("chain", {"n": 4}, idempotency_key="sync-1").id == run.id
        followed = list(client.follow(run.id, poll=0.2))
        assert followed[-1].kind == "run_succeeded"
        assert client.events(run.id) == followed
        assert client.wait(run.id, timeout=5).status == "succeeded"
        assert client.get_run(run.id).output is not None
        assert [r.id for r in client.iter_runs(limit=1)] == [run.id]
        assert client.list_runs().items[0].id == run.id
        assert [a.name for a in client.iter_agents()] == ["chain"]
        with pytest.raises(NotFoundError):
            client.get_run("run_000000000000")
        with pytest.raises(ConflictError):
            client.cancel(run.id)
        with pytest.raises(WaitTimeout) as slow:
            receiver.hold("/s1")
            client.wait(client.create_run("chain", {"n": 5}).id, timeout=0.3)
        receiver.release()
        assert slow.value.run.status in ("queued", "running") and slow.value.timeout == 0.3
        # Leaving a generator early closes its async iterator on the client's loop.
        first = next(iter(client.follow(run.id)))
        assert first.kind == "run_started"
