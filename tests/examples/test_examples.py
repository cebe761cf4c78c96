"""Each agent in examples/ runs as its README says: a real `lantern serve` started from another
folder with `--app-dir examples/NAME`, its definition applied as shipped, the offline model,
a real receiver on 127.0.0.1. One SIGKILL mid-delivery, as the tutorial does it."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from lantern import Client
from lantern.demo.receiver import Receiver
from tests.server import ALL_SCOPES, LANTERN, free_port, make_key

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def shipped(path: str) -> Any:
    return json.loads((EXAMPLES / path).read_text())


@dataclass
class Example:
    """`lantern serve --app-dir examples/NAME --app NAME_app:app`, run from a folder of its own."""

    name: str
    workdir: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None
    app_dir: Path | None = None  # the folder of NAME_app.py: examples/NAME unless given

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def database_url(self) -> str:
        return f"sqlite:///{self.workdir / 'example.db'}"

    def start(self) -> Example:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LANTERN_URL")}
        env |= {
            "LANTERN_DATABASE_URL": self.database_url,
            "LANTERN_DATA_DIR": str(self.workdir),
            "LANTERN_WORKER_ID": f"example-{self.port}",
            "LANTERN_EGRESS_ALLOW": "127.0.0.1",  # the receiver is on loopback
        }
        folder = self.app_dir or EXAMPLES / self.name
        app = ["--app-dir", str(folder), "--app", f"{self.name}_app:app"]
        with (self.workdir / "serve.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [LANTERN, "serve", *app, "--port", str(self.port)],
                env=env,
                cwd=self.workdir,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError((self.workdir / "serve.log").read_text()[-2000:])
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("lantern serve did not answer /healthz")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)

    def client(self) -> Client:
        return Client(self.url, make_key(self.database_url, "default", ALL_SCOPES))


@pytest.fixture
def example(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Example]:
    started = Example(request.param, tmp_path, free_port()).start()
    yield started
    started.stop()


def wait_status(client: Client, run_id: str, status: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while (found := client.get_run(run_id).status) != status:
        assert time.monotonic() < deadline, f"run {run_id} is {found}, not {status}"
        time.sleep(0.1)


@pytest.mark.parametrize("example", ["triage"], indirect=True)
def test_triage_parks_for_approval_then_replies_or_escalates(
    example: Example, receiver: Receiver
) -> None:
    ticket = shipped("triage/ticket.json") | {"helpdesk": receiver.url}
    with example.client() as client:
        assert client.apply_agent(shipped("triage/triage.json")).name == "support-triage"
        run = client.create_run("support-triage", ticket)
        wait_status(client, run.id, "waiting")
        assert receiver.hits == []  # nothing is sent before a person says so
        client.approve(run.id, "review", comment="refund confirmed")
        done = client.wait(run.id, timeout=60)
        assert done.status == "succeeded", done.error
        rejected = client.create_run("support-triage", ticket | {"ticket": "T-1002"})
        wait_status(client, rejected.id, "waiting")
        client.approve(rejected.id, "review", decision="reject", comment="needs a human")
        assert client.wait(rejected.id, timeout=60).status == "succeeded"
    [reply] = [h for h in receiver.hits if h.path == "/replies"]
    assert reply.body["ticket"] == "T-1001" and reply.body["category"] == "billing"
    assert "Ada" in reply.body["text"] and "billing" in reply.body["text"]  # the ai-step's draft
    assert reply.idempotency_key
    [escalation] = [h for h in receiver.hits if h.path == "/escalations"]
    assert escalation.body == {"ticket": "T-1002", "reason": "needs a human"}
    assert len(receiver.hits) == 2


@pytest.mark.parametrize("example", ["assistant"], indirect=True)
def test_assistant_calls_its_tools_as_journaled_steps(example: Example) -> None:
    with example.client() as client:
        client.apply_agent(shipped("assistant/assistant.json"))
        run = client.wait(client.create_run("order-assistant", {"order_id": "A-17"}).id, timeout=60)
        assert run.status == "succeeded", run.error
        steps = [e.step_id for e in client.events(run.id) if e.kind == "step_completed"]
    assert steps == ["llm:1", "tool:1:orders.status", "llm:2", "tool:2:orders.eta", "llm:3"]
    answer = json.loads(run.output["text"])
    assert answer == {
        "orders_status": {"order": "A-17", "status": "shipped", "carrier": "DHL"},
        "orders_eta": {"order": "A-17", "days": 2},
    }


@pytest.mark.parametrize("example", ["pipeline"], indirect=True)
def test_pipeline_retries_a_flaky_service_and_survives_sigkill(
    example: Example, receiver: Receiver
) -> None:
    signup = shipped("pipeline/signup.json") | {"services": receiver.url}
    receiver.fail("/billing/subscriptions", 503, 2)
    receiver.hold("/mail/welcome")
    with example.client() as client:
        client.apply_agent(shipped("pipeline/pipeline.json"))
        run = client.create_run("signup-pipeline", signup)
        assert receiver.arrived.wait(60), "the welcome mail never started"
    example.kill()  # mid-delivery: the welcome request is unanswered
    receiver.release()
    example.start()
    with example.client() as client:
        done = client.wait(run.id, timeout=60)
    assert done.status == "succeeded", done.error
    # Billing answered 503 twice, then took the third attempt, each attempt with its own key.
    assert receiver.count("/billing/subscriptions") == 3
    assert len(receiver.keys("/billing/subscriptions")) == 3
    assert receiver.count("/crm/contacts") == 1
    # The welcome cut off by the crash was sent again with the same key: applied once.
    assert receiver.count("/mail/welcome") == 2 and receiver.applied("/mail/welcome") == 1
    [contact] = [h.body for h in receiver.hits if h.path == "/crm/contacts"]
    assert contact["email"] == "grace@example.test" and contact["account"].startswith("acct_")


@pytest.mark.parametrize("example", ["signals"], indirect=True)
def test_signals_resume_the_graph_and_the_code_first_checkout(example: Example) -> None:
    payment = shipped("signals/payment.json")
    with example.client() as client:
        client.apply_agent(shipped("signals/order.json"))
        order = client.create_run("order", {"order": "A-17"})
        # Sent before the code-first run waits for it: kept for its wait.
        checkout = client.create_run("checkout", {"order": "A-18"})
        client.signal(checkout.id, "payment", payment, idempotency_key="pi_3Nx")
        wait_status(client, order.id, "waiting")
        client.signal(order.id, "payment", payment, idempotency_key="pi_3Nx")
        done = client.wait(order.id, timeout=60)
        assert done.status == "succeeded", done.error
        assert done.output == {"order": "A-17", "shipped": True, "paid": payment}
        paid = client.wait(checkout.id, timeout=60)
        assert paid.status == "succeeded", paid.error
        assert paid.output == {
            "order": "A-18",
            "status": "shipped",
            "shipment": {"order": "A-18", "shipped": True, "paid": payment},
        }


def test_the_examples_receiver_applies_each_key_once(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "receiver.py"), "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert "receiver on" in proc.stdout.readline()
        url, key = f"http://127.0.0.1:{port}/replies", {"Idempotency-Key": "k-1"}
        first = httpx.post(url, json={"n": 1}, headers=key, timeout=10)
        again = httpx.post(url, json={"n": 1}, headers=key, timeout=10)
        assert first.json() == again.json() == {"path": "/replies", "applied": True}
        assert "key=k-1… applied" in proc.stdout.readline()
        assert "duplicate key" in proc.stdout.readline()
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
    bad = subprocess.run(
        [sys.executable, str(EXAMPLES / "receiver.py"), "--slow", "/replies"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2 and "PATH=SECONDS" in bad.stderr


def tutorial_files(folder: Path) -> None:
    """docs/tutorial.md's own files, as a reader saves them: the python block is
    triage_app.py, the first json block triage.json, the second ticket.json."""
    text = (EXAMPLES.parent / "docs" / "tutorial.md").read_text()
    blocks = re.findall(r"```(\w+)\n(.*?)```", text, re.S)
    [app] = [body for lang, body in blocks if lang == "python"]
    agent, ticket = [body for lang, body in blocks if lang == "json"]
    (folder / "triage_app.py").write_text(app)
    (folder / "triage.json").write_text(agent)
    (folder / "ticket.json").write_text(ticket)


def test_the_tutorial_as_written_approves_cancels_and_retries(
    tmp_path: Path, receiver: Receiver
) -> None:
    """The tutorial's tool, agent and ticket, served from the reader's folder, driven with the
    commands it gives: apply, run, approve with a comment; then cancel a run parked at review
    and retry it (its completed steps copied, review asked again)."""
    folder = tmp_path / "triage"
    folder.mkdir()
    tutorial_files(folder)
    served = Example("triage", tmp_path, free_port(), app_dir=folder).start()
    key = make_key(served.database_url, "default", ALL_SCOPES)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LANTERN_DATABASE_URL")}
    env |= {"LANTERN_URL": served.url, "LANTERN_API_KEY": key}

    def cli(*args: str) -> str:
        done = subprocess.run(
            [LANTERN, *args], env=env, cwd=folder, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, (args, done.stderr)
        return done.stdout.strip()

    ticket = json.loads((folder / "ticket.json").read_text()) | {"helpdesk": receiver.url}
    try:
        assert cli("agents", "apply", "triage.json") == "applied support-triage v1"
        with Client(served.url, key) as client:
            first = cli("run", "support-triage", "--input", json.dumps(ticket))
            wait_status(client, first, "waiting")
            cli("runs", "approve", first, "review", "--comment", "refund confirmed")
            assert client.wait(first, timeout=60).status == "succeeded"

            third = cli("run", "support-triage", "--input", json.dumps(ticket | {"ticket": "T-3"}))
            wait_status(client, third, "waiting")
            assert cli("runs", "cancel", third).startswith(f"cancelled: {third}")
            retried = cli("runs", "retry", third)
            wait_status(client, retried, "waiting")
            assert retried in cli("approvals", "list")
            events = client.events(retried)
            cli("runs", "approve", retried, "review")
            done = client.wait(retried, timeout=60)
    finally:
        served.stop()
    assert done.status == "succeeded", done.error
    copied = [e.step_id for e in events if e.kind == "step_completed" and "replayedFrom" in e.data]
    assert copied == ["start", "classify", "draft"]
    replies = [h.body for h in receiver.hits if h.path == "/replies"]
    assert [r["ticket"] for r in replies] == ["T-1001", "T-3"]  # the cancelled run sent nothing
    assert "Ada" in replies[0]["text"] and "billing" in replies[0]["text"]


@pytest.mark.parametrize("example", ["flow"], indirect=True)
def test_flow_runs_one_ticket_per_customer_at_a_time(example: Example) -> None:
    """examples/flow: three tickets of one customer run one after another, another customer's
    beside them; the graph agent as shipped applies and runs under the same rule."""
    with example.client() as client:
        client.apply_agent(shipped("flow/answer-ticket.json"))
        tickets = [("acme", "refund", 5), ("acme", "invoice", 5), ("acme", "login", 5)]
        runs = [
            client.create_run("answer-ticket-code", {"customer": c, "question": q}, priority=p)
            for c, q, p in [*tickets, ("bolt", "refund", 9)]
        ]
        graph = [client.create_run("answer-ticket", {"customer": "acme", "question": "hi"})]
        done = [client.wait(r.id, timeout=60) for r in runs + graph]
        assert [d.status for d in done] == ["succeeded"] * 5
        assert done[3].priority == 9 and done[0].concurrency_key == "acme"

        def span(run_id: str) -> tuple[Any, Any]:
            events = client.events(run_id)
            return events[0].at, events[-1].at

        acme = sorted(span(r.id) for r in runs[:3])
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(acme)), acme
        bolt = span(runs[3].id)
        assert bolt[0] < acme[0][1], "another customer's ticket waited behind acme's"
