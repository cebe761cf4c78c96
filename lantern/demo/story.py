"""`lantern demo`: a run SIGKILLed mid-step, restarted and finished; no delivery applied twice.

Everything is local and offline: a SQLite database under the work folder, a receiver on
127.0.0.1 standing in for the payment, shipping and notification services, and a real
`lantern serve` process, driven over its REST API, that the demo kills and starts again.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from lantern import waterfall
from lantern.demo import receipt
from lantern.demo.receiver import Receiver, running
from lantern.engine import events as ev
from lantern.sdk import AsyncClient
from lantern.server.auth import issue_key
from lantern.store import Store, open_store

WORKER_ID = "demo-worker"
DELIVERIES = ("/payments", "/shipments", "/notifications")
CRASH_AT = "/shipments"
SCOPES = {"runs:execute", "runs:read", "agents:write", "agents:read"}  # agents:read: the UI


def tell(workdir: Path) -> int:
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    for old in workdir.glob("lantern.db*"):
        old.unlink()  # each telling starts from an empty journal
    return asyncio.run(_tell(workdir, Console(width=None if sys.stdout.isatty() else 120)))


async def _tell(workdir: Path, out: Console) -> int:
    url = f"sqlite:///{workdir / 'lantern.db'}"
    store = open_store(url)
    await store.open()
    try:
        with running() as receiver:
            return await _story(store, url, receiver, workdir, out)
    finally:
        await store.close()


async def _story(store: Store, url: str, receiver: Receiver, workdir: Path, out: Console) -> int:
    _, key = await issue_key(store, "default", SCOPES)
    port, log = _free_port(), workdir / "serve.log"
    base = f"http://127.0.0.1:{port}"
    out.rule("[bold]Lantern demo: a crash mid-step costs one step, never the run")
    server = _serve(url, port, log, receiver.url)
    out.print(f"Started [bold]lantern serve[/] at {base} (pid {server.pid}, worker {WORKER_ID})")
    async with AsyncClient(base, key) as api:
        if not await _healthy(api, server):
            out.print(f"[red]the server did not start; see {log}")
            return 1
        definition = json.loads((resources.files("lantern.demo") / "agent.json").read_text())
        agent = await api.apply_agent(definition)
        out.print(
            f"PUT /v1/agents/{agent.name} -> v{agent.version}: lookup (tool)"
            " -> draft (ai-step, offline model) -> charge (http) -> ship (http) -> notify (http)"
        )
        receiver.hold(CRASH_AT)
        run = await api.create_run(
            agent.name,
            {"customer": "c-42", "cents": 4200, "item": "lantern", "receiver": receiver.url},
        )
        out.print(f"POST /v1/runs -> [bold]{run.id}[/] ({run.status})")
        if not await asyncio.to_thread(receiver.arrived.wait, 60):
            out.print(f"[red]the ship step never started; see {log}")
            server.kill()
            return 1
    server.send_signal(signal.SIGKILL)
    server.wait()
    out.print("[bold red]SIGKILL[/] while [bold]ship[/] was in flight (its request unanswered)")
    events = await store.events(run.id)
    done = ", ".join(str(e.step_id) for e in events if e.kind == ev.STEP_COMPLETED)
    out.print(f"  journal after the crash: {len(events)} events; completed: {done};")
    out.print("  ship started, not completed")
    receiver.release()

    began = time.monotonic()
    server = _serve(url, port, log, receiver.url)
    out.print(
        f"Restarted [bold]lantern serve[/] (pid {server.pid}) with the same worker id:"
        " it takes its run back at once"
    )
    try:
        async with AsyncClient(base, key) as api:
            if not await _healthy(api, server):
                out.print(f"[red]the server did not restart; see {log}")
                return 1
            finished = await api.wait(run.id, timeout=60)
            exported, keys = await receipt.fetch(api, run.id)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
    out.print(
        f"GET /v1/runs/{run.id}?wait=... -> {finished.status},"
        f" {time.monotonic() - began:.2f}s after the restart\n"
    )
    stored = await store.get_run(run.id)
    assert stored is not None
    events, sent = await store.events(run.id), await store.deliveries(run.id)
    waterfall.render(stored, events, lambda line: out.print(Text.from_ansi(line)), sent, color=True)
    told = max(_deliveries(receiver, finished.status, out), receipt.show(exported, keys, out))
    if told == 0:
        _next_steps(workdir, run.id, key, out)
    return told


def _next_steps(workdir: Path, run_id: str, key: str, out: Console) -> None:
    """Where to look next: this run in the browser, then an agent of one's own."""
    here = Path.cwd()
    lantern = Path(sys.executable).parent / "lantern"
    command = str(lantern.relative_to(here)) if lantern.is_relative_to(here) else str(lantern)
    db = workdir / "lantern.db"
    shown = str(db.relative_to(here)) if db.is_relative_to(here) else str(db)
    out.print("\n[bold]Next[/]")
    out.print(
        f"  See this run in the browser: [bold]{command} serve --database-url sqlite:///{shown}[/]"
    )
    out.print(f"  then open http://127.0.0.1:8787/ui/runs/{run_id} (or /ui/runs for every run)")
    out.print(f"  and give the page this demo key: {key}")
    out.print("  Build an agent of your own in 15 minutes: [bold]docs/tutorial.md[/]")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _healthy(api: AsyncClient, server: subprocess.Popen[bytes]) -> bool:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and server.poll() is None:
        if await api.health():
            return True
        await asyncio.sleep(0.1)
    return False


def _serve(url: str, port: int, log: Path, receiver: str) -> subprocess.Popen[bytes]:
    # The receiver is on loopback, which tenant URLs may not reach unless the egress policy
    # lists it: the demo lists exactly the receiver's address and port.
    peer = receiver.split("://", 1)[1].split("/", 1)[0]
    allowed = os.environ.get("LANTERN_EGRESS_ALLOW")
    env = {
        **os.environ,
        "LANTERN_DATABASE_URL": url,
        "LANTERN_WORKER_ID": WORKER_ID,
        "LANTERN_PORT": str(port),
        "LANTERN_EGRESS_ALLOW": f"{allowed},{peer}" if allowed else peer,
    }
    lantern = Path(sys.executable).parent / "lantern"
    command = [str(lantern)] if lantern.exists() else [sys.executable, "-m", "lantern.cli"]
    with log.open("ab") as sink:
        return subprocess.Popen(
            [*command, "serve", "--app", "lantern.demo.app:app"],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )


def _deliveries(receiver: Receiver, status: str, out: Console) -> int:
    table = Table(
        "delivery", "requests received", "idempotency keys", "applied", title="At the receiver"
    )
    ok = status == "succeeded"
    for path in DELIVERIES:
        count, keys = receiver.count(path), receiver.keys(path)
        table.add_row(path, str(count), str(len(keys)), str(receiver.applied(path)))
        # The step in flight at the crash may arrive twice, always with one key.
        ok = ok and len(keys) == 1 and (count == 1 or (path == CRASH_AT and count == 2))
    out.print(table)
    if not ok:
        out.print("[red]deliveries do not match the guarantee")
        return 1
    resent = receiver.count(CRASH_AT)
    if resent == 1:
        out.print(f"[green]Each delivery reached the receiver once, {CRASH_AT} included.")
    else:
        out.print(
            f"[green]{CRASH_AT}: the receiver saw {resent} requests with one Idempotency-Key and"
            " applied one.[/] The request cut off by the crash was sent again with the same key;"
            " every other delivery was sent once."
        )
    return 0
