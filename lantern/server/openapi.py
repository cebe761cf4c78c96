"""The OpenAPI document, with what FastAPI leaves out: the Problem schema of every error
answer, and the bearer API key that every /v1 operation needs."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from lantern.server.schemas import Problem


def document(api: FastAPI) -> dict[str, Any]:
    if api.openapi_schema is not None:
        return api.openapi_schema
    doc = get_openapi(
        title=api.title, version=api.version, description=api.description, routes=api.routes
    )
    components = doc.setdefault("components", {})
    components.setdefault("schemas", {})["Problem"] = Problem.model_json_schema()
    components["securitySchemes"] = {
        "apiKey": {"type": "http", "scheme": "bearer", "description": "lk_... API key"},
        # What a runtime node relays a VM's reports under (docs/runtime.md), never an API key.
        "vmToken": {"type": "http", "scheme": "bearer", "description": "lvm.... per-VM token"},
    }
    for path, operations in doc["paths"].items():
        if path.startswith("/v1/"):
            for operation in operations.values():
                # A public /v1 operation declares its own empty security (the receipt keys).
                operation.setdefault("security", [{"apiKey": []}])
    api.openapi_schema = doc
    return doc
