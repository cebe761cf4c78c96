"""Verifying a receipt and the journal it was signed over, offline, and saying what fails.

The input is an export (``export.py``): ``{"events": [...], "receipt": {...}, "signature": ...,
"keyId": ...}``, and a JWK set. Each check adds a line naming what does not hold; an empty list
means the receipt verifies. docs/receipts.md spells out the same steps for a third party.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from lantern.engine import events as ev
from lantern.engine.chain import GENESIS, canonical, link
from lantern.receipts.issue import output_digest
from lantern.receipts.keys import thumbprint, verifies
from lantern.store.codec import canonical_json, dumps

TERMINAL_STATUS = ev.FINAL_STATUS


def verify(document: Any, keys: Sequence[Any]) -> list[str]:
    """Every way the export ``document`` fails to verify against the JWKs ``keys``."""
    if not isinstance(document, Mapping):
        return ["the export is not a JSON object"]
    receipt = document.get("receipt")
    if not isinstance(receipt, Mapping):
        return ["the export has no receipt object"]
    failures = check_signature(receipt, document.get("signature"), document.get("keyId"), keys)
    events = document.get("events")
    if not isinstance(events, list):
        return [*failures, "the export has no list of events"]
    return failures + check_journal(receipt, events)


def check_signature(
    receipt: Mapping[str, Any], signature: Any, key_id: Any, keys: Sequence[Any]
) -> list[str]:
    kid = receipt.get("keyId")
    if key_id is not None and key_id != kid:
        return [f"keyId {key_id!r} differs from the receipt's keyId {kid!r}"]
    if not isinstance(signature, str):
        return ["the export has no signature"]
    jwk = next((k for k in keys if isinstance(k, Mapping) and k.get("kid") == kid), None)
    if jwk is None:
        return [f"no key {kid!r} in the key set: the signature cannot be checked"]
    if not isinstance(jwk.get("x"), str) or thumbprint(jwk["x"]) != kid:
        return [f"key {kid!r} in the key set is not the key its id names (thumbprint differs)"]
    try:
        message = canonical_json(dict(receipt))
    except ValueError as exc:
        return [f"the receipt cannot be put in canonical JSON: {exc}"]
    if not verifies(jwk, message, signature):
        return [f"signature does not verify with key {kid}"]
    return []


def check_journal(receipt: Mapping[str, Any], events: Sequence[Any]) -> list[str]:
    """The events against what the receipt says of them: chain head, count, output, run."""
    failures: list[str] = []
    run_id = receipt.get("runId")
    stored = chained = GENESIS
    for position, event in enumerate(events, start=1):
        try:
            body, seq = _canonical(event)
        except (KeyError, TypeError, ValueError) as exc:
            failures.append(f"event {position}: malformed ({exc}); the chain stops here")
            chained = "malformed"
            break
        if seq != position:
            failures.append(f"event {seq}: found where event {position} belongs (one is missing)")
        inline = _inline_output_problem(event)
        if inline is not None:
            failures.append(f"event {seq}: {inline}")
        if event["runId"] != run_id:
            failures.append(f"event {seq}: belongs to run {event['runId']}, not {run_id}")
        chained = link(chained, body)
        # Each event's own hash is checked against the hash before it as exported, so a
        # changed event is named by itself rather than as every event after it.
        expected = link(stored, body)
        own = event.get("hash")
        if own is not None and own != expected:
            failures.append(f"event {seq}: hash does not match its content")
        stored = own if isinstance(own, str) else expected
    head = receipt.get("journalHead")
    if f"sha256:{chained}" != head:
        failures.append(f"journalHead differs: the events chain to sha256:{chained}, not {head}")
    if receipt.get("eventCount") != len(events):
        failures.append(
            f"eventCount differs: the receipt says {receipt.get('eventCount')},"
            f" the export holds {len(events)} events"
        )
    last = events[-1] if events and isinstance(events[-1], Mapping) else {}
    ended = TERMINAL_STATUS.get(str(last.get("kind")))
    if ended != receipt.get("status"):
        failures.append(
            f"status differs: the receipt says {receipt.get('status')},"
            f" the journal ends with {last.get('kind')}"
        )
    data = last.get("data")
    succeeded = last.get("kind") == ev.RUN_SUCCEEDED and isinstance(data, Mapping)
    output = data.get("output") if succeeded else None  # type: ignore[union-attr]
    try:
        found = output_digest(output)
    except ValueError as exc:
        found = f"(cannot be computed: {exc})"
    if found != receipt.get("outputDigest"):
        failures.append(
            f"outputDigest differs: the run's output in the events hashes to {found},"
            f" the receipt says {receipt.get('outputDigest')}"
        )
    return failures


def _stored_data(data: Any) -> Any:
    """The event's data as journaled: an output inlined beside its ``outputRef`` (an export's
    convenience, docs/receipts.md) is not part of it; the reference is."""
    if isinstance(data, Mapping) and "outputRef" in data and "output" in data:
        return {k: v for k, v in data.items() if k != "output"}
    return data


def _inline_output_problem(event: Mapping[str, Any]) -> str | None:
    """Why an output inlined beside its reference is not the value the reference names."""
    data = event.get("data")
    if not (isinstance(data, Mapping) and "outputRef" in data and "output" in data):
        return None
    try:
        body = dumps(data["output"]).encode()
    except (TypeError, ValueError) as exc:
        return f"its inline output cannot be encoded ({exc})"
    found = "sha256:" + hashlib.sha256(body).hexdigest()
    if found != data["outputRef"]:
        return f"its inline output hashes to {found}, not to its outputRef {data['outputRef']}"
    return None


def _canonical(event: Any) -> tuple[bytes, int]:
    """The event's bytes in the chain (lantern/engine/chain.py), and its seq."""
    if not isinstance(event, Mapping):
        raise TypeError("not an object")
    seq = event["seq"]
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise TypeError("seq is not an integer")
    at = datetime.fromisoformat(event["at"])
    if at.tzinfo is None:
        raise ValueError("at has no time zone")
    body = canonical(
        event["runId"],
        seq,
        event["kind"],
        event["stepId"],
        event["nodeId"],
        event["attempt"],
        at,
        _stored_data(event["data"]),
    )
    return body, seq
