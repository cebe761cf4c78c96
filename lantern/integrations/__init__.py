"""Lantern meeting the tools agent builders already use: MCP servers (``mcp``) and Pydantic AI
agents (``pydantic_ai``, the optional extra ``lantern[pydantic-ai]``)."""
