"""A workload calling an MCP server's tool with ctx.tool: the control plane's App registers the
server (tests/crash/crash_app: ``notes``), the VM only names the tool."""

from lantern.workload import resumed


async def jots(ctx, text="from a vm"):
    added = await ctx.tool("notes.add", text=text)
    return {"added": added, "resumed": resumed()}
