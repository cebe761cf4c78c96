"""The fake provider the model crash tests count on: a request whose sender was killed between
its headers and its body is no request. Answered as one, it was a conversation's first turn,
cached under the turn's Idempotency-Key, and the re-drive's whole request then got that
answer (tests/crash/test_llm_crash.py flaked so: a plain agent's third turn came back as its
first). The fake serves every kind of run's model calls alike (graph ai-steps, plain agents,
code-first and microVM agents), so this one check covers them all."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.fake_llm import FakeProvider, Script
from tests.helpers import cut_off_after_headers

KEY = "k-llm-3"
TURNS = ["first", "second", "third"]


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    provider = FakeProvider(script=Script(TURNS)).start()
    yield provider
    provider.close()


def _conversation() -> dict[str, object]:
    """A third turn's request: two assistant turns before it."""
    messages = [{"role": "user", "content": "hi"}]
    for text in TURNS[:2]:
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "go on"}]
    return {"model": "gpt-4o-mini", "messages": messages}


def test_a_request_cut_off_before_its_body_is_not_answered_nor_keyed(fake: FakeProvider) -> None:
    body = json.dumps(_conversation()).encode()
    sent_headers = {"Content-Type": "application/json", "Idempotency-Key": KEY}
    cut_off_after_headers(fake.url, "/v1/chat/completions", sent_headers, len(body))
    sent = httpx.post(
        f"{fake.url}/v1/chat/completions",
        content=body,
        headers=sent_headers,
        timeout=10,
    )
    # The re-sent turn is answered from the conversation it carries; it is the one request.
    assert sent.json()["choices"][0]["message"]["content"] == "third"
    assert [c.key for c in fake.calls()] == [KEY]
