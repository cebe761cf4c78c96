"""The demo's last step: the finished run's signed receipt, fetched and verified."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from lantern.receipts.export import remote_export
from lantern.receipts.verify import verify
from lantern.sdk import AsyncClient


async def fetch(api: AsyncClient, run_id: str) -> tuple[dict[str, Any], list[Any]]:
    """The run's export (events and receipt) and the server's public keys."""
    return await remote_export(api, run_id), await api.receipt_keys()


def show(exported: dict[str, Any], keys: list[Any], out: Console) -> int:
    """Verify the receipt as `lantern receipt verify` does and say so; 0 when it verifies."""
    r = exported["receipt"]
    out.print(
        f"GET /v1/runs/{r['runId']}/receipt -> signed by key {r['keyId']}:"
        f" {r['eventCount']} events, journal head {r['journalHead'][:23]}…"
    )
    failures = verify(exported, keys)
    for failure in failures:
        out.print(f"[red]receipt check failed: {failure}")
    if failures:
        return 1
    out.print(
        "[green]Receipt verified: the Ed25519 signature holds and the journal's hash chain"
        " recomputes to the signed head."
    )
    return 0
