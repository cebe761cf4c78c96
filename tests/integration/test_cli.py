"""The real ``lantern`` console script, as a user runs it, on both backends (the README's tour).

Exit status 0 on success, 1 on a failed operation, 2 on bad usage; errors are one line on stderr.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from lantern.store import open_store
from tests.fake_llm import FakeProvider, Script

LANTERN = Path(sys.executable).parent / "lantern"

TOOLS = textwrap.dedent(
    '''
    import lantern

    app = lantern.App()


    @app.tool("math.double")
    def double(x: int) -> dict:
        """Double a number (a sync tool)."""
        return {"doubled": x * 2}


    @app.tool("math.explode")
    async def explode(ctx: lantern.ToolContext, x: int) -> dict:
        raise RuntimeError(f"boom at {x} in {ctx.step_id}")


    @app.agent("tripler")
    async def tripler(ctx: lantern.Context, x: int) -> int:
        return await ctx.step("triple", lambda: 3 * x)
    '''
)


def doubler(name: str = "doubler", *, then: str | None = None) -> dict[str, Any]:
    """start -> double, and optionally double -> a second tool fed the first one's output."""
    nodes: list[dict[str, Any]] = [
        {"id": "start", "type": "trigger"},
        {
            "id": "double",
            "type": "tool",
            "data": {"tool": "math.double", "args": {"x": "{{ input.x }}"}},
        },
    ]
    edges = [{"source": "start", "target": "double"}]
    if then is not None:
        args = {"x": "{{ steps.double.output.doubled }}"}
        nodes.append({"id": "after", "type": "tool", "data": {"tool": then, "args": args}})
        edges.append({"source": "double", "target": "after"})
    return {"name": name, "graph": {"nodes": nodes, "edges": edges}}


class Cli:
    """Runs ``lantern`` against one database, with a tools module importable from tmp_path."""

    def __init__(self, database_url: str, tmp_path: Path) -> None:
        self.database_url = database_url
        self.tmp_path = tmp_path
        (tmp_path / "cli_tools.py").write_text(TOOLS)
        env = {k: v for k, v in os.environ.items() if not k.startswith("LANTERN_")}
        pythonpath = [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]
        env.update(
            LANTERN_DATABASE_URL=database_url,
            PYTHONPATH=os.pathsep.join(pythonpath),
            COLUMNS="200",  # rich tables keep whole cells when stdout is a pipe
        )
        self.env = env

    def __call__(self, *args: str, status: int = 0) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(LANTERN), *args],
            env=self.env,
            cwd=self.tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == status, (args, result.returncode, result.stdout, result.stderr)
        if status == 0:
            assert result.stderr == "", result.stderr
        return result

    def fails(self, *args: str, status: int) -> str:
        """Run a command that must fail: its one stderr line, without the ``error: `` prefix."""
        result = self(*args, status=status)
        lines = result.stderr.splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("error: "), lines[0]
        assert "Traceback" not in result.stderr
        return lines[0].removeprefix("error: ")

    def write(self, name: str, content: str | dict[str, Any]) -> str:
        path = self.tmp_path / name
        path.write_text(content if isinstance(content, str) else json.dumps(content))
        return str(path)

    def apply(self, definition: dict[str, Any], file: str = "agent.json") -> str:
        return self("agents", "apply", self.write(file, definition)).stdout.strip()

    def run_wait(self, agent: str, input: Any, status: int) -> dict[str, Any]:
        args = ["run", agent, "--input", json.dumps(input), "--wait", "--app", "cli_tools:app"]
        result = self(*args, status=status)
        finished: dict[str, Any] = json.loads(result.stdout)
        return finished

    def stored(self, read: Any) -> Any:
        """What ``read(store)`` answers, read from the database directly."""

        async def get() -> Any:
            store = open_store(self.database_url)
            await store.open()
            try:
                return await read(store)
            finally:
                await store.close()

        return asyncio.run(get())

    def stored_agent(self, name: str) -> Any:
        return self.stored(lambda store: store.get_agent("default", name))


@pytest.fixture
def cli(database_url: str, tmp_path: Path) -> Cli:
    assert LANTERN.exists(), f"the console script is not installed at {LANTERN}"
    return Cli(database_url, tmp_path)


def table_rows(output: str) -> list[list[str]]:
    """The rows of a listing under its header line: columns two or more spaces apart."""
    return [re.split(r"\s{2,}", line.strip()) for line in output.splitlines()[1:] if line.strip()]


BAD_YAML = """\
name: broken
graph:
  nodes:
    - {id: start, type: trigger}
    - {id: weird, type: magic}
    - {id: twice, type: tool, data: {tool: x}}
    - {id: twice, type: tool, data: {tool: x}}
  edges:
    - {source: start, target: twice}
    - {source: twice, target: ghost}
"""


def test_a_bad_definition_exits_1_naming_every_problem_and_stores_nothing(cli: Cli) -> None:
    error = cli.fails("agents", "apply", cli.write("bad.yaml", BAD_YAML), status=1)
    assert error.startswith("invalid agent definition: ")
    assert "node 'weird': unknown node type 'magic'" in error
    assert "node 'twice': duplicate id" in error
    assert "target node 'ghost' does not exist" in error
    assert "node 'weird': unreachable from the trigger 'start'" in error

    listed = cli("agents", "list").stdout
    assert "broken" not in listed
    assert table_rows(listed) == []
    assert cli.stored_agent("broken") is None


def test_an_unreadable_or_invalid_yaml_file_exits_2(cli: Cli) -> None:
    error = cli.fails("agents", "apply", cli.write("broken.yaml", "name: [unclosed\n"), status=2)
    assert "cannot read" in error and "broken.yaml" in error
    missing = str(cli.tmp_path / "missing.yaml")
    error = cli.fails("agents", "apply", missing, status=2)
    assert "cannot read" in error and "missing.yaml" in error


def test_a_definition_that_is_not_an_object_exits_1(cli: Cli) -> None:
    error = cli.fails("agents", "apply", cli.write("list.yaml", "- a\n- b\n"), status=1)
    assert "must be a JSON object" in error


def test_applying_twice_gives_v1_then_v2(cli: Cli) -> None:
    assert cli.apply(doubler()) == "applied doubler v1"
    yaml_file = cli.write("again.yaml", json.dumps(doubler()))  # JSON is YAML too
    assert cli("agents", "apply", yaml_file).stdout.strip() == "applied doubler v2"
    rows = table_rows(cli("agents", "list").stdout)
    assert [row[:3] for row in rows] == [["doubler", "2", "2"]]
    stored = cli.stored_agent("doubler")
    assert stored is not None and stored.version == 2
    assert stored.definition == doubler()


def test_run_usage_and_lookup_errors(cli: Cli) -> None:
    cli.apply(doubler())
    error = cli.fails("run", "doubler", "--input", "not json", status=2)
    assert "--input is not valid JSON" in error
    error = cli.fails("run", "unknown-agent", "--wait", status=1)
    assert "agent 'unknown-agent' not found" in error
    error = cli.fails("runs", "show", "run_unknown", status=1)
    assert "run_unknown" in error and "not found" in error
    # A microVM agent's run needs a runtime node, which this process is not: refused up front
    # rather than left queued with the command exiting as if it had failed.
    cli.apply({"name": "scrape", "runtime": {"tier": "microvm", "entrypoint": "jobs:scrape"}})
    error = cli.fails("run", "scrape", "--wait", status=2)
    assert "scrape runs in a microVM: --wait needs a server with a runtime node" in error
    # none of them created a run
    assert table_rows(cli("runs", "list").stdout) == []


def test_run_wait_prints_the_finished_run_and_runs_show_its_steps(cli: Cli) -> None:
    cli.apply(doubler())
    finished = cli.run_wait("doubler", {"x": 2}, status=0)
    assert finished["status"] == "succeeded"
    assert finished["output"] == {"doubled": 4}
    assert finished["input"] == {"x": 2}
    assert finished["error"] is None
    assert (finished["agentName"], finished["agentVersion"]) == ("doubler", 1)
    run_id = finished["id"]
    assert re.fullmatch(r"run_\w+", run_id)

    queued = cli("run", "doubler", "--input", '{"x": 5}').stdout.strip()
    assert re.fullmatch(r"run_\w+", queued) and queued != run_id

    rows = table_rows(cli("runs", "list").stdout)
    assert [row[:3] for row in rows] == [
        [queued, "doubler v1", "queued"],  # newest first
        [run_id, "doubler v1", "succeeded"],
    ]

    shown = cli("runs", "show", run_id).stdout
    lines = shown.splitlines()
    assert lines[0].startswith(run_id)
    assert "doubler v1" in lines[0] and "succeeded" in lines[0]
    steps = {line.split()[0]: line.split() for line in lines[1:] if line.split()}
    assert steps["start"][1:2] == ["trigger"]
    assert steps["double"][1:2] == ["tool"]
    assert "completed" in steps["start"] and "completed" in steps["double"]
    assert "in flight" not in shown and "error" not in shown


def test_run_wait_stores_each_runs_signed_receipt_at_its_end(cli: Cli) -> None:
    """As lantern serve does: the receipt is in the database when the command returns, not
    issued later by its first read. Graph, code-first and plain runs alike; a microVM run is
    refused --wait without a server (above)."""
    cli.apply(doubler())
    cli.apply({"name": "chat", "model": "gpt-4o-mini", "maxTokens": 20})
    provider = FakeProvider(script=Script(["Hi."])).start()
    try:
        cli.env.update(provider.env())
        finished = [
            cli.run_wait("doubler", {"x": 2}, status=0),
            cli.run_wait("tripler", {"x": 2}, status=0),
            cli.run_wait("chat", "hello", status=0),
        ]
    finally:
        provider.close()
    assert [f["output"] for f in finished][:2] == [{"doubled": 4}, 6]
    for run in finished:
        stored = cli.stored(lambda store, run_id=run["id"]: store.get_receipt(run_id))
        assert stored is not None, run["agentName"]
        receipt = json.loads(stored.body)
        assert (receipt["runId"], receipt["status"]) == (run["id"], "succeeded")
        events = cli.stored(lambda store, run_id=run["id"]: store.events(run_id))
        assert receipt["eventCount"] == len(events)
    # The key that signed them is the data directory's, and verifies them.
    verified = cli("receipt", "verify", finished[1]["id"]).stdout
    assert verified.startswith(f"receipt verified: run {finished[1]['id']} succeeded")


def test_a_failing_tool_fails_the_run_with_its_message(cli: Cli) -> None:
    cli.apply(doubler("boomer", then="math.explode"))
    finished = cli.run_wait("boomer", {"x": 3}, status=1)
    assert finished["status"] == "failed"
    assert finished["output"] is None
    error = finished["error"]
    assert error["step"] == "after"
    assert error["class"] == "tool"
    assert "boom at 6 in after" in error["message"]  # 6: the first step's output reached it

    rows = table_rows(cli("runs", "list", "--status", "failed").stdout)
    assert [row[:3] for row in rows] == [[finished["id"], "boomer v1", "failed"]]

    shown = cli("runs", "show", finished["id"]).stdout
    steps = {line.split()[0]: line for line in shown.splitlines() if line.split()}
    assert "completed" in steps["double"]
    assert "failed" in steps["after"]
    assert "boom at 6" in steps["error:"]


def test_a_tool_not_loaded_fails_the_run_and_says_how_to_load_it(cli: Cli) -> None:
    cli.apply(doubler())
    result = cli("run", "doubler", "--input", '{"x": 1}', "--wait", status=1)
    finished = json.loads(result.stdout)
    assert finished["status"] == "failed"
    assert "'math.double' is not registered" in finished["error"]["message"]
    assert "--app" in finished["error"]["message"]
