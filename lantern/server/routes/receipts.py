"""Receipts: a finished run's signed receipt, and the public keys that verify receipts."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from lantern.receipts.keys import PublicKey
from lantern.server.deps import owned_run, scope, services
from lantern.server.schemas import PROBLEMS, JwkSet, ReceiptOut
from lantern.store.records import ApiKey

router = APIRouter(tags=["receipts"])


@router.get("/v1/runs/{run_id}/receipt", response_model=ReceiptOut, responses=PROBLEMS)
async def receipt(
    run_id: str,
    request: Request,
    key: Annotated[ApiKey, Depends(scope("runs:read"))],
) -> dict[str, Any]:
    """The finished run's signed receipt (409 while the run is unfinished). A run that
    finished without one, because its process died right after, gets it now."""
    s = services(request)
    run = await owned_run(s.store, run_id, key)
    return (await s.issuer.receipt(run)).to_json()


@router.get("/v1/receipts/keys", response_model=JwkSet, openapi_extra={"security": []})
async def keys(request: Request) -> dict[str, Any]:
    """Every key that has signed receipts here, as a JWK set (RFC 7517; OKP, Ed25519)."""
    found = await services(request).store.signing_keys()
    return {"keys": [PublicKey(k.kid, k.x).jwk() for k in found]}
