"""The egress policy (docs/security.md) against a real `lantern serve` and real peers on 127.0.0.1.

The server allows exactly one peer (``127.0.0.1:<allowed port>``); a second peer, the stand-in
for a metadata service or an admin port, must never see a request. Every refusal fails the step
with class ``connector``, not retried, naming the address and LANTERN_EGRESS_ALLOW.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.hostile.kit import Peer, Tenant, attack, connector_agent
from tests.server import Server

RETRY = {"maxAttempts": 3, "backoffMs": 10}


@pytest.fixture(scope="module")
def peers() -> Iterator[tuple[Peer, Peer]]:
    allowed, secret = Peer(), Peer()
    secret.routes["/latest/meta-data/iam"] = (200, {}, b'{"AccessKeyId": "AKIA-LEAKED"}')
    yield allowed, secret
    allowed.close()
    secret.close()


@pytest.fixture(scope="module")
def server(peers: tuple[Peer, Peer], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    allowed, _ = peers
    tmp: Path = tmp_path_factory.mktemp("egress")
    env = {"LANTERN_EGRESS_ALLOW": f"127.0.0.1:{allowed.port}"}
    s = Server(f"sqlite:///{tmp / 'lantern.db'}", tmp / "serve.log", env=env).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tenant(server: Server) -> Iterator[Tenant]:
    t = Tenant(server, "mallory", "runs:execute,runs:read,agents:write,agents:read")
    yield t
    t.close()


def refused(tenant: Tenant, run_id: str, address: str) -> dict[str, Any]:
    """The run failed on the fetch step, once, with the policy's refusal."""
    run = tenant.finished(run_id)
    assert run["status"] == "failed", run
    events = tenant.events(run_id)
    failed = [e for e in events if e["kind"] == "step_failed"]
    assert len(failed) == 1, events
    error: dict[str, Any] = failed[0]["data"]["error"]
    assert error["class"] == "connector" and error["retryable"] is False, error
    assert "egress refused" in error["message"], error
    assert address in error["message"] and "LANTERN_EGRESS_ALLOW" in error["message"], error
    assert not [e for e in events if e["kind"] == "step_retrying"], events
    assert "AKIA" not in str(events) and "AKIA" not in str(run)
    return error


def test_non_public_addresses_are_refused(
    server: Server, tenant: Tenant, peers: tuple[Peer, Peer]
) -> None:
    _, secret = peers
    p = secret.port
    targets = {
        f"http://127.0.0.1:{p}/latest/meta-data/iam": "127.0.0.1",
        f"http://localhost:{p}/latest/meta-data/iam": "localhost",
        f"http://[::1]:{p}/latest/meta-data/iam": "::1",
        "http://169.254.169.254/latest/meta-data/iam": "169.254.169.254",
        "http://10.0.0.7/admin": "10.0.0.7",
        "http://192.168.1.1/admin": "192.168.1.1",
        "https://172.16.5.4/admin": "172.16.5.4",
        "http://[fe80::1]/": "fe80::1",
        f"http://0.0.0.0:{p}/latest/meta-data/iam": "0.0.0.0",
        f"http://[::ffff:127.0.0.1]:{p}/latest/meta-data/iam": "127.0.0.1",
        f"http://2130706433:{p}/latest/meta-data/iam": "127.0.0.1",  # 127.0.0.1 as one number
        "http://224.0.0.1/": "224.0.0.1",
        "http://100.64.0.1/": "100.64.0.1",
    }
    assert tenant.apply(connector_agent("probe", "{{ input.url }}", retry=RETRY)).status_code == 200
    with attack(server, "ssrf", len(targets)):
        runs = {tenant.start("probe", {"url": url}): address for url, address in targets.items()}
        for run_id, address in runs.items():
            refused(tenant, run_id, address)
    assert secret.hits == []


def test_a_host_from_run_input_is_checked(
    server: Server, tenant: Tenant, peers: tuple[Peer, Peer]
) -> None:
    _, secret = peers
    url = f"http://{{{{ input.host }}}}:{secret.port}/latest/meta-data/iam"
    assert tenant.apply(connector_agent("by-input", url)).status_code == 200
    hosts = ["127.0.0.1", "localhost", "169.254.169.254"]
    with attack(server, "ssrf", len(hosts)):
        runs = {tenant.start("by-input", {"host": h}): h for h in hosts}
        for run_id, host in runs.items():
            refused(tenant, run_id, host)
    assert secret.hits == []


def test_a_redirect_into_a_refused_address_is_not_followed(
    server: Server, tenant: Tenant, peers: tuple[Peer, Peer]
) -> None:
    allowed, secret = peers
    allowed.routes["/to-secret"] = (
        302,
        {"Location": f"http://127.0.0.1:{secret.port}/latest/meta-data/iam"},
        b"",
    )
    allowed.routes["/to-metadata"] = (
        307,
        {"Location": "http://169.254.169.254/latest/meta-data/iam"},
        b"",
    )
    agent = connector_agent("hop", "{{ input.url }}", followRedirects=True)
    assert tenant.apply(agent).status_code == 200
    with attack(server, "ssrf", 2):
        first = tenant.start("hop", {"url": f"{allowed.url}/to-secret"})
        second = tenant.start("hop", {"url": f"{allowed.url}/to-metadata"})
        error = refused(tenant, first, "127.0.0.1")
        assert str(secret.port) in error["message"]
        refused(tenant, second, "169.254.169.254")
    assert secret.hits == []
    assert allowed.hits.count("/to-secret") == 1 and allowed.hits.count("/to-metadata") == 1


def test_the_allow_list_lets_one_address_through(
    server: Server, tenant: Tenant, peers: tuple[Peer, Peer]
) -> None:
    allowed, secret = peers
    allowed.routes["/ok"] = (200, {"Content-Type": "application/json"}, b'{"fine": 1}')
    assert tenant.apply(connector_agent("allowed", "{{ input.url }}")).status_code == 200
    ok = tenant.finished(tenant.start("allowed", {"url": f"{allowed.url}/ok"}))
    assert ok["status"] == "succeeded", ok
    assert ok["output"]["body"] == {"fine": 1}, ok
    # The same host on another port is not listed.
    other = tenant.start("allowed", {"url": f"http://127.0.0.1:{secret.port}/latest/meta-data/iam"})
    refused(tenant, other, "127.0.0.1")
    assert secret.hits == []


def test_interpolated_values_cannot_change_the_host_or_path(
    server: Server, tenant: Tenant, peers: tuple[Peer, Peer]
) -> None:
    allowed, secret = peers
    agent = connector_agent("items", "{{ input.base }}/items/{{ input.id }}")
    assert tenant.apply(agent).status_code == 200
    sneaky = f"x@127.0.0.1:{secret.port}/latest/meta-data/iam?#"
    with attack(server, "url-injection", 1):
        run = tenant.finished(tenant.start("items", {"base": allowed.url, "id": sneaky}))
    assert run["status"] == "succeeded", run
    assert f"/items/x%40127.0.0.1%3A{secret.port}%2Flatest%2Fmeta-data%2Fiam%3F%23" in allowed.hits
    assert secret.hits == []
