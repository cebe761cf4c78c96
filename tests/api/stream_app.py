"""The code-first agents tests/api/test_stream.py follows, in one App for one shared server:
tests/crash/code_app.py's ``streamed`` (ctx.model) and tests/crash/pydantic_app.py's ``clerk``
(a Pydantic AI agent's run_stream),
with tests/crash/crash_app.py's tools for the graphs."""

from __future__ import annotations

import lantern
from tests.crash import code_app, crash_app, pydantic_app

app = lantern.App()
for source in (crash_app.app, code_app.app, pydantic_app.app):
    app.agents.update(source.agents)
    app.tools.update({k: v for k, v in source.tools.items() if k not in app.tools})
