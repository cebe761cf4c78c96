"""/ui: the run waterfall, the runs list, approvals, schedules and rate limits in the browser.

The pages are shells: they carry no run data and need no key. Their script asks for an API key
once, keeps it in the tab's sessionStorage and reads everything through the same REST API a
client uses, so the browser gets exactly what that key may see. Nothing is fetched from
elsewhere at run time: the script and the stylesheet ship in the package.
"""

from __future__ import annotations

from pathlib import Path as FsPath
from typing import Annotated, get_args

from fastapi import APIRouter, Path, Query
from fastapi.responses import HTMLResponse, RedirectResponse
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.staticfiles import StaticFiles

from lantern.server.routes.runs import Status

STATIC_DIR = FsPath(__file__).resolve().parent.parent / "ui" / "static"
STATUSES = get_args(Status)

# The page's own files only: no inline script, no other origin. The API key lives in the
# page, so a script injected through run data must have nowhere to run.
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

_templates = Environment(
    loader=PackageLoader("lantern.server", "ui"),
    autoescape=select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
)

router = APIRouter(prefix="/ui", include_in_schema=False)
static = StaticFiles(directory=STATIC_DIR)


def _page(template: str, **context: object) -> HTMLResponse:
    html = _templates.get_template(template).render(**context)
    return HTMLResponse(html, headers=_HEADERS)


@router.get("")
async def home() -> RedirectResponse:
    return RedirectResponse("/ui/runs", status_code=307)


@router.get("/runs", response_class=HTMLResponse)
async def runs_page(
    status: Status | None = None,
    agentName: Annotated[str | None, Query(max_length=100)] = None,
) -> HTMLResponse:
    return _page("runs.html", status=status, statuses=STATUSES, agent_name=agentName)


@router.get("/runs/{run_id}", response_class=HTMLResponse)
async def run_page(run_id: Annotated[str, Path(min_length=1, max_length=100)]) -> HTMLResponse:
    return _page("run.html", run_id=run_id)


@router.get("/schedules", response_class=HTMLResponse)
async def schedules_page() -> HTMLResponse:
    return _page("schedules.html")


@router.get("/limits", response_class=HTMLResponse)
async def limits_page() -> HTMLResponse:
    return _page("limits.html")


@router.get("/approvals", response_class=HTMLResponse)
async def approvals_page() -> HTMLResponse:
    return _page("approvals.html")
