"""Connector nodes: deliveries to the outside world, over http or email (SMTP)."""

from __future__ import annotations

from typing import Any

from lantern import config
from lantern.effects import email, http
from lantern.nodes import templates
from lantern.nodes.base import StepContext


async def execute(ctx: StepContext) -> Any:
    if ctx.node.data.get("connector") == "email":
        return await _email(ctx)
    return await http.send(
        ctx.http,
        method=str(ctx.node.data.get("method", "POST")).upper(),
        url=ctx.render_url("url"),
        headers=ctx.render("headers", {}),
        body=ctx.render("body"),
        idempotency_key=ctx.idempotency_key,
        timeout_s=float(ctx.node.data.get("timeoutMs", 30_000)) / 1000,
        signing_secrets=await ctx.signing_secrets(),
        follow_redirects=bool(ctx.node.data.get("followRedirects", False)),
    )


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
