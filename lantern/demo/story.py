"""`lantern demo`: a run crashed with SIGKILL mid-step, restarted, finished, each delivery once.

Everything is local and offline: a SQLite database under the work folder, a receiver on
127.0.0.1 standing in for the payment, shipping and notification services, and a real
`lantern serve` process that the demo kills and starts again.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

from rich.console import Console
from rich.table import Table

from lantern.cli import waterfall
from lantern.demo.receiver import Receiver, running
from lantern.engine.runs import apply_agent, create_run
from lantern.store import Run, Store, open_store

WORKER_ID = "demo-worker"
DELIVERIES = ("/payments", "/shipments", "/notifications")
CRASH_AT = "/shipments"


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
    definition = json.loads((resources.files("lantern.demo") / "agent.json").read_text())
    agent = await apply_agent(store, definition)
    run = await create_run(
        store,
        agent.name,
        {"customer": "c-42", "cents": 4200, "item": "lantern", "receiver": receiver.url},
    )
    out.rule("[bold]Lantern demo: a crash mid-step costs one step, never the run")
    out.print(
        f"Agent [bold]{agent.name}[/] v{agent.version}: lookup (tool) -> charge (http)"
        " -> ship (http) -> notify (http)"
    )
    out.print(f"Run [bold]{run.id}[/] queued in {url}")

    receiver.hold(CRASH_AT)
    log = workdir / "serve.log"
    server = _serve(url, log)
    out.print(f"Started [bold]lantern serve[/] (pid {server.pid}, worker id {WORKER_ID})")
    if not await asyncio.to_thread(receiver.arrived.wait, 60):
        out.print(f"[red]the ship step never started; see {log}")
        server.kill()
        return 1
    server.send_signal(signal.SIGKILL)
    server.wait()
    out.print("[bold red]SIGKILL[/] while [bold]ship[/] was in flight (its request unanswered)")
    events = await store.events(run.id)
    done = [e.step_id for e in events if e.kind == "step_completed"]
    out.print(
        f"  journal after the crash: {len(events)} events; completed: {', '.join(map(str, done))};"
        " ship started, not completed"
    )
    receiver.release()

    began = time.monotonic()
    server = _serve(url, log)
    out.print(
        f"Restarted [bold]lantern serve[/] (pid {server.pid}) with the same worker id:"
        " it takes its run back at once"
    )
    finished = await _wait_finished(store, run.id, 60)
    server.send_signal(signal.SIGTERM)
    server.wait(30)
    if finished is None:
        out.print(f"[red]the run did not finish; see {log}")
        return 1
    out.print(f"Run {finished.status} {time.monotonic() - began:.2f}s after the restart\n")
    waterfall.render(finished, await store.events(run.id), out)
    return _deliveries(receiver, finished, out)


def _serve(url: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "LANTERN_DATABASE_URL": url, "LANTERN_WORKER_ID": WORKER_ID}
    lantern = Path(sys.executable).parent / "lantern"
    command = [str(lantern)] if lantern.exists() else [sys.executable, "-m", "lantern.cli"]
    with log.open("ab") as sink:
        return subprocess.Popen(
            [*command, "serve", "--app", "lantern.demo.app:app"],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )


async def _wait_finished(store: Store, run_id: str, within: float) -> Run | None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        run = await store.get_run(run_id)
        if run is not None and run.finished:
            return run
        await asyncio.sleep(0.05)
    return None


def _deliveries(receiver: Receiver, run: Run, out: Console) -> int:
    table = Table("delivery", "requests received", "idempotency keys", title="At the receiver")
    ok = run.status == "succeeded"
    for path in DELIVERIES:
        count, keys = receiver.count(path), receiver.keys(path)
        table.add_row(path, str(count), str(len(keys)))
        # The step in flight at the crash may arrive twice, always with one key.
        ok = ok and len(keys) == 1 and (count == 1 or (path == CRASH_AT and count == 2))
    out.print(table)
    if ok:
        out.print(
            "[green]Each delivery made once; the one cut off by the crash was re-sent"
            " with the same Idempotency-Key, so the receiver can de-duplicate it."
        )
        return 0
    out.print("[red]deliveries do not match the guarantee")
    return 1
