"""A run's large outputs read back, and a finished run deleted (docs/retention.md).

``GET /v1/runs/{id}/events?expand=outputs`` lives with the events route (runs.py); this module
holds the blob route and ``DELETE /v1/runs/{id}``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request, Response

from lantern.engine.retention import delete_finished_run
from lantern.errors import NotFound
from lantern.server.deps import owned_run, scope, services
from lantern.server.schemas import PROBLEMS
from lantern.store.records import ApiKey

router = APIRouter(prefix="/v1/runs", tags=["runs"], responses=PROBLEMS)


@router.get(
    "/{run_id}/blobs/{ref}",
    responses={200: {"content": {"application/json": {}}, "description": "the stored value"}},
)
async def blob(
    run_id: str,
    ref: Annotated[str, Path(min_length=1, max_length=200)],
    request: Request,
    key: Annotated[ApiKey, Depends(scope("runs:read"))],
) -> Response:
    """The JSON value a ``sha256:`` reference in this run's journal stands for, as stored: its
    bytes hash to the reference. A reference the run's journal does not hold is 404, whatever
    another run holds."""
    store = services(request).store
    await owned_run(store, run_id, key)
    body = await store.blob(run_id, ref)
    if body is None:
        raise NotFound(f"run {run_id} holds no output {ref}")
    return Response(
        body,
        media_type="application/json",
        headers={"ETag": f'"{ref}"', "Cache-Control": "private, max-age=3600"},
    )


@router.delete("/{run_id}", status_code=204)
async def delete(
    run_id: str,
    request: Request,
    key: Annotated[ApiKey, Depends(scope("runs:execute"))],
) -> Response:
    """Delete a finished run with its events, deliveries, approvals, receipt and the blobs no
    other run references, in one transaction; 409 while it is unfinished. It answers 404 from
    then on. An export taken before still verifies offline against its receipt."""
    store = services(request).store
    await owned_run(store, run_id, key)
    await delete_finished_run(store, run_id)
    return Response(status_code=204)
