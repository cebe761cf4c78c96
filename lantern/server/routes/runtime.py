"""The microVM tier's API: the VMs' reports (per-VM token), runtime nodes, the scheduler."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel

from lantern.runtime.relay import Relay
from lantern.runtime.scheduler import Scheduler
from lantern.runtime.views import node_json, scheduler_json, vm_json
from lantern.server.auth import OPERATOR
from lantern.server.deps import owned_run, scope, services
from lantern.server.schemas import PROBLEMS
from lantern.store.records import ApiKey
from lantern.store.runtime import SCHEDULER

router = APIRouter(tags=["runtime"], responses=PROBLEMS)


class Report(BaseModel):
    events: list[dict[str, Any]]


def _runtime(request: Request) -> tuple[Scheduler, Relay]:
    found: tuple[Scheduler, Relay] = request.app.state.runtime
    return found


VM_TOKEN: dict[str, Any] = {"security": [{"vmToken": []}]}


@router.post("/v1/runtime/report", openapi_extra=VM_TOKEN)
async def report(request: Request, body: Report) -> dict[str, Any]:
    """Step events a VM's harness reported, relayed by its runtime node under the VM's token."""
    _, relay = _runtime(request)
    vm = await relay.authenticate(request.headers.get("authorization"))
    written = await relay.report(vm, body.events)
    return {"written": written}


class Call(BaseModel):
    stepId: str
    position: int | None = None
    call: dict[str, Any]


@router.post("/v1/runtime/call", openapi_extra=VM_TOKEN)
async def call(request: Request, body: Call) -> dict[str, Any]:
    """A step the VM's workload asks the control plane to perform (``ctx.model``,
    ``ctx.tool``): journaled like any step; the answer is its output or its error."""
    _, relay = _runtime(request)
    vm = await relay.authenticate(request.headers.get("authorization"))
    return await relay.call(vm, body.model_dump(exclude_none=True))


class Step(BaseModel):
    stepId: str
    position: int | None = None
    attempt: int | None = None
    retry: dict[str, Any] | None = None
    output: Any = None
    error: dict[str, Any] | None = None


@router.post("/v1/runtime/step", openapi_extra=VM_TOKEN)
async def step(request: Request, body: Step) -> dict[str, Any]:
    """What the VM's own ``ctx.step`` proposes: which attempt to run, then what it did
    (``output`` or ``error``); the control plane decides what follows (go on, retry, fail)."""
    _, relay = _runtime(request)
    proposal = body.model_dump(exclude_unset=True)
    outcome = "output" in proposal or "error" in proposal  # it always ends in a commit
    vm = await relay.authenticate(request.headers.get("authorization"), commits=outcome)
    return await relay.step(vm, proposal)


@router.get("/v1/runtime/steps", openapi_extra=VM_TOKEN)
async def steps(request: Request) -> dict[str, Any]:
    """The run's completed steps and their outputs, for a resumed workload."""
    _, relay = _runtime(request)
    vm = await relay.authenticate(request.headers.get("authorization"))
    return await relay.steps(vm)


@router.get("/v1/runs/{run_id}/vms")
async def run_vms(
    request: Request, run_id: str, key: Annotated[ApiKey, Depends(scope("runs:read"))]
) -> dict[str, Any]:
    store = services(request).store
    await owned_run(store, run_id, key)
    return {"items": [vm_json(v) for v in await store.run_vms(run_id)]}


@router.get("/v1/runtime/nodes")
async def nodes(
    request: Request, key: Annotated[ApiKey, Depends(scope(OPERATOR))]
) -> dict[str, Any]:
    """Every runtime node of the cluster (an operator key: they serve every workspace)."""
    s = services(request)
    found = await s.store.list_nodes()
    return {"items": [node_json(n, s.settings.node_ttl) for n in found]}


@router.get("/v1/runtime/scheduler")
async def scheduler(
    request: Request, key: Annotated[ApiKey, Depends(scope(OPERATOR))]
) -> dict[str, Any]:
    """The scheduler leader and what waits, across workspaces (an operator key)."""
    sched, _ = _runtime(request)
    lease = await services(request).store.get_named_lease(SCHEDULER)
    return {**scheduler_json(lease), **sched.status()}
