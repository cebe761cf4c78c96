"""How long the ``lantern`` command takes to answer: start-up is most of a CLI call.

Starts a real ``lantern serve`` on a temporary SQLite database, applies an agent
``trigger -> approval -> tool`` and parks enough runs at the approval, then times, as a user at
a terminal would run them (``LANTERN_URL`` and ``LANTERN_API_KEY`` set, as in the tutorial):

- ``python -c pass``: the interpreter's own start, the floor under every command;
- ``lantern --help``;
- ``lantern runs list``, ``lantern runs show RUN``, ``lantern runs approve RUN`` (each approve
  decides a different parked run) through the server;
- ``lantern runs list`` and ``lantern runs show RUN`` on the database directly (no
  ``LANTERN_URL``), which must open the store's driver.

Each command runs as ``python -c 'from lantern.cli.main import main; main()' ARGS`` (what the
``lantern`` script runs) in an empty folder, with the tree under test first on ``PYTHONPATH``.
With ``--before DIR`` (another checkout, such as ``git archive main | tar -x -C DIR``) both
trees are timed in one run, interleaved, so the machine's load hits both alike. Printed: each
command's median wall time, the same minus the interpreter's start, and after/before ratios;
then the same for CPU time (user + sys of the command's process, as ``/usr/bin/time`` reports
it), which a loaded machine inflates far less than wall time. The target is each ``lantern``
command within 0.35 s of the interpreter's start.

    .venv/bin/python bench/cli.py [--samples 15] [--before DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `python bench/cli.py` from anywhere

from tests.server import ALL_SCOPES, Server, make_key  # noqa: E402

TARGET_S = 0.35
AGENT = {
    "name": "gate",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {"id": "ok", "type": "approval", "data": {"prompt": "Ship it?"}},
            {"id": "ship", "type": "tool", "data": {"tool": "noop", "args": {}}},
        ],
        "edges": [{"source": "start", "target": "ok"}, {"source": "ok", "target": "ship"}],
    },
}
MAIN = "import sys; from lantern.cli.main import main; sys.exit(main())"


def parked_runs(url: str, key: str, n: int) -> list[str]:
    """``n`` runs of the gate agent, each waiting at its approval."""
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as http:
        http.put("/v1/agents/gate", json=AGENT).raise_for_status()
        ids = [
            http.post("/v1/runs", json={"agentName": "gate", "input": {}}).json()["id"]
            for _ in range(n)
        ]
        deadline = time.monotonic() + 120
        for run_id in ids:
            while http.get(f"/v1/runs/{run_id}").json()["status"] != "waiting":
                if time.monotonic() > deadline:
                    raise SystemExit(f"run {run_id} did not reach its approval")
                time.sleep(0.05)
    return ids


def cpu_of_children() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def timed(argv: list[str], env: dict[str, str], cwd: str) -> tuple[float, float]:
    """The command's wall time and CPU time (user + sys; commands run one at a time, so the
    children's total grows by this one's alone)."""
    cpu = cpu_of_children()
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{argv[3:]} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return took, cpu_of_children() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=15)
    parser.add_argument("--before", type=Path, help="A checkout to compare with (before).")
    args = parser.parse_args()
    trees = {"after": ROOT}
    if args.before is not None:
        if not (args.before / "lantern" / "cli" / "main.py").is_file():
            raise SystemExit(f"--before {args.before}: no lantern/cli/main.py there")
        trees = {"before": args.before.resolve(), "after": ROOT}

    with tempfile.TemporaryDirectory(prefix="lantern-bench-cli-") as tmp:
        database_url = f"sqlite:///{tmp}/cli.db"
        server = Server(database_url, Path(tmp) / "serve.log").start()
        try:
            key = make_key(database_url, "default", ALL_SCOPES)
            runs = parked_runs(server.url, key, args.samples * len(trees) + 1)
            shown = runs.pop()
            base = {k: v for k, v in os.environ.items() if not k.startswith("LANTERN_")}
            local = {**base, "LANTERN_DATABASE_URL": database_url}
            remote = {**base, "LANTERN_URL": server.url, "LANTERN_API_KEY": key}
            commands: dict[str, tuple[list[str], dict[str, str]]] = {
                "python -c pass": (["-c", "pass"], base),
                "lantern --help": (["--help"], base),
                "runs list": (["runs", "list"], remote),
                "runs show": (["runs", "show", shown], remote),
                "runs approve": (["runs", "approve"], remote),
                "runs list (database)": (["runs", "list"], local),
                "runs show (database)": (["runs", "show", shown], local),
            }
            times: dict[tuple[str, str], list[float]] = {}
            cpus: dict[tuple[str, str], list[float]] = {}
            for _ in range(args.samples):
                for tree, path in trees.items():
                    for name, (argv, env) in commands.items():
                        full = (
                            [sys.executable, *argv]
                            if argv[0] == "-c"
                            else [sys.executable, "-c", MAIN, *argv]
                        )
                        if name == "runs approve":
                            full.append(runs.pop())
                        tree_env = {**env, "PYTHONPATH": str(path)}
                        wall, cpu = timed(full, tree_env, tmp)
                        times.setdefault((tree, name), []).append(wall)
                        cpus.setdefault((tree, name), []).append(cpu)
        finally:
            server.stop()

    load = os.getloadavg()[0]
    print(f"lantern CLI, median of {args.samples} (load average {load:.1f})")
    over = table("wall time", times, trees, commands)
    table("CPU time (user + sys)", cpus, trees, commands)
    print(
        f"target: each command within {TARGET_S} s of python's start (wall time):"
        f" {'met' if not over else 'missed by ' + ', '.join(over)}"
    )


def table(
    title: str,
    samples: dict[tuple[str, str], list[float]],
    trees: dict[str, Path],
    commands: dict[str, tuple[list[str], dict[str, str]]],
) -> list[str]:
    """Prints one table of medians; returns the commands over the target in the tree after."""
    median = {key: statistics.median(values) for key, values in samples.items()}
    floor = {tree: median[(tree, "python -c pass")] for tree in trees}
    header = "".join(f"{tree:>10} {'- python':>10}" for tree in trees)
    ratio_header = f"{'after/before':>14}" if len(trees) > 1 else ""
    print(f"\n{title:<24}{header}{ratio_header}")
    for name in commands:
        row = "".join(
            f"{median[(tree, name)]:>9.3f}s {median[(tree, name)] - floor[tree]:>9.3f}s"
            for tree in trees
        )
        if len(trees) > 1:
            row += f"{median[('after', name)] / median[('before', name)]:>14.2f}"
        print(f"{name:<24}{row}")
    return [
        name
        for name in commands
        if name != "python -c pass" and median[("after", name)] - floor["after"] > TARGET_S
    ]


if __name__ == "__main__":
    main()
