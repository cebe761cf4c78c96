"""Fixtures shared by every test: a database per test on each backend, and a receiver.

PostgreSQL tests get a schema of their own (through ``search_path`` in the URL), so tests
running in parallel never see each other's rows.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from lantern.demo.receiver import Receiver
from lantern.store import Store, open_store
from tests.fake_llm import FakeProvider
from tests.pg_server import DEFAULT, URL_FILE, answers
from tests.server import Server

BACKENDS = ["sqlite", "postgres"]

# Test peers (receivers, fake providers) listen on loopback, which tenant URLs may not reach
# by default (docs/security.md): the harness allows it, for in-process workers and every server a
# test starts. tests/hostile/ start their servers with the policy they test instead.
LOOPBACK_ALLOW = "127.0.0.1,::1,localhost"
os.environ.setdefault("LANTERN_EGRESS_ALLOW", LOOPBACK_ALLOW)
# Load and concurrency tests send hundreds of requests a second with one key; the per-key
# rate limit has its own tests (tests/hostile/test_rates.py), which set it.
os.environ.setdefault("LANTERN_RATE_LIMIT", "0")


@pytest.fixture(scope="session")
def pg_base_url() -> str:
    url = os.environ.get("LANTERN_TEST_DATABASE_URL") or (
        URL_FILE.read_text().strip() if URL_FILE.exists() else DEFAULT
    )
    if not answers(url):
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL does not answer at {url} (CI never skips these tests)")
        pytest.skip(f"PostgreSQL does not answer at {url}")
    return url


@contextmanager
def pg_schema(pg_base_url: str) -> Iterator[str]:
    """The URL of a fresh schema of its own, dropped on exit."""
    schema = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(pg_base_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in pg_base_url else "?"
    try:
        yield f"{pg_base_url}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(pg_base_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture
def pg_url(pg_base_url: str) -> Iterator[str]:
    with pg_schema(pg_base_url) as url:
        yield url


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'lantern.db'}"


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return sqlite_url(tmp_path)
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    s = open_store(database_url)
    await s.open()
    yield s
    await s.close()


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeProvider]:
    """The fake model provider, a real HTTP server speaking both wire formats, named by the
    providers' environment variables (OPENAI_BASE_URL and the like) for the test."""
    provider = FakeProvider().start()
    for name, value in provider.env().items():
        monkeypatch.setenv(name, value)
    yield provider
    provider.close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.close()


@pytest.fixture
def api_server(database_url: str, tmp_path: Path) -> Iterator[Server]:
    """A running `lantern serve` on a fresh database (both backends)."""
    server = Server(database_url, tmp_path / "serve.log").start()
    yield server
    server.stop()


@pytest.fixture(scope="module", params=BACKENDS)
def module_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """One running `lantern serve` per backend for all the tests of a module, each test in a
    workspace of its own (tests.server.Server.workspace_key): starting a server per test cost
    more than most of those tests."""
    tmp = tmp_path_factory.mktemp("serve")
    if request.param == "sqlite":
        server = Server(sqlite_url(tmp), tmp / "serve.log").start()
        yield server
        server.stop()
        return
    with pg_schema(request.getfixturevalue("pg_base_url")) as url:
        server = Server(url, tmp / "serve.log").start()
        yield server
        server.stop()
