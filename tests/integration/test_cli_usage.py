"""The CLI's first-hour usage, as issue 18 reproduced it: `--app` spelled as a file path, an app
in the current folder, and LANTERN_URL without a key (one usage line, exit 2, nothing read
from a local database); `workers list`, `journal verify`, `secrets` and `runtime` through the
server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import httpx
import pytest
from click.testing import CliRunner

from lantern import Client
from lantern.cli.main import main
from tests.api.test_endpoints import NOOP
from tests.proxy import forward_proxy
from tests.server import ALL_SCOPES, LANTERN, Server, free_port, make_key

TRIAGE_APP = textwrap.dedent(
    '''
    import lantern

    app = lantern.App()


    @app.tool("tickets.classify")
    def classify(text: str) -> dict:
        """Label a ticket by a keyword (a sync tool)."""
        return {"label": "billing" if "refund" in text else "other"}
    '''
)

AGENT = {
    "name": "classify",
    "graph": {
        "nodes": [
            {"id": "start", "type": "trigger"},
            {
                "id": "label",
                "type": "tool",
                "data": {"tool": "tickets.classify", "args": {"text": "{{ input.text }}"}},
            },
        ],
        "edges": [{"source": "start", "target": "label"}],
    },
}


def clean_env(**extra: str) -> dict[str, str]:
    """The user's shell: no PYTHONPATH pointing at their folder, no server unless given."""
    drop = ("PYTHONPATH", "LANTERN_URL", "LANTERN_API_KEY", "LANTERN_DATABASE_URL")
    return {k: v for k, v in os.environ.items() if k not in drop} | extra


def lantern(
    *args: str, env: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The console script, as the user runs it."""
    return subprocess.run(
        [LANTERN, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )


def in_process(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The same ``main()`` the console script calls, without paying for a new interpreter
    (one per command would cost seconds each on a loaded machine)."""
    unset: dict[str, str | None] = {k: None for k in os.environ if k not in env}
    with (
        CliRunner().isolation(env={**unset, **env}) as (out, err, _),
        mock.patch.object(sys, "argv", ["lantern", *args]),
    ):
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        return subprocess.CompletedProcess(
            args, code, out.getvalue().decode(), err.getvalue().decode()
        )


def assert_usage_line(done: subprocess.CompletedProcess[str], *words: str) -> None:
    """Exit 2 with one line on stderr that says what to do, and no traceback."""
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.fixture
def app_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "triage"
    folder.mkdir()
    (folder / "triage_app.py").write_text(TRIAGE_APP)
    (folder / "agent.json").write_text(json.dumps(AGENT))
    return folder


@pytest.fixture
def sqlite_server(tmp_path: Path) -> Iterator[Server]:
    server = Server(f"sqlite:///{tmp_path / 'server.db'}", tmp_path / "serve.log").start()
    yield server
    server.stop()


def test_app_given_as_a_file_path_is_one_usage_line(app_folder: Path, tmp_path: Path) -> None:
    db = tmp_path / "never.db"
    env = clean_env(LANTERN_DATABASE_URL=f"sqlite:///{db}")
    done = lantern("serve", "--app", "./triage_app.py:app", env=env, cwd=app_folder)
    assert_usage_line(done, "--app triage_app:app", "not a file path")
    # From elsewhere, the line names the folder to give as --app-dir.
    assert "Traceback" not in done.stderr
    assert not db.exists()  # nothing was started or written


def test_bad_app_arguments_are_one_usage_line_each(
    app_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))  # --app-dir goes first on it
    db = tmp_path / "never.db"
    env = clean_env(LANTERN_DATABASE_URL=f"sqlite:///{db}")
    monkeypatch.chdir(tmp_path)
    # From elsewhere, the line names the folder to give as --app-dir.
    done = in_process("serve", "--app", "triage/triage_app.py:app", env=env)
    assert_usage_line(done, "--app triage_app:app --app-dir triage")
    done = in_process("run", "classify", "--wait", "--app", "triage/triage_app.py", env=env)
    assert_usage_line(done, "--app triage_app:app --app-dir triage")
    for bad in ("triage-app:app", "triage_app:not-a-name"):
        assert_usage_line(in_process("serve", "--app", bad, env=env), "is not a")
    missing = in_process("serve", "--app", "triage_app:app", "--app-dir", "nowhere", env=env)
    assert_usage_line(missing, "--app-dir 'nowhere' is not a directory")
    (app_folder / "broken_app.py").write_text("import lantern\napp = 1 / 0\n")
    broken = in_process("serve", "--app", "broken_app:app", "--app-dir", "triage", env=env)
    assert_usage_line(broken, "broken_app.py:2", "ZeroDivisionError")
    absent = in_process("serve", "--app", "no_such_module:app", "--app-dir", "triage", env=env)
    assert_usage_line(absent, "cannot import --app module 'no_such_module'")
    # Workers share runs through PostgreSQL's notifications; SQLite's stay in one process.
    workers = in_process("serve", "--app", "triage_app:app", "--workers", "2", env=env)
    assert_usage_line(workers, "--workers above 1 needs PostgreSQL")
    assert not db.exists()  # nothing was started or written


def test_app_in_the_current_folder_loads_without_pythonpath(
    app_folder: Path, tmp_path: Path
) -> None:
    env = clean_env(LANTERN_DATABASE_URL=f"sqlite:///{tmp_path / 'cli.db'}")
    applied = lantern("agents", "apply", "agent.json", env=env, cwd=app_folder)
    assert applied.returncode == 0, applied.stderr
    done = lantern(
        "run", "classify", "--input", '{"text": "refund please"}', "--wait",
        "--app", "triage_app:app", env=env, cwd=app_folder,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["output"] == {"label": "billing"}
    # --app-dir names the folder from anywhere else.
    elsewhere = lantern(
        "run", "classify", "--input", '{"text": "hi"}', "--wait",
        "--app", "triage_app:app", "--app-dir", str(app_folder), env=env, cwd=tmp_path,
    )  # fmt: skip
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert json.loads(elsewhere.stdout)["output"] == {"label": "other"}


def test_serve_imports_the_app_from_its_own_folder(app_folder: Path, tmp_path: Path) -> None:
    database_url = f"sqlite:///{tmp_path / 'serve.db'}"
    port = free_port()
    env = clean_env(LANTERN_DATABASE_URL=database_url, LANTERN_DATA_DIR=str(tmp_path))
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        [LANTERN, "serve", "--app", "triage_app:app", "--port", str(port)],
        env=env,
        cwd=app_folder,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()
        key = make_key(database_url, "default", ALL_SCOPES)
        with Client(url, key) as client:
            client.apply_agent(AGENT)
            run = client.wait(client.create_run("classify", {"text": "refund"}).id, timeout=30)
        assert run.status == "succeeded" and run.output == {"label": "billing"}
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def test_lantern_url_without_a_key_fails_instead_of_reading_the_database(tmp_path: Path) -> None:
    db = tmp_path / "local.db"
    env = clean_env(LANTERN_URL="http://127.0.0.1:9", LANTERN_DATABASE_URL=f"sqlite:///{db}")
    agent_file = tmp_path / "agent.json"
    agent_file.write_text(json.dumps(AGENT))
    for args in (
        ["runs", "list"],
        ["runs", "show", "run_x"],
        ["agents", "list"],
        ["agents", "apply", str(agent_file)],
        ["run", "classify"],
        ["workers", "list"],
        ["journal", "verify", "run_x"],
        ["receipt", "verify", "run_x"],
        ["secrets", "list"],
        ["secrets", "set", "TOKEN"],
        ["secrets", "delete", "TOKEN"],
        ["runtime", "nodes"],
        ["runtime", "vms"],
        ["approvals", "list"],
        ["runs", "cancel", "run_" + "0" * 28],
        ["runs", "follow", "run_x"],
    ):
        assert_usage_line(in_process(*args, env=env), "LANTERN_API_KEY", "LANTERN_URL")
    assert not db.exists()  # the local database was never opened
    both = in_process("runs", "list", "--database-url", f"sqlite:///{db}", env=env)
    assert_usage_line(both, "--database-url and LANTERN_URL")
    # Without LANTERN_URL the same command reads the local database, as before.
    local = in_process("runs", "list", env=clean_env(LANTERN_DATABASE_URL=f"sqlite:///{db}"))
    assert local.returncode == 0, local.stderr


def test_workers_list_and_journal_verify_go_to_the_server(sqlite_server: Server) -> None:
    key = make_key(sqlite_server.database_url, "default", ALL_SCOPES)
    admin = make_key(sqlite_server.database_url, "default", "admin")
    with Client(sqlite_server.url, key) as client:
        client.apply_agent(NOOP)
        run = client.wait(client.create_run("noop", {"x": 1}).id, timeout=30)
    # No database at all: only the server can answer.
    nowhere = "sqlite:////nonexistent/dir/never.db"

    def remote(api_key: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        env = clean_env(
            LANTERN_URL=sqlite_server.url,
            LANTERN_API_KEY=api_key,
            LANTERN_DATABASE_URL=nowhere,
            COLUMNS="200",
            **env,
        )
        return in_process(*args, env=env)

    workers = remote(admin, "workers", "list")
    assert workers.returncode == 0, workers.stderr
    assert f"test-{sqlite_server.port}" in workers.stdout and "heartbeat" in workers.stdout
    refused = remote(key, "workers", "list")  # no admin scope
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1
    assert "admin" in refused.stderr, refused.stderr

    verified = remote(key, "journal", "verify", run.id)
    assert verified.returncode == 0, verified.stderr
    assert f"journal of {run.id} verified" in verified.stdout
    missing = remote(key, "journal", "verify", "run_missing")
    assert missing.returncode == 1 and "not found" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1

    # Behind a proxy the environment names, the command line's own client goes through it
    # (as the SDK's does): `runs list` is one request of it.
    with forward_proxy() as proxy:
        listed = remote(key, "runs", "list", HTTP_PROXY=proxy.url)
    assert listed.returncode == 0, listed.stderr
    assert run.id in listed.stdout
    assert [method for method, _ in proxy.seen] == ["GET"]
    assert proxy.seen[0][1].startswith(f"{sqlite_server.url}/v1/runs")
    for command in (("runs", "list"), ("journal", "verify", run.id)):  # either client
        bad = remote(key, *command, HTTP_PROXY="socks5://h:1")
        assert_usage_line(bad, "the proxy for http:// must be an http:// URL")


def test_secrets_and_runtime_go_to_the_server(sqlite_server: Server, tmp_path: Path) -> None:
    key = make_key(
        sqlite_server.database_url, "default", ALL_SCOPES + ",secrets:read,secrets:write"
    )
    operator = make_key(sqlite_server.database_url, "default", "", operator=True)
    with Client(sqlite_server.url, key) as client:
        client.apply_agent(NOOP)
        run = client.wait(client.create_run("noop", {"x": 1}).id, timeout=30)
    nowhere = "sqlite:////nonexistent/dir/never.db"  # only the server can answer

    def remote(api_key: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        env = clean_env(
            LANTERN_URL=sqlite_server.url,
            LANTERN_API_KEY=api_key,
            LANTERN_DATABASE_URL=nowhere,
            LANTERN_DATA_DIR=str(tmp_path / "no-data-here"),
            COLUMNS="200",
        )
        return subprocess.run(
            [LANTERN, *args], env=env, input=stdin, capture_output=True, text=True, timeout=60
        )

    stored = remote(key, "secrets", "set", "CRM_TOKEN", stdin="s3cret\n")
    assert stored.returncode == 0, stored.stderr
    assert stored.stdout.strip() == f"set CRM_TOKEN on {sqlite_server.url}"
    listed = remote(key, "secrets", "list")
    assert listed.returncode == 0 and "CRM_TOKEN" in listed.stdout, listed.stderr
    assert "s3cret" not in listed.stdout
    with httpx.Client(
        base_url=sqlite_server.url, headers={"Authorization": f"Bearer {key}"}
    ) as api:
        names = [s["name"] for s in api.get("/v1/secrets").json()["items"]]
    assert names == ["CRM_TOKEN"]  # stored by the server, under its sealing key
    elsewhere = remote(key, "secrets", "list", "--workspace", "other")
    assert_usage_line(elsewhere, "--workspace", "key's workspace")
    deleted = remote(key, "secrets", "delete", "CRM_TOKEN")
    assert deleted.returncode == 0 and "deleted CRM_TOKEN" in deleted.stdout, deleted.stderr
    again = remote(key, "secrets", "delete", "CRM_TOKEN")
    assert again.returncode == 1 and "not found" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1

    nodes = remote(operator, "runtime", "nodes")  # the cluster's state: an operator's
    assert nodes.returncode == 0 and "heartbeat" in nodes.stdout, nodes.stderr
    refused = remote(key, "runtime", "nodes")  # every workspace scope, but not an operator
    assert refused.returncode == 1 and "operator" in refused.stderr, refused.stderr
    vms = remote(key, "runtime", "vms", run.id)  # a graph run has no VMs
    assert vms.returncode == 0 and "vm" in vms.stdout and run.id not in vms.stdout, vms.stderr
    assert_usage_line(remote(key, "runtime", "vms"), "needs a RUN_ID")
    assert not (tmp_path / "no-data-here").exists()  # nothing local was opened or made


@pytest.mark.parametrize(
    "args, words",
    [
        (["serve", "--log-format", "xml"], "'xml' is not one of 'text', 'json'"),
        (["serve", "--port", "-3"], "is not in the range"),
        (["runs", "show"], "Missing argument 'RUN_ID'"),
        (["secrets", "set"], "Missing argument 'NAME'"),
        (["keys", "create", "--scopes"], "requires an argument"),
        (["runtime", "vms", "run_a", "run_b"], "unexpected extra argument"),
        (["runs", "rerun"], "No such command 'rerun'"),
    ],
)
def test_every_command_s_usage_error_is_one_line(args: list[str], words: str) -> None:
    done = in_process(*args, env=clean_env(LANTERN_DATABASE_URL="sqlite:////nonexistent/x.db"))
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], done.stderr
