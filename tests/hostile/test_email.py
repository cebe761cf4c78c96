"""Email through the operator's relay (docs/security.md), against a real `lantern serve` and a real
SMTP server: only the operator's sender domains, a bounded number of recipients, and HTML in
which interpolated values are escaped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.hostile.kit import Tenant, attack
from tests.integration.test_email import SmtpSink
from tests.server import Server


@pytest.fixture(scope="module")
def sink() -> Iterator[SmtpSink]:
    s = SmtpSink().start()
    yield s
    s.close()


@pytest.fixture(scope="module")
def tenant(sink: SmtpSink, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenant]:
    tmp: Path = tmp_path_factory.mktemp("email")
    env = {
        "LANTERN_SMTP_URL": sink.url,
        "LANTERN_EMAIL_FROM_DOMAINS": "example.com",
        "LANTERN_EMAIL_MAX_RECIPIENTS": "3",
    }
    server = Server(f"sqlite:///{tmp / 'lantern.db'}", tmp / "serve.log", env=env).start()
    t = Tenant(server, "mallory", "runs:execute,runs:read,agents:write")
    yield t
    t.close()
    server.stop()


def mail(name: str, **data: Any) -> dict[str, Any]:
    base = {
        "connector": "email",
        "to": "{{ input.to }}",
        "subject": name,
        "from": "{{ input.from }}",
    }
    return {
        "name": name,
        "graph": {
            "nodes": [
                {"id": "start", "type": "trigger"},
                {"id": "mail", "type": "connector", "data": {**base, **data}},
            ],
            "edges": [{"source": "start", "target": "mail"}],
        },
    }


def test_senders_recipients_and_html_are_the_operator_s_to_allow(
    tenant: Tenant, sink: SmtpSink
) -> None:
    assert tenant.apply(mail("spoof", text="hi")).status_code == 200
    assert tenant.apply(mail("html", html="<p>Hello {{ input.name }}</p>")).status_code == 200
    many = [f"user{i}@example.org" for i in range(5)]
    with attack(tenant.server, "email", 3):
        spoof = tenant.start("spoof", {"to": "a@example.org", "from": "ceo@bank.test"})
        crowd = tenant.start("spoof", {"to": many, "from": "news@example.com"})
        script = "<script>alert(1)</script><a href='https://evil.test'>x</a>"
        html = tenant.start(
            "html", {"to": "a@example.org", "from": "hi@example.com", "name": script}
        )
        for run_id, words in (
            (spoof, "LANTERN_EMAIL_FROM_DOMAINS"),
            (crowd, "LANTERN_EMAIL_MAX_RECIPIENTS"),
        ):
            run = tenant.finished(run_id)
            assert run["status"] == "failed" and words in run["error"]["message"], run
        assert tenant.finished(html)["status"] == "succeeded"
    assert sink.received("spoof") == []
    [sent] = sink.received("html")
    body = sent.message.get_body(("html",))
    assert body is not None
    content = body.get_content()
    assert "<script>" not in content and "&lt;script&gt;" in content
    assert "<a href" not in content and "<p>Hello " in content
