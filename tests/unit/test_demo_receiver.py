"""The receiver the crash tests count deliveries with: a request whose sender was killed
between its headers and its body delivered nothing, so it is not counted (a crash test's
"delivered once, or twice if a kill caught it in flight" would count it). The same holds for
the fake model provider (tests/unit/test_fake_llm.py)."""

from __future__ import annotations

import httpx

from lantern.demo.receiver import running
from tests.helpers import cut_off_after_headers


def test_a_request_cut_off_before_its_body_is_not_a_delivery() -> None:
    with running() as receiver:
        headers = {"Content-Type": "application/json", "Idempotency-Key": "k-s3"}
        cut_off_after_headers(receiver.url, "/s3", headers, len(b'{"step": 3}'))
        sent = httpx.post(f"{receiver.url}/s3", content=b'{"step": 3}', headers=headers)
        assert sent.json() == {"path": "/s3", "received": 1}
        assert receiver.count("/s3") == 1 and receiver.hits[0].body == {"step": 3}
