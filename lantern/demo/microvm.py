"""`lantern demo microvm`: a microVM run whose runtime node is SIGKILLed mid-step, resumed on
the other node with LANTERN_RESUME=1, its completed step served from the journal.

Local and offline: a SQLite database under the work folder, one `lantern serve` and two
`lantern node` processes (the driver: LANTERN_RUNTIME_DRIVER, else ``sandbox``, the quickest),
the workload from ``lantern/demo/vm/jobs.py``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.text import Text

from lantern import waterfall
from lantern.demo.story import _free_port
from lantern.engine import events as ev
from lantern.server.auth import issue_key
from lantern.store import open_store

APP_DIR = Path(__file__).parent / "vm"
SCOPES = {"runs:execute", "runs:read", "agents:write", "admin"}


def tell(workdir: Path) -> int:
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    for old in workdir.glob("lantern.db*"):
        old.unlink()
    out = Console(width=None if sys.stdout.isatty() else 120)
    return asyncio.run(_tell(workdir, out))


def _lantern() -> list[str]:
    found = Path(sys.executable).parent / "lantern"
    return [str(found)] if found.exists() else [sys.executable, "-m", "lantern.cli"]


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as sink:
        return subprocess.Popen([*_lantern(), *args], env=env, stdout=sink, stderr=sink)


async def _tell(workdir: Path, out: Console) -> int:
    url = f"sqlite:///{workdir / 'lantern.db'}"
    store = open_store(url)
    await store.open()
    _, key = await issue_key(store, "default", SCOPES)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    driver = os.environ.get("LANTERN_RUNTIME_DRIVER", "sandbox")
    env = {
        **os.environ,
        "LANTERN_DATABASE_URL": url,
        "LANTERN_PORT": str(port),
        "LANTERN_URL": base,
        "LANTERN_NODE_TTL": "2s",
        "LANTERN_WORKER_ID": "demo-control-plane",
    }
    env.pop("LANTERN_API_KEY", None)
    processes: list[subprocess.Popen[bytes]] = []
    out.rule("[bold]Lantern demo: a microVM run survives the loss of its runtime node")
    try:
        processes.append(_spawn(["serve"], env, workdir / "serve.log"))
        nodes = {}
        for name in ("node-a", "node-b"):
            args = ["node", "--driver", driver, "--app", str(APP_DIR), "--node-id", name]
            nodes[name] = _spawn(args, env, workdir / f"{name}.log")
            processes.append(nodes[name])
        async with httpx.AsyncClient(
            base_url=base, headers={"Authorization": f"Bearer {key}"}
        ) as api:
            if not await _until(lambda: _up(api), 60):
                out.print(f"[red]the control plane did not start; see {workdir / 'serve.log'}")
                return 1
            out.print(f"Started [bold]lantern serve[/] at {base} and two runtime nodes ({driver})")
            agent = {
                "name": "count-words",
                "runtime": {"tier": "microvm", "entrypoint": "jobs:count_words", "driver": driver},
            }
            (await api.put("/v1/agents/count-words", json=agent)).raise_for_status()
            run = (
                await api.post("/v1/runs", json={"agentName": "count-words", "input": {}})
            ).json()
            out.print(f"POST /v1/runs -> [bold]{run['id']}[/]: fetch -> count (slow) -> summary")

            async def counting() -> bool:
                events = (await api.get(f"/v1/runs/{run['id']}/events")).json()["items"]
                return any(e["kind"] == ev.STEP_STARTED and e["stepId"] == "count" for e in events)

            if not await _until(counting, 120):
                out.print(f"[red]the count step never started; see {workdir}")
                return 1
            [vm] = (await api.get(f"/v1/runs/{run['id']}/vms")).json()["items"]
            nodes[vm["nodeId"]].send_signal(signal.SIGKILL)
            killed = time.monotonic()
            out.print(
                f"[bold red]SIGKILL[/] to runtime node {vm['nodeId']} while its VM {vm['vmId']}"
                " was in the count step"
            )

            async def finished() -> dict[str, Any] | None:
                got = (await api.get(f"/v1/runs/{run['id']}")).json()
                return got if got["status"] in ("succeeded", "failed") else None

            done = await _until(finished, 120)
            if not done:
                out.print("[red]the run did not finish")
                return 1
            out.print(
                f"GET /v1/runs/{run['id']} -> {done['status']}, {time.monotonic() - killed:.1f}s"
                f" after the kill (LANTERN_NODE_TTL 2s); output {done['output']}\n"
            )
        stored = await store.get_run(run["id"])
        assert stored is not None
        events = await store.events(run["id"])
        waterfall.render(stored, events, lambda line: out.print(Text.from_ansi(line)), color=True)
        ok = done["status"] == "succeeded" and done["output"]["resumed"] is True
        out.print(
            "[green]The lost VM was terminated (node_lost); a new VM on the other node was"
            " started with LANTERN_RESUME=1, served fetch from the journal, and ran count again."
            if ok
            else "[red]the run did not resume as it should"
        )
        return 0 if ok else 1
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
        await store.close()


async def _up(api: httpx.AsyncClient) -> bool:
    try:
        return (await api.get("/healthz")).status_code == 200
    except httpx.HTTPError:
        return False


async def _until(check: Any, within: float) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = await check()
        if found:
            return found
        await asyncio.sleep(0.2)
    return None
