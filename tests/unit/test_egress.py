"""The egress policy's parts: the allow-list's forms, the address kinds, one lookup per
connection (no DNS rebinding), and a bad setting refused at start."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import subprocess
from typing import Any

import pytest

from lantern.demo.receiver import Receiver
from lantern.effects import egress, http
from lantern.effects.egress import EgressPolicy, EgressRefused
from lantern.errors import StepError, UsageError
from tests.server import LANTERN


def ip(text: str) -> Any:
    return ipaddress.ip_address(text)


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.31.0.1", "private"),
        ("192.168.0.1", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("224.0.0.251", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("::ffff:10.0.0.1", "private"),
        ("100.64.0.1", "non-public"),
        ("fc00::1", "private"),
        ("8.8.8.8", None),
        ("2606:4700:4700::1111", None),
    ],
)
def test_address_kinds(text: str, kind: str | None) -> None:
    assert egress.non_public(ip(text)) == kind


def test_allow_list_forms() -> None:
    policy = EgressPolicy.parse("10.0.0.0/8, db.internal, 127.0.0.1:8080, [::1]:9000, fd00::5")
    assert policy.refusal("x", 1, ip("10.9.9.9")) is None
    assert policy.refusal("db.internal", 5432, ip("192.168.3.3")) is None
    assert policy.refusal("DB.Internal.", 5432, ip("192.168.3.3")) is None
    assert policy.refusal("other", 5432, ip("192.168.3.3")) == "private"
    assert policy.refusal("127.0.0.1", 8080, ip("127.0.0.1")) is None
    assert policy.refusal("127.0.0.1", 8081, ip("127.0.0.1")) == "loopback"
    assert policy.refusal("::1", 9000, ip("::1")) is None
    assert policy.refusal("::1", 9001, ip("::1")) == "loopback"
    assert policy.refusal("fd00::5", 1, ip("fd00::5")) is None
    assert EgressPolicy.parse(None).refusal("h", 80, ip("8.8.8.8")) is None


@pytest.mark.parametrize("bad", ["10.0.0.0/33", "host:notaport", "a b", "[::1]x", "h:70000"])
def test_a_malformed_entry_is_a_usage_error(bad: str) -> None:
    with pytest.raises(UsageError, match="LANTERN_EGRESS_ALLOW"):
        EgressPolicy.parse(f"127.0.0.1,{bad}")


async def test_one_lookup_per_connection_and_its_answer_is_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A name that answers an allowed address first and a refused one after (DNS rebinding)
    is connected to at the first answer: there is no second lookup to swap it."""
    receiver = Receiver().start()
    port = int(receiver.url.rsplit(":", 1)[1])
    loop = asyncio.get_running_loop()
    calls: list[str] = []

    async def rebinding(host: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(host)
        answer = "127.0.0.1" if len(calls) == 1 else "10.255.0.1"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answer, port))]

    monkeypatch.setattr(loop, "getaddrinfo", rebinding)
    try:
        async with egress.client(EgressPolicy.parse("127.0.0.0/8")) as client:
            result = await http.send(
                client,
                method="POST",
                url=f"http://rebind.test:{port}/once",
                headers={},
                body={},
                idempotency_key="k",
                timeout_s=5,
            )
            assert result["status"] == 200
            assert calls == ["rebind.test"]
            # A new connection looks up again, and its answer is checked again.
            async with egress.client(EgressPolicy.parse("127.0.0.0/8")) as fresh:
                with pytest.raises(EgressRefused, match=r"10\.255\.0\.1"):
                    await http.send(
                        fresh,
                        method="POST",
                        url=f"http://rebind.test:{port}/twice",
                        headers={},
                        body={},
                        idempotency_key="k",
                        timeout_s=5,
                    )
    finally:
        receiver.close()
    assert receiver.count("/once") == 1 and receiver.count("/twice") == 0


async def test_refusal_is_a_connector_error_that_is_never_retried() -> None:
    async with egress.client(EgressPolicy()) as client:
        with pytest.raises(StepError) as caught:
            await http.send(
                client,
                method="GET",
                url="http://169.254.169.254/latest/meta-data/",
                headers={},
                body=None,
                idempotency_key="k",
                timeout_s=5,
            )
    error = caught.value.to_json()
    assert error["class"] == "connector" and error["retryable"] is False
    assert error["code"] == "egress_refused"
    assert "169.254.169.254" in str(error["message"])
    assert "LANTERN_EGRESS_ALLOW" in str(error["message"])


def test_serve_refuses_a_bad_setting_in_one_line(tmp_path: Any) -> None:
    env = {
        "LANTERN_EGRESS_ALLOW": "10.0.0.0/99",
        "LANTERN_DATABASE_URL": f"sqlite:///{tmp_path}/x.db",
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run([LANTERN, "serve"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    assert done.stderr.strip().count("\n") == 0 and "LANTERN_EGRESS_ALLOW" in done.stderr
