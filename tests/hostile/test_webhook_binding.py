"""Webhook signatures bind the destination and the delivery (v2): a real `lantern serve` signs
a delivery to a real receiver, which checks it with the code docs/webhooks.md prints; the same
request replayed to another endpoint, or with another Idempotency-Key, does not verify."""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lantern.effects import signing
from lantern.store import open_store
from tests.hostile.kit import Peer, Tenant, attack, connector_agent
from tests.server import Server

DOCS = Path(__file__).resolve().parents[2] / "docs" / "webhooks.md"


def documented_v2() -> Any:
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S)
    source = next(b for b in blocks if "def verify_v2(" in b)
    assert inspect.getsource(signing.verify_v2) in source  # the docs print the code itself
    namespace: dict[str, Any] = {}
    exec(compile(source, str(DOCS), "exec"), namespace)
    return namespace["verify_v2"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Tenant, Peer, str]]:
    tmp: Path = tmp_path_factory.mktemp("hooks")
    peer = Peer()
    url = f"sqlite:///{tmp / 'lantern.db'}"
    server = Server(url, tmp / "serve.log", env={"LANTERN_EGRESS_ALLOW": f"127.0.0.1:{peer.port}"})
    server.start()

    async def secret() -> str:
        store = open_store(url)
        await store.open()
        try:
            return await store.ensure_signing_secret("hooks", signing.new_secret())
        finally:
            await store.close()

    tenant = Tenant(server, "hooks", "runs:execute,runs:read,agents:write")
    yield tenant, peer, asyncio.run(secret())
    tenant.close()
    server.stop()
    peer.close()


def test_a_signature_verifies_only_at_its_destination_for_its_delivery(
    setup: tuple[Tenant, Peer, str],
) -> None:
    tenant, peer, secret = setup
    verify_v2 = documented_v2()
    target = f"{peer.url}/orders?x=1"
    agent = connector_agent("hook", target, method="POST", body={"order": 42})
    assert tenant.apply(agent).status_code == 200
    with attack(tenant.server, "webhook-replay", 3):
        assert tenant.finished(tenant.start("hook"))["status"] == "succeeded"
    raw = next(r for r in peer.received if b"/orders" in r)
    head, _, body = raw.partition(b"/orders?x=1")
    headers = dict(line.split(": ", 1) for line in head.decode().split("\n") if ": " in line)
    header, key = headers["Lantern-Signature"], headers["Idempotency-Key"]
    assert verify_v2(secret, header, body, method="POST", url=target, delivery=key)
    # Replayed to another endpoint of the same workspace, with another key, or as a GET:
    assert not verify_v2(
        secret, header, body, method="POST", url=f"{peer.url}/refunds?x=1", delivery=key
    )
    assert not verify_v2(secret, header, body, method="POST", url=target, delivery="0" * 64)
    assert not verify_v2(secret, header, body, method="GET", url=target, delivery=key)
    # v1 alone still verifies (receivers written for it keep working).
    assert signing.verify(secret, header, body)
