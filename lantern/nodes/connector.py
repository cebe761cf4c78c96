"""Connector nodes: deliveries to the outside world, over http or email (SMTP)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from lantern import config
from lantern.effects import email, http
from lantern.nodes import templates
from lantern.nodes.base import StepContext


async def execute(ctx: StepContext) -> Any:
    if ctx.node.data.get("connector") == "email":
        return await _email(ctx)
    method = str(ctx.node.data.get("method", "POST")).upper()
    url = ctx.render_url("url")
    headers = ctx.render("headers", {})
    body = ctx.render("body")
    secrets = await ctx.signing_secrets()

    def dispatch() -> Any:
        return http.send(
            ctx.http,
            method=method,
            url=url,
            headers=headers,
            body=body,
            idempotency_key=ctx.idempotency_key,
            timeout_s=float(ctx.node.data.get("timeoutMs", 30_000)) / 1000,
            signing_secrets=secrets,
            follow_redirects=bool(ctx.node.data.get("followRedirects", False)),
        )

    # Claimed and recorded like every delivery (GET /v1/runs/{id}/deliveries): a request the
    # receiver answered is never sent again, one cut off by a crash goes again with its key.
    return await ctx.deliveries.once("http", dispatch, kind="http", target=_target(method, url))


def _target(method: str, url: Any) -> str | None:
    """What the receipt shows the request went to: no query string and no user info, where
    a token (or a secret) would sit."""
    if not isinstance(url, str):
        return None
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # not a URL: the request itself fails with the reason
        return None
    return f"{method} {parts.scheme}://{host}{port}{parts.path}"


async def _email(ctx: StepContext) -> Any:
    data = ctx.node.data
    return await email.send(
        ctx.deliveries,
        smtp_url=config.smtp_url(),
        to=ctx.render("to"),
        cc=ctx.render("cc"),
        sender=ctx.render("from"),
        subject=ctx.render("subject", ""),
        text=_body(ctx, "text" if "text" in data else "body"),
        html=_html(ctx),
        idempotency_key=ctx.idempotency_key,
        timeout_s=float(data.get("timeoutMs", 60_000)) / 1000,
    )


def _body(ctx: StepContext, field: str) -> Any:
    """A declared body part ("" when its template renders to nothing); None when undeclared."""
    if field not in ctx.node.data:
        return None
    value = ctx.render(field)
    return "" if value is None else value


def _html(ctx: StepContext) -> Any:
    """The HTML part: values interpolated into it are HTML-escaped (``|safe`` keeps one as
    is), so input cannot add markup, links or scripts to a message the operator's relay sends."""
    if "html" not in ctx.node.data:
        return None
    value = templates.render_html(
        ctx.node.data["html"], dict(ctx.scope), where=f"{ctx.node.id}.html"
    )
    return "" if value is None else value
