"""Issuing receipts: when a run finishes, sign what its journal says, once.

The runner has a run's receipt issued after the commit that finished it (in the background,
many to a transaction: lantern.receipts.batch). A process that dies before it is stored leaves
the run without one, so reading a receipt issues it when it is missing. The store keeps the
first receipt stored for a run and hands it back to every later issuer, so a re-drive, a second
replica or a retry never yields a second, different receipt.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from lantern.config import Settings
from lantern.errors import Conflict, NotFound
from lantern.receipts.keys import KeyRing, load_ring, register
from lantern.store.base import Store
from lantern.store.codec import canonical_json
from lantern.store.records import Run, StoredReceipt
from lantern.views import run_json

log = logging.getLogger("lantern.receipts")

RECEIPT_VERSION = 1


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def output_digest(output: Any) -> str:
    """Over the canonical JSON of the run's output; a run without one (failed, cancelled)
    has the output ``null``, whose canonical JSON is the four bytes ``null``."""
    return digest(canonical_json(output))


@dataclass(frozen=True)
class SignedReceipt:
    receipt: dict[str, Any]
    signature: str  # Ed25519 over canonical_json(receipt), base64url without padding
    key_id: str

    @classmethod
    def of(cls, stored: StoredReceipt) -> SignedReceipt:
        return cls(json.loads(stored.body), stored.signature, stored.key_id)

    def to_json(self) -> dict[str, Any]:
        return {"receipt": self.receipt, "signature": self.signature, "keyId": self.key_id}


class Issuer:
    def __init__(self, store: Store, ring: KeyRing) -> None:
        self.store = store
        self.ring = ring

    async def receipt(self, run: Run) -> SignedReceipt:
        """The run's receipt, issued now if it has none; Conflict while it is unfinished."""
        if not run.finished:
            raise Conflict(f"run {run.id} has not finished ({run.status}): it has no receipt yet")
        stored = await self.store.get_receipt(run.id)
        return SignedReceipt.of(stored) if stored is not None else await self.issue(run)

    async def issue(self, run: Run) -> SignedReceipt:
        """Sign the finished run's receipt and store it, or return the one already stored."""
        return SignedReceipt.of(await self.store.put_receipt(await self.sign(run)))

    async def sign(self, run: Run) -> StoredReceipt:
        """The finished run's receipt, signed now and not stored."""
        return self.signed(run, *await self.store.journal_head(run.id))

    def signed(self, run: Run, count: int, head: str | None) -> StoredReceipt:
        """The finished run's receipt over its journal head (``journal_head``'s answer),
        signed now and not stored: the one signing a single read and a batch both use."""
        if head is None:
            raise Conflict(f"run {run.id}'s journal is not hash-chained: it cannot have a receipt")
        receipt = {
            "version": RECEIPT_VERSION,
            "runId": run.id,
            "workspace": run.workspace,
            "agentName": run.agent_name,
            "agentVersion": run.agent_version,
            "status": run.status,
            "eventCount": count,
            "journalHead": f"sha256:{head}",
            "outputDigest": output_digest(run.output),
            "usage": run_json(run)["usage"],
            "issuedAt": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "keyId": self.ring.kid,
        }
        body = canonical_json(receipt)
        return StoredReceipt(run.id, self.ring.kid, body.decode(), self.ring.sign(body))

    async def after_finish(self, run_id: str) -> None:
        """Issue the receipt of a run just finished, here and now (the batcher's fallback when
        it is not running). A failure here is logged, not raised: the run is finished, and
        reading the receipt issues it later."""
        try:
            run = await self.store.get_run(run_id)
            if run is None:
                raise NotFound(f"run {run_id} not found")
            await self.issue(run)
        except Exception as exc:
            log.warning("run %s: receipt not issued now (it will be when read): %s", run_id, exc)


async def open_issuer(settings: Settings, store: Store) -> Issuer:
    """Load this process's keys, register them in the database, and issue with them."""
    ring = load_ring(settings)
    await register(store, ring)
    return Issuer(store, ring)
