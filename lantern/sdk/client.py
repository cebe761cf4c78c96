"""``AsyncClient``: the one implementation of the Python client of Lantern's REST API.

    async with lantern.AsyncClient("http://127.0.0.1:8787", api_key) as client:
        await client.apply_agent(definition)
        run = await client.create_run("onboard", {"name": "Ada"})
        async for event in client.follow(run.id):
            print(event.seq, event.kind)
        run = await client.wait(run.id, timeout=60)

``lantern.Client`` (``lantern/sdk/sync.py``) is a thin blocking wrapper over this class. Errors are
the tree drawn in ``lantern/sdk/errors.py``; when a request is retried is ``lantern/sdk/retry.py``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import Any, Literal, Self

import httpx

from lantern.errors import LanternError, UsageError
from lantern.proxies import proxy_for
from lantern.sdk.errors import ConnectionFailed, InvalidResponse, WaitTimeout, error_from_body
from lantern.sdk.models import (
    Agent,
    Delivery,
    Event,
    EventPage,
    Page,
    PendingApproval,
    Receipt,
    Run,
    RunStatus,
    Worker,
)
from lantern.sdk.retry import Backoff, parse_retry_after, retry_status, retry_transport
from lantern.sdk.stream import StreamItem, follow_stream
from lantern.sdk.wire import param, parsed, seconds, seg

# The request was never sent: retrying cannot do anything twice.
NOT_SENT: tuple[type[httpx.TransportError], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
)
# A configuration mistake, not a passing failure.
NEVER_RETRIED: tuple[type[httpx.TransportError], ...] = (httpx.UnsupportedProtocol,)
Decision = Literal["approve", "reject"]

MAX_WAIT = 60.0  # the server's longest long-poll, in seconds
log = logging.getLogger("lantern.sdk")


class AsyncClient:
    """A connection to one Lantern server, with one API key (hence one workspace).

    ``base_url`` and ``api_key`` default to ``LANTERN_URL`` and ``LANTERN_API_KEY``. ``timeout``
    bounds each HTTP request (a long-poll gets its wait on top); ``max_retries`` is how many
    extra attempts a retried call may make.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        max_retries: int = 3,
    ) -> None:
        url = base_url or os.environ.get("LANTERN_URL")
        key = api_key or os.environ.get("LANTERN_API_KEY")
        if not url:
            raise UsageError("no Lantern server URL: pass base_url or set LANTERN_URL")
        if not url.startswith(("http://", "https://")):
            raise UsageError(f"the Lantern server URL must start with http:// or https://: {url}")
        if not key:
            raise UsageError("no Lantern API key: pass api_key or set LANTERN_API_KEY")
        if max_retries < 0 or timeout <= 0:
            raise UsageError("max_retries must be >= 0 and timeout > 0")
        proxy_for(url)  # one it cannot use: a usage line now, not httpx's ImportError later
        self.base_url = url.rstrip("/")
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = Backoff()
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {key}", "Accept": "application/json"},
            timeout=timeout,
        )

    def __repr__(self) -> str:
        return f"AsyncClient({self.base_url!r})"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # Runs

    async def create_run(
        self,
        agent_name: str,
        input: Any = None,
        *,
        idempotency_key: str | None = None,
        wait: float | None = None,
        priority: int | None = None,
    ) -> Run:
        """Start a run of the agent's newest version. The request always carries an
        idempotency key (a random one unless given), so it is safely retried: the same key
        with the same body gives back the same run; with another body, ``ConflictError``.
        With ``wait`` (0 to 60 seconds), the server answers once the run finished, or when the
        wait is over with the run as it is then: a short run in one request. ``priority``
        (0 to 9, default 5): among queued runs that may start, a higher one starts first."""
        key = idempotency_key or uuid.uuid4().hex
        body: dict[str, Any] = {"agentName": agent_name, "input": input}
        if priority is not None:
            body["priority"] = priority
        params = None if wait is None else {"wait": seconds(wait)}
        extra = 0.0 if wait is None else max(wait, 0.0)
        data = await self._send(
            "POST",
            "/v1/runs",
            safe=True,
            json=body,
            headers={"Idempotency-Key": key},
            params=params,
            extra=extra,
        )
        return parsed(Run.from_json, data)

    async def get_run(self, run_id: str, *, wait: float | None = None) -> Run:
        """The run. With ``wait`` (0 to 60 seconds), the server answers as soon as the run is
        finished, or when the wait is over with the run as it is then."""
        params = None if wait is None else {"wait": seconds(wait)}
        extra = 0.0 if wait is None else max(wait, 0.0)
        data = await self._send("GET", f"/v1/runs/{seg(run_id)}", params=params, extra=extra)
        return parsed(Run.from_json, data)

    async def list_runs(
        self,
        *,
        status: RunStatus | None = None,
        agent_name: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page[Run]:
        """One page of runs, newest first."""
        params = {"status": status, "agentName": agent_name, "limit": limit, "cursor": cursor}
        data = await self._send("GET", "/v1/runs", params=params)
        return parsed(lambda d: Page.from_json(d, Run.from_json), data)

    async def iter_runs(
        self,
        *,
        status: RunStatus | None = None,
        agent_name: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> AsyncIterator[Run]:
        """Every run, newest first, page after page (``limit`` is the page size)."""
        while True:
            page = await self.list_runs(
                status=status, agent_name=agent_name, limit=limit, cursor=cursor
            )
            for run in page.items:
                yield run
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def events(
        self,
        run_id: str,
        *,
        after: int = 0,
        limit: int | None = None,
        expand_outputs: bool = False,
    ) -> list[Event]:
        """One page of the run's journal: the events with ``seq > after``, in order. With
        ``expand_outputs``, an output stored apart (``outputRef``, over 16 KiB) is in the
        event's ``data`` as ``output`` beside its reference."""
        return list((await self._events(run_id, after, limit, expand_outputs)).items)

    async def blob(self, run_id: str, ref: str) -> Any:
        """The value a ``sha256:`` reference in the run's journal stands for (an
        ``outputRef``); ``NotFound`` for a reference the run does not hold."""
        return await self._send("GET", f"/v1/runs/{seg(run_id)}/blobs/{seg(ref)}")

    async def deliveries(self, run_id: str) -> list[Delivery]:
        """The run's claimed deliveries and their status."""
        data = await self._send("GET", f"/v1/runs/{seg(run_id)}/deliveries")
        return parsed(lambda d: [Delivery.from_json(item) for item in d["items"]], data)

    async def follow(
        self, run_id: str, *, after: int = 0, poll: float = 0.5
    ) -> AsyncIterator[Event]:
        """Every event of the run as it is journaled, until the run is finished (the last one
        is then ``run_succeeded``, ``run_failed`` or ``run_cancelled``). Between reads of the
        journal it long-polls the run for up to ``poll`` seconds, which ends early when the run
        finishes, so the end comes at once and an idle run costs a request per ``poll``."""
        finished = False
        while True:
            page = await self._events(run_id, after, None)
            for event in page.items:
                yield event
                after = event.seq
            if page.next_after is not None:
                continue
            if finished:
                return  # a finished run's status and last event commit together: all are read
            finished = (await self.get_run(run_id, wait=poll)).finished

    async def stream(self, run_id: str, *, after: int = 0) -> AsyncIterator[StreamItem]:
        """The run as it happens (``GET /v1/runs/{id}/stream``): each journal ``Event`` as it is
        committed, and ``TextDelta``/``TextReset`` items carrying model steps' text as it is
        generated, until the run's terminal event. A dropped connection is followed again with
        ``Last-Event-ID``, so no event is missed or repeated; ``LiveTexts`` assembles the text."""
        path = f"/v1/runs/{seg(run_id)}/stream"
        async for item in follow_stream(
            self._http, run_id, path, after=after, backoff=self.backoff
        ):
            yield item

    async def wait(self, run_id: str, *, timeout: float | None = None) -> Run:  # noqa: ASYNC109
        """The run once finished. With ``timeout`` (seconds), ``WaitTimeout`` when it passes
        first. A run parked on an approval is not finished: it waits for the decision."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            left = MAX_WAIT if deadline is None else deadline - loop.time()
            run = await self.get_run(run_id, wait=min(max(left, 0.0), MAX_WAIT))
            if run.finished:
                return run
            if deadline is not None and loop.time() >= deadline:
                raise WaitTimeout(run, timeout or 0.0)

    async def approve(
        self,
        run_id: str,
        node_id: str,
        decision: Decision = "approve",
        comment: str | None = None,
    ) -> dict[str, Any]:
        """Approve (or, with ``decision="reject"``, reject) a run parked at an approval, a
        confidence gate or an anomaly's pause (named ``anomaly:<kind>``); the run resumes on
        whichever replica claims it. The answer is the decision recorded: ``runId``,
        ``nodeId``, ``decision`` (approved or rejected), ``decidedBy`` and ``comment``. A
        second decision, or one at a node that is not waiting, raises ``ConflictError``."""
        body: dict[str, Any] = {"decision": decision}
        if comment is not None:
            body["comment"] = comment
        path = f"/v1/runs/{seg(run_id)}/approvals/{seg(node_id)}"
        answer = await self._send("POST", path, safe=False, json=body)
        if not isinstance(answer, dict) or "decision" not in answer:
            raise InvalidResponse(f"unexpected answer to a decision: {answer!r}")
        return answer

    async def signal(
        self,
        run_id: str,
        name: str,
        payload: Any = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Send the signal ``name`` with ``payload`` to a run (docs/signals.md): its first wait
        for that name, now or later, takes it. The answer is ``{id, name, runId}`` once the
        signal is stored. The request always carries an idempotency key (a random one unless
        given), so it is safely retried: the same key sends one signal. A finished run raises
        ``ConflictError``."""
        key = idempotency_key or uuid.uuid4().hex
        path = f"/v1/runs/{seg(run_id)}/signals/{seg(name)}"
        answer = await self._send(
            "POST", path, safe=True, json={"payload": payload}, headers={"Idempotency-Key": key}
        )
        if not isinstance(answer, dict) or "id" not in answer:
            raise InvalidResponse(f"unexpected answer to a signal: {answer!r}")
        return answer

    async def cancel(self, run_id: str) -> Run:
        """Cancel a queued, running or waiting run. A running run may come back still running
        with ``cancel_requested`` set while its replica stops it; ``wait()`` for the end. A run
        already finished raises ``ConflictError``."""
        path = f"/v1/runs/{seg(run_id)}/cancel"
        return parsed(Run.from_json, await self._send("POST", path, safe=False))

    async def pending_approvals(self, *, limit: int | None = None) -> list[PendingApproval]:
        """The approvals the workspace's runs wait on with no decision yet, oldest first."""
        params = {"status": "pending", "limit": limit}
        data = await self._send("GET", "/v1/approvals", params=params)
        return parsed(lambda d: [PendingApproval.from_json(i) for i in d["items"]], data)

    async def retry(self, run_id: str, *, from_step: str | None = None) -> Run:
        """A new run of a failed or cancelled run's agent version that replays its completed
        steps before ``from_step`` (all of them when None) and runs on from there. A run that
        succeeded raises ``ConflictError``."""
        body = {} if from_step is None else {"fromStep": from_step}
        path = f"/v1/runs/{seg(run_id)}/retry"
        return parsed(Run.from_json, await self._send("POST", path, safe=False, json=body))

    async def resume(self, run_id: str, version: str) -> Run:
        """Move a code-first run waiting for a version of its code onto ``version``."""
        path = f"/v1/runs/{seg(run_id)}/resume"
        body = {"version": version}
        return parsed(Run.from_json, await self._send("POST", path, json=body, safe=False))

    async def receipt(self, run_id: str) -> Receipt:
        """The finished run's signed receipt (``ConflictError`` while it is unfinished)."""
        data = await self._send("GET", f"/v1/runs/{seg(run_id)}/receipt")
        return parsed(Receipt.from_json, data)

    async def receipt_keys(self) -> list[dict[str, Any]]:
        """The public keys that verify receipts, as JWKs (``kty`` OKP, ``crv`` Ed25519)."""
        data = await self._send("GET", "/v1/receipts/keys")
        return parsed(lambda d: [dict(k) for k in d["keys"]], data)

    # Agents

    async def apply_agent(self, definition: Mapping[str, Any]) -> Agent:
        """Store the definition as the agent's next version. An invalid one
        raises ``Unprocessable`` with every problem in ``errors``."""
        name = definition.get("name")
        if not isinstance(name, str) or not name:
            raise UsageError("an agent definition needs a non-empty string 'name'")
        path = f"/v1/agents/{seg(name)}"
        data = await self._send("PUT", path, safe=False, json=dict(definition))
        return parsed(Agent.from_json, data)

    async def get_agent(self, name: str, *, version: int | None = None) -> Agent:
        """The agent's newest version, or the given one."""
        params = {"version": version}
        data = await self._send("GET", f"/v1/agents/{seg(name)}", params=params)
        return parsed(Agent.from_json, data)

    async def list_agents(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> Page[Agent]:
        """One page of agents."""
        data = await self._send("GET", "/v1/agents", params={"limit": limit, "cursor": cursor})
        return parsed(lambda d: Page.from_json(d, Agent.from_json), data)

    async def iter_agents(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> AsyncIterator[Agent]:
        """Every agent, page after page (``limit`` is the page size)."""
        while True:
            page = await self.list_agents(limit=limit, cursor=cursor)
            for agent in page.items:
                yield agent
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def workers(self) -> list[Worker]:
        """The replicas sharing the server's database (scope ``admin``)."""
        data = await self._send("GET", "/v1/workers")
        return parsed(lambda d: [Worker.from_json(item) for item in d["items"]], data)

    async def secrets(self) -> list[dict[str, Any]]:
        """The key's workspace's secrets: ``name``, ``createdAt`` and ``updatedAt`` each, never
        a value (scope ``secrets:read``)."""
        data = await self._send("GET", "/v1/secrets")
        return parsed(lambda d: [dict(item) for item in d["items"]], data)

    async def set_secret(self, name: str, value: str) -> dict[str, Any]:
        """Set a secret of the key's workspace (scope ``secrets:write``); the answer names it
        and its times, never its value."""
        path = f"/v1/secrets/{seg(name)}"
        return parsed(dict, await self._send("PUT", path, json={"value": value}))

    async def delete_secret(self, name: str) -> None:
        """Delete a secret of the key's workspace (scope ``secrets:write``); ``NotFound`` when
        there is none of that name."""
        await self._send("DELETE", f"/v1/secrets/{seg(name)}", safe=False)

    async def put_schedule(self, name: str, definition: Mapping[str, Any]) -> dict[str, Any]:
        """Create or replace a schedule of the key's workspace (scope ``agents:write``):
        ``agentName``, ``input``, ``cron`` or ``every``, ``timezone``, ``overlap``, ``catchup``,
        ``paused`` (docs/schedules.md)."""
        path = f"/v1/schedules/{seg(name)}"
        return parsed(dict, await self._send("PUT", path, json=dict(definition)))

    async def schedules(self) -> list[dict[str, Any]]:
        """The workspace's schedules by name, each with ``nextFireAt`` and ``lastRunId``."""
        data = await self._send("GET", "/v1/schedules")
        return parsed(lambda d: [dict(item) for item in d["items"]], data)

    async def schedule(self, name: str) -> dict[str, Any]:
        return parsed(dict, await self._send("GET", f"/v1/schedules/{seg(name)}"))

    async def delete_schedule(self, name: str) -> None:
        await self._send("DELETE", f"/v1/schedules/{seg(name)}", safe=False)

    async def trigger_schedule(self, name: str) -> Run:
        """Start the schedule's run now, whatever its overlap policy (scope ``runs:execute``)."""
        path = f"/v1/schedules/{seg(name)}/trigger"
        return parsed(Run.from_json, await self._send("POST", path, safe=False))

    async def limits(self) -> list[dict[str, Any]]:
        """The rate limits the key's workspace's model calls are held to, its own and the
        server's, each with ``used`` (tokens and requests of its last minute); scope ``admin``
        or an operator key (docs/rate-limits.md)."""
        data = await self._send("GET", "/v1/limits")
        return parsed(lambda d: [dict(item) for item in d["items"]], data)

    async def put_limit(self, name: str, definition: Mapping[str, Any]) -> dict[str, Any]:
        """Create or replace a rate limit: ``match`` (``{"model": GLOB}``),
        ``tokensPerMinute``, ``requestsPerMinute``, ``scope`` (``"server"``: an operator's)."""
        path = f"/v1/limits/{seg(name)}"
        return parsed(dict, await self._send("PUT", path, json=dict(definition)))

    async def delete_limit(self, name: str, *, server: bool = False) -> None:
        """Delete a rate limit of the workspace (``server``: of the server, an operator's);
        ``NotFound`` when there is none of that name."""
        params = {"scope": "server"} if server else None
        await self._send("DELETE", f"/v1/limits/{seg(name)}", params=params, safe=False)

    async def runtime_nodes(self) -> list[dict[str, Any]]:
        """The runtime nodes that run microVM agents, their drivers, capacity and heartbeats
        (an operator key: ``lantern keys create --operator``)."""
        data = await self._send("GET", "/v1/runtime/nodes")
        return parsed(lambda d: [dict(item) for item in d["items"]], data)

    async def vms(self, run_id: str) -> list[dict[str, Any]]:
        """A microVM run's VMs, oldest first: node, driver, state and why each ended."""
        data = await self._send("GET", f"/v1/runs/{seg(run_id)}/vms")
        return parsed(lambda d: [dict(item) for item in d["items"]], data)

    async def health(self) -> bool:
        """Whether the server answers its health check now (one attempt, no retries)."""
        try:
            data = await self._send("GET", "/healthz", retries=0)
        except LanternError as exc:  # unreachable, or it answered but not healthy
            log.debug("health check failed: %s", exc)
            return False
        return isinstance(data, dict) and data.get("status") == "ok"

    # The one place requests are sent, retried and their errors raised.

    async def _events(
        self, run_id: str, after: int, limit: int | None, expand: bool = False
    ) -> EventPage:
        params = {"after": after, "limit": limit, "expand": "outputs" if expand else None}
        data = await self._send("GET", f"/v1/runs/{seg(run_id)}/events", params=params)
        return parsed(EventPage.from_json, data)

    async def _send(
        self,
        method: str,
        path: str,
        *,
        safe: bool = True,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
        extra: float = 0.0,
        retries: int | None = None,
    ) -> Any:
        """Send, retrying as ``retry.py`` says; the answer's JSON, or the error it maps to.

        ``safe`` calls may be repeated without doing anything twice. ``extra`` seconds are
        added to the timeout (a long-poll's wait)."""
        retries = self.max_retries if retries is None else retries
        query = {k: param(v) for k, v in (params or {}).items() if v is not None}
        attempt = 0
        while True:
            try:
                response = await self._http.request(
                    method,
                    path,
                    params=query,
                    json=json,
                    headers=headers,
                    timeout=self.timeout + extra,
                )
            except httpx.TransportError as exc:
                if attempt >= retries or not retry_transport_error(exc, safe=safe):
                    where = f"{method} {self.base_url}{path}"
                    tries = f" (after {attempt + 1} attempts)" if attempt else ""
                    raise ConnectionFailed(f"{where}: {_describe(exc)}{tries}") from exc
                delay = self.backoff.delay(attempt)
                reason = _describe(exc)
            else:
                status = response.status_code
                if status == 204:  # a delete: nothing to answer
                    return None
                if response.is_success:
                    try:
                        return response.json()
                    except ValueError as exc:
                        raise InvalidResponse(f"{method} {path}: {status} is not JSON") from exc
                if attempt >= retries or not retry_status(status, safe=safe):
                    raise error_from_body(status, response.text)
                retry_after = parse_retry_after(response.headers.get("Retry-After"))
                delay = self.backoff.delay(attempt, retry_after)
                reason = f"status {status}"
            attempt += 1
            log.info(
                "retrying %s %s in %.2fs after %s (retry %d of %d)",
                method,
                path,
                delay,
                reason,
                attempt,
                retries,
            )
            await asyncio.sleep(delay)


def retry_transport_error(exc: httpx.TransportError, *, safe: bool) -> bool:
    if isinstance(exc, NEVER_RETRIED):
        return False
    return retry_transport(safe=safe, sent=not isinstance(exc, NOT_SENT))


def _describe(exc: httpx.TransportError) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
