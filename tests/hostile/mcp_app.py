"""An app with the test probe MCP server over stdio, logging its calls to ``$NOTES_LOG``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import lantern

ROOT = Path(__file__).resolve().parent.parent.parent

app = lantern.App()
app.mcp(
    "notes",
    command=[sys.executable, "-m", "tests.mcp.probe_server"],
    env={"NOTES_LOG": os.environ.get("NOTES_LOG", ""), "PYTHONPATH": str(ROOT)},
    cwd=str(ROOT),
)
