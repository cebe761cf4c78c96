"""Signed webhooks: sign/verify, the store's secrets on both backends, http.send against a real
receiver that checks signatures with the code docs/webhooks.md prints, and the CLI."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import inspect
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

import lantern
from lantern.effects import http, signing
from lantern.engine.runs import apply_agent, create_run
from lantern.engine.worker import Worker
from lantern.errors import StepError
from lantern.store import Store, open_store
from lantern.store.records import Run

DOCS = Path(__file__).resolve().parents[2] / "docs" / "webhooks.md"
SIGNATURE = re.compile(r"t=(\d+)(?:,v1=[0-9a-f]{64})+(?:,v2=[0-9a-f]{64})*")
SECRET_SHAPE = re.compile(r"lwh_[A-Za-z0-9_-]{43}")

Verify = Callable[..., bool]


def documented_check() -> tuple[str, Verify]:
    """The receiver check as docs/webhooks.md prints it: its source, and the function it defines."""
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S)
    source = next(b for b in blocks if "def verify(" in b)
    namespace: dict[str, Any] = {}
    exec(compile(source, str(DOCS), "exec"), namespace)
    return source, namespace["verify"]


DOC_SOURCE, doc_verify = documented_check()


# -- a receiver that keeps what arrived, byte for byte ----------------------------------


@dataclass(frozen=True)
class Received:
    path: str
    method: str
    headers: dict[str, str]
    signatures: list[str]  # every Lantern-Signature header, to catch a duplicate
    body: bytes
    verified: bool | None  # None: the receiver knew no secret and did not check


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class SigningReceiver:
    """Records raw requests; with ``secrets`` set, refuses (401) any request the documented
    check does not accept for one of them, against its own clock shifted by ``skew_s``."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self.secrets: list[str] = []
        self.skew_s = 0.0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                header = self.headers.get("Lantern-Signature", "")
                verified = None
                if receiver.secrets:
                    now = time.time() + receiver.skew_s
                    verified = any(doc_verify(s, header, body, now=now) for s in receiver.secrets)
                with receiver._lock:
                    receiver.requests.append(
                        Received(
                            self.path,
                            self.command,
                            {k.lower(): v for k, v in self.headers.items()},
                            self.headers.get_all("Lantern-Signature") or [],
                            body,
                            verified,
                        )
                    )
                status, answer = (401, b"bad signature") if verified is False else (200, b"{}")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            do_GET = do_POST
            do_PUT = do_POST

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def last(self) -> Received:
        with self._lock:
            return self.requests[-1]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


@pytest.fixture
def hooks() -> Iterator[SigningReceiver]:
    r = SigningReceiver()
    yield r
    r.close()


TRIGGER_ONLY = {"name": "hook", "graph": {"nodes": [{"id": "start", "type": "trigger"}]}}


async def run_in(store: Store, workspace: str) -> Run:
    await apply_agent(store, TRIGGER_ONLY, workspace=workspace)
    return await create_run(store, "hook", {}, workspace=workspace)


async def deliver(
    store: Store,
    run: Run,
    url: str,
    *,
    method: str = "POST",
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One http delivery as the connector makes it, signed with the run's workspace secrets."""
    async with httpx.AsyncClient() as client:
        return await http.send(
            client,
            method=method,
            url=url,
            headers=headers or {},
            body=body,
            idempotency_key=f"key-{run.id}",
            timeout_s=10,
            signing_secrets=await store.signing_secrets(run.workspace),
        )


# -- sign and verify --------------------------------------------------------------------


def test_the_documented_check_is_the_reference_verify() -> None:
    assert inspect.getsource(signing.verify) in DOC_SOURCE


def test_the_documented_test_vector() -> None:
    header = "t=1718000000,v1=939f6783371dc7e154d3d6b77f69eb3ea59b65252f11a8de5259f435fdcd68af"
    assert header in DOCS.read_text()
    assert signing.sign(["lwh_example"], b'{"order":42}', timestamp=1718000000) == header
    assert signing.verify("lwh_example", header, b'{"order":42}', now=1718000000)


@pytest.mark.parametrize("check", [signing.verify, doc_verify], ids=["module", "docs"])
def test_sign_then_verify(check: Verify) -> None:
    body = '{"amount":12,"note":"café"}'.encode()
    header = signing.sign(["lwh_s3cret"], body)
    t = int(header.split(",")[0].removeprefix("t="))
    assert SIGNATURE.fullmatch(header) and abs(t - time.time()) < 5
    expected = hmac.new(b"lwh_s3cret", f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    assert header == f"t={t},v1={expected}"
    assert check("lwh_s3cret", header, body)
    assert not check("lwh_s3cret", header, body.replace(b"12", b"13"))  # tampered body
    assert not check("lwh_s3cret", header, body + b" ")
    assert not check("lwh_other", header, body)  # wrong secret
    assert check("lwh_s3cret", header, body, now=t + 300)
    assert not check("lwh_s3cret", header, body, now=t + 301)  # too old
    assert not check("lwh_s3cret", header, body, now=t - 301)  # from the future
    assert check("lwh_s3cret", header, body, tolerance=3600, now=t + 3000)


def test_an_empty_body_signs_the_timestamp_and_a_dot() -> None:
    header = signing.sign(["k"], b"", timestamp=1700000000)
    expected = hmac.new(b"k", b"1700000000.", hashlib.sha256).hexdigest()
    assert header == f"t=1700000000,v1={expected}"
    assert signing.verify("k", header, b"", now=1700000000)
    assert not signing.verify("k", header, b"{}", now=1700000000)


def test_several_secrets_give_one_v1_each_and_any_one_verifies() -> None:
    header = signing.sign(["new", "old"], b"x", timestamp=1700000000)
    assert SIGNATURE.fullmatch(header) and header.count("v1=") == 2
    assert header.split(",")[1] == signing.sign(["new"], b"x", timestamp=1700000000).split(",")[1]
    for secret in ("new", "old"):
        assert signing.verify(secret, header, b"x", now=1700000000)
    assert not signing.verify("neither", header, b"x", now=1700000000)
    # Unknown schemes and spaces are ignored.
    assert signing.verify("new", header.replace(",", ", ") + ",v2=abc", b"x", now=1700000000)
    # A lone string is one secret, not one per character.
    assert signing.sign("new", b"x", timestamp=1) == signing.sign(["new"], b"x", timestamp=1)
    with pytest.raises(ValueError):
        signing.sign([], b"x")
    with pytest.raises(ValueError):
        signing.sign([""], b"x")


@pytest.mark.parametrize(
    "header",
    [
        "",
        "garbage",
        "v1=" + "0" * 64,
        "t=,v1=" + "0" * 64,
        "t=-5,v1=" + "0" * 64,
        "t=1e9,v1=" + "0" * 64,
        "t=\u0661\u0667" + "\u0660" * 8 + ",v1=" + "0" * 64,  # Arabic-Indic digits
        "t=1700000000",
        "t=1700000000,t=1700000000,v1={good}",  # two timestamps: ambiguous, refused
        "t=1700000000,v1=é" + "0" * 63,  # non-ASCII signature: refused, not a TypeError
        "t=1700000000,v1={good}x",
        "t=1700000001,v1={good}",
    ],
)
def test_malformed_or_wrong_headers_fail_without_raising(header: str) -> None:
    good = signing.sign(["k"], b"body", timestamp=1700000000).split("v1=")[1]
    assert not signing.verify("k", header.format(good=good), b"body", now=1700000000)
    assert not doc_verify("k", header.format(good=good), b"body", now=1700000000)


def test_new_secrets_are_random_and_shaped() -> None:
    made = {signing.new_secret() for _ in range(50)}
    assert len(made) == 50 and all(SECRET_SHAPE.fullmatch(s) for s in made)


# -- the store's secrets, on both backends ----------------------------------------------


async def test_a_secret_is_made_once_per_workspace(store: Store) -> None:
    assert await store.signing_secrets("acme") == []
    assert await store.ensure_signing_secret("acme", "lwh_first") == "lwh_first"
    assert await store.ensure_signing_secret("acme", "lwh_second") == "lwh_first"
    assert await store.signing_secrets("acme") == ["lwh_first"]
    assert await store.signing_secrets("other") == []
    assert await store.ensure_signing_secret("other", "lwh_theirs") == "lwh_theirs"
    assert await store.signing_secrets("acme") == ["lwh_first"]


async def test_concurrent_first_uses_agree_on_one_secret(store: Store) -> None:
    got = await asyncio.gather(
        *(store.ensure_signing_secret("race", f"lwh_{i}") for i in range(10))
    )
    assert len(set(got)) == 1
    assert await store.signing_secrets("race") == [got[0]]


async def test_rotation_keeps_the_previous_secret_for_the_overlap(store: Store) -> None:
    await store.rotate_signing_secret("acme", "lwh_a", 3600)  # no secret yet: just set it
    assert await store.signing_secrets("acme") == ["lwh_a"]
    await store.rotate_signing_secret("acme", "lwh_b", 3600)
    assert await store.signing_secrets("acme") == ["lwh_b", "lwh_a"]
    await store.rotate_signing_secret("acme", "lwh_c", 0.4)  # at most two: a drops out
    assert await store.signing_secrets("acme") == ["lwh_c", "lwh_b"]
    await asyncio.sleep(0.6)
    assert await store.signing_secrets("acme") == ["lwh_c"]  # the overlap is over
    await store.rotate_signing_secret("acme", "lwh_d", 0)  # leaked: stops at once
    assert await store.signing_secrets("acme") == ["lwh_d"]
    assert await store.ensure_signing_secret("acme", "lwh_e") == "lwh_d"


# -- http.send against a real receiver ---------------------------------------------------


async def test_a_workspace_with_a_secret_sends_signed_requests(
    store: Store, hooks: SigningReceiver
) -> None:
    secret = await store.ensure_signing_secret("acme", signing.new_secret())
    hooks.secrets = [secret]
    run = await run_in(store, "acme")
    body = {"order": 42, "note": "café ☕", "items": [1, 2]}
    answer = await deliver(store, run, f"{hooks.url}/orders", body=body)
    assert answer == {"status": 200, "body": {}}
    got = hooks.last
    assert got.verified is True
    assert SIGNATURE.fullmatch(got.headers["lantern-signature"])
    assert got.signatures == [got.headers["lantern-signature"]]
    assert got.headers["idempotency-key"] == f"key-{run.id}"
    assert got.headers["content-type"] == "application/json"
    # The signature covers exactly the bytes on the wire: compact UTF-8 JSON.
    assert got.body == json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    assert json.loads(got.body) == body
    header = got.headers["lantern-signature"]
    assert doc_verify(secret, header, got.body)
    assert not doc_verify(secret, header, got.body.replace(b"42", b"43"))  # tampered
    assert not doc_verify(signing.new_secret(), header, got.body)  # wrong secret
    t = int(header.split(",")[0].removeprefix("t="))
    assert not doc_verify(secret, header, got.body, now=t + signing.TOLERANCE_S + 1)  # stale


async def test_a_workspace_without_a_secret_sends_unsigned_requests(
    store: Store, hooks: SigningReceiver
) -> None:
    await store.ensure_signing_secret("acme", signing.new_secret())  # someone else's
    run = await run_in(store, "plain")
    await deliver(store, run, f"{hooks.url}/orders", body={"order": 1})
    got = hooks.last
    assert "lantern-signature" not in got.headers and got.verified is None
    assert got.headers["idempotency-key"] == f"key-{run.id}"
    assert got.body == b'{"order":1}'


async def test_the_receiver_refuses_a_wrong_secret_and_the_step_fails(
    store: Store, hooks: SigningReceiver
) -> None:
    await store.ensure_signing_secret("acme", signing.new_secret())
    hooks.secrets = [signing.new_secret()]  # the receiver was given another secret
    run = await run_in(store, "acme")
    with pytest.raises(StepError) as failed:
        await deliver(store, run, f"{hooks.url}/orders", body={"order": 1})
    assert "answered 401" in str(failed.value) and not failed.value.retryable
    assert hooks.last.verified is False


async def test_a_receiver_whose_clock_is_off_by_more_than_the_tolerance_refuses(
    store: Store, hooks: SigningReceiver
) -> None:
    secret = await store.ensure_signing_secret("acme", signing.new_secret())
    hooks.secrets = [secret]
    run = await run_in(store, "acme")
    hooks.skew_s = signing.TOLERANCE_S - 30  # within tolerance: fine
    await deliver(store, run, f"{hooks.url}/a", body={})
    assert hooks.last.verified is True
    hooks.skew_s = signing.TOLERANCE_S + 30  # the request looks 5.5 minutes old
    with pytest.raises(StepError, match="answered 401"):
        await deliver(store, run, f"{hooks.url}/b", body={})
    assert hooks.last.verified is False


async def test_during_an_overlap_both_secrets_sign(store: Store, hooks: SigningReceiver) -> None:
    old = await store.ensure_signing_secret("acme", signing.new_secret())
    new = signing.new_secret()
    await store.rotate_signing_secret("acme", new, 3600)
    run = await run_in(store, "acme")
    for knows in ([old], [new]):  # a receiver not yet updated, and one already updated
        hooks.secrets = knows
        await deliver(store, run, f"{hooks.url}/x", body={"n": 1})
        assert hooks.last.verified is True
        assert hooks.last.headers["lantern-signature"].count("v1=") == 2
    await store.rotate_signing_secret("acme", signing.new_secret(), 0)
    hooks.secrets = [old, new]
    with pytest.raises(StepError, match="answered 401"):
        await deliver(store, run, f"{hooks.url}/y", body={"n": 1})


async def test_bodiless_and_string_bodies_are_signed_as_sent(
    store: Store, hooks: SigningReceiver
) -> None:
    secret = await store.ensure_signing_secret("acme", signing.new_secret())
    hooks.secrets = [secret]
    run = await run_in(store, "acme")
    await deliver(store, run, f"{hooks.url}/get", method="GET", body={"ignored": True})
    assert hooks.last.body == b"" and hooks.last.verified is True
    await deliver(store, run, f"{hooks.url}/none")
    assert hooks.last.body == b"" and hooks.last.verified is True
    assert doc_verify(secret, hooks.last.headers["lantern-signature"], b"")
    text = "a=1&b=café"
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    await deliver(store, run, f"{hooks.url}/text", body=text, headers=form)
    assert hooks.last.body == text.encode() and hooks.last.verified is True
    assert hooks.last.headers["content-type"] == "application/x-www-form-urlencoded"
    # A JSON body keeps a content type the node set itself.
    typed = {"content-type": "application/vnd.acme+json"}
    await deliver(store, run, f"{hooks.url}/typed", body=[1], headers=typed)
    assert hooks.last.headers["content-type"] == "application/vnd.acme+json"
    assert hooks.last.body == b"[1]" and hooks.last.verified is True


async def test_a_signature_header_set_in_the_node_is_replaced(
    store: Store, hooks: SigningReceiver
) -> None:
    secret = await store.ensure_signing_secret("acme", signing.new_secret())
    hooks.secrets = [secret]
    run = await run_in(store, "acme")
    forged = {"lantern-signature": "t=1,v1=" + "0" * 64}
    await deliver(store, run, f"{hooks.url}/x", body={"a": 1}, headers=forged)
    assert hooks.last.verified is True and len(hooks.last.signatures) == 1


async def test_a_body_that_is_not_json_fails_the_step_before_sending(
    store: Store, hooks: SigningReceiver
) -> None:
    run = await run_in(store, "acme")
    with pytest.raises(StepError, match="body is not JSON") as failed:
        await deliver(store, run, f"{hooks.url}/x", body={"x": float("nan")})
    assert not failed.value.retryable and hooks.requests == []


async def test_a_run_s_http_steps_are_signed_end_to_end(
    store: Store, hooks: SigningReceiver
) -> None:
    from tests.helpers import http_chain

    secret = await store.ensure_signing_secret("acme", signing.new_secret())
    hooks.secrets = [secret]
    await apply_agent(store, http_chain("chain", hooks.url, 2), workspace="acme")
    run = await create_run(store, "chain", {"a": 1}, workspace="acme")
    async with Worker(store, lantern.App(), worker_id="w1", lease_ttl=60) as w:
        assert w.runner is not None
        done = await w.runner.drive(run.id)
    assert [r.verified for r in hooks.requests] == [True, True]
    assert done is not None and done.status == "succeeded"


# -- the CLI ----------------------------------------------------------------------------

# The real entry point with the group registered as lantern/cli/main.py's main() does.
BOOT = (
    "from lantern.cli.main import cli, main; from lantern.cli.webhooks import webhooks;"
    " cli.add_command(webhooks); main()"
)


def lantern_cli(database_url: str, *args: str, status: int = 0) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANTERN_")}
    env["LANTERN_DATABASE_URL"] = database_url
    result = subprocess.run(
        [sys.executable, "-c", BOOT, "webhooks", "secret", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == status, (args, result.stdout, result.stderr)
    return result


def stored_secrets(database_url: str, workspace: str) -> Sequence[str]:
    async def get() -> list[str]:
        store = open_store(database_url)
        await store.open()
        try:
            return await store.signing_secrets(workspace)
        finally:
            await store.close()

    return asyncio.run(get())


def test_cli_shows_the_secret_made_on_first_use_and_rotates_it(database_url: str) -> None:
    first = lantern_cli(database_url, "--workspace", "acme")
    secret = first.stdout.strip()
    assert SECRET_SHAPE.fullmatch(secret) and first.stdout == secret + "\n"
    assert first.stderr == ""
    assert lantern_cli(database_url, "--workspace", "acme").stdout.strip() == secret
    assert stored_secrets(database_url, "acme") == [secret]
    other = lantern_cli(database_url, "--workspace", "other").stdout.strip()
    assert other != secret
    default = lantern_cli(database_url).stdout.strip()
    assert stored_secrets(database_url, "default") == [default]

    rotated = lantern_cli(database_url, "--workspace", "acme", "--rotate")
    new = rotated.stdout.strip()
    assert SECRET_SHAPE.fullmatch(new) and new != secret
    assert "24h" in rotated.stderr
    assert stored_secrets(database_url, "acme") == [new, secret]
    assert lantern_cli(database_url, "--workspace", "acme").stdout.strip() == new

    leaked = lantern_cli(database_url, "--workspace", "acme", "--rotate", "--overlap", "0")
    newest = leaked.stdout.strip()
    assert "no longer signs" in leaked.stderr
    assert stored_secrets(database_url, "acme") == [newest]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--overlap", "1h"], "--overlap only applies with --rotate"),
        (["--rotate", "--overlap", "soon"], "--overlap: invalid duration"),
        (["--rotate", "--overlap", "-1h"], "cannot be negative"),
        (["--workspace", ""], "1-100 characters"),
    ],
)
def test_cli_usage_errors(database_url: str, args: list[str], message: str) -> None:
    result = lantern_cli(database_url, *args, status=2)
    assert result.stdout == "" and message in result.stderr
    assert len(result.stderr.splitlines()) == 1
