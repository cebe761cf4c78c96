"""The export of a run: its journal and its signed receipt in one JSON document.

    {"events": [{seq, runId, stepId, nodeId, kind, attempt, data, at, hash}, ...],
     "receipt": {...}, "signature": "<base64url>", "keyId": "<kid>"}

``receipt``, ``signature`` and ``keyId`` are exactly what ``GET /v1/runs/{id}/receipt`` answers,
so the export carries everything needed to verify it but the public keys. An output stored
apart (``outputRef``) is inline beside its reference as ``output``: the chain covers the
reference, and the verifier checks that the value's bytes hash to it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from lantern.errors import NotFound
from lantern.receipts.issue import Issuer, SignedReceipt
from lantern.sdk.client import AsyncClient
from lantern.store.base import Store
from lantern.views import event_json


def document(
    events: Iterable[Any], signed: SignedReceipt, *, expand: bool = False
) -> dict[str, Any]:
    """``expand``: the events were read with their blobs, whose values go inline."""
    return {"events": [event_json(e, expand=expand) for e in events], **signed.to_json()}


async def local_export(store: Store, issuer: Issuer, run_id: str) -> dict[str, Any]:
    """The export read from the database (the receipt issued if the run has none yet)."""
    run = await store.get_run(run_id)
    if run is None:
        raise NotFound(f"run {run_id} not found")
    signed = await issuer.receipt(run)
    return document(await store.events(run_id, blobs=True), signed, expand=True)


async def remote_export(api: AsyncClient, run_id: str) -> dict[str, Any]:
    """The export read over the API (the server issues the receipt if the run has none)."""
    signed = await api.receipt(run_id)  # first: a 409 for an unfinished run
    events: list[Any] = []
    while page := await api.events(
        run_id, after=events[-1].seq if events else 0, expand_outputs=True
    ):
        events += page
    return document(events, SignedReceipt(signed.receipt, signed.signature, signed.key_id))
