"""A workload calling an MCP server's tool with ctx.tool: the control plane's App registers the
server (tests/crash/crash_app: ``notes``), the VM only names the tool."""

from typing import Any

from lantern.workload import Context, entrypoint, resumed


@entrypoint
async def jots(ctx: Context, text: str = "from a vm") -> dict[str, Any]:
    added = await ctx.tool("notes.add", text=text)
    return {"added": added, "resumed": resumed()}
