"""The user's side of Lantern: an ``App`` holding tools and code-first agents, loaded with
``--app MODULE:OBJECT``; the ``ToolContext`` a tool may ask for; and ``Context``, what a
code-first agent's function receives (docs/code-agents.md).

``Context`` is abstract on purpose: the engine drives it in-process (``engine/functions.py``)
and a microVM workload gets the same methods over its channel to the control plane
(docs/runtime.md), so one function runs either way unchanged.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import re
import textwrap
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar, get_type_hints, overload

from lantern import flow, threads
from lantern.context import Context as Context
from lantern.errors import UsageError
from lantern.store.records import NewEvent
from lantern.workload.entrypoints import entrypoint
from lantern.workload.replies import Approval as Approval
from lantern.workload.replies import ModelReply as ModelReply
from lantern.workload.replies import key_for

if TYPE_CHECKING:
    from lantern.integrations.mcp import McpServer

F = TypeVar("F", bound=Callable[..., Any])
CommitListener = Callable[[str, Sequence[NewEvent]], None]


DeliverOnce = Callable[[str, Callable[[], Any]], Awaitable[Any]]


@dataclass(frozen=True)
class ToolContext:
    """What a tool may know about the step it runs in; ``idempotency_key`` is stable per attempt."""

    run_id: str
    step_id: str
    attempt: int
    idempotency_key: str
    _deliver: DeliverOnce | None = None
    workspace: str = ""  # the run's workspace, for a tool that serves several tenants

    async def deliver_once(self, name: str, dispatch: Callable[[], Any]) -> Any:
        """Make the delivery ``name`` (a payment, a ticket, a post) at most once per step.

        ``dispatch`` (sync or async) is called only if this step has not delivered ``name``
        before; a re-drive gets the recorded answer back instead. Pass
        ``ctx.idempotency_key`` (or ``ctx.key_for(name)`` when one receiver gets several
        deliveries of this step) to receivers that de-duplicate.
        """
        if self._deliver is None:
            raise UsageError("deliver_once needs a step run by Lantern's engine")
        return await self._deliver(name, dispatch)

    def key_for(self, name: str) -> str:
        """An idempotency key of its own for the delivery ``name`` of this step attempt."""
        return key_for(self.idempotency_key, name)


@dataclass(frozen=True)
class CodeAgent:
    """A code-first agent: a function registered with ``@app.agent``."""

    name: str
    fn: Callable[..., Any]
    version: str  # a digest of the function's source, or the string given
    module: str
    blocking: bool  # a plain ``def``: run on a worker thread with a blocking Context
    # A run's model spend limits, ``{maxUsd, maxTokens}``, as a graph or plain agent's
    # ``budget`` (checked before each ``ctx.model`` call). Not in the hash: agents are cache
    # keys, and the version already tells two registrations apart.
    budget: Mapping[str, Any] | None = field(default=None, compare=False)
    # The workspaces whose runs may run it (None: every one). Elsewhere it does not exist.
    workspaces: frozenset[str] | None = field(default=None, compare=False)
    # Its flow control (``concurrency``, ``maxConcurrentRuns``), stored in its definition.
    flow: Mapping[str, Any] | None = field(default=None, compare=False)

    def serves(self, workspace: str) -> bool:
        return self.workspaces is None or workspace in self.workspaces

    def definition(self) -> dict[str, Any]:
        """What the agents table stores for it, so runs pin it and every replica lists it."""
        stored: dict[str, Any] = {
            "name": self.name,
            "code": {
                "version": self.version,
                "module": self.module,
                "function": getattr(self.fn, "__qualname__", self.name),
            },
        }
        if self.budget is not None:
            stored["budget"] = dict(self.budget)
        if self.flow is not None:
            stored.update(self.flow)
        return stored


AGENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def source_digest(fn: Callable[..., Any]) -> str:
    """A code agent's default version: the first 12 hex digits of its source's SHA-256."""
    try:
        text = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):  # no source file (a REPL, a frozen app): its bytecode
        code = fn.__code__
        text = repr((code.co_code, code.co_consts, code.co_names))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _budget(name: str, budget: Any) -> dict[str, Any] | None:
    """``budget={...}`` of ``@app.agent``: what a definition's ``budget`` block takes."""
    if budget is None:
        return None
    where = f"@app.agent({name!r}, budget=...)"
    if not isinstance(budget, Mapping) or not budget:
        raise UsageError(f"{where}: budget is a mapping with maxUsd and/or maxTokens")
    unknown = set(budget) - {"maxUsd", "maxTokens"}
    if unknown:
        raise UsageError(f"{where}: unknown budget fields {', '.join(sorted(map(str, unknown)))}")
    usd, tokens = budget.get("maxUsd", 0), budget.get("maxTokens", 0)
    if isinstance(usd, bool) or not isinstance(usd, int | float) or usd < 0:
        raise UsageError(f"{where}: maxUsd must be a non-negative number")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise UsageError(f"{where}: maxTokens must be a non-negative integer")
    return dict(budget)


def _code_agent(
    name: Any, fn: Any, version: Any, budget: Any = None, workspaces: Any = None
) -> CodeAgent:
    if not isinstance(name, str) or not AGENT_NAME.match(name):
        raise UsageError(
            f"@app.agent: the name must be a string of 1-100 letters, digits, '.', '_' or '-',"
            f" starting with a letter or digit (got {name!r})"
        )
    if not callable(fn) or inspect.isclass(fn):
        raise UsageError(f"@app.agent({name!r}) decorates a function, not {fn!r}")
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        raise UsageError(f"@app.agent({name!r}): {fn.__name__} is a generator; use a function")
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise UsageError(
            f"@app.agent({name!r}): {fn.__name__} must take the context first: "
            f"def {fn.__name__}(ctx: lantern.Context, ...)"
        )
    if version is not None and (
        not isinstance(version, str)
        or not version
        or len(version) > 100
        or version != version.strip()
        or any(ch.isspace() for ch in version)
    ):
        raise UsageError(f"@app.agent({name!r}): version must be a non-empty string with no spaces")
    return CodeAgent(
        name=name,
        fn=fn,
        version=version if version is not None else source_digest(fn),
        module=getattr(fn, "__module__", None) or "__main__",
        blocking=not inspect.iscoroutinefunction(fn),
        budget=_budget(name, budget),
        workspaces=_workspaces(name, workspaces),
    )


def _workspaces(name: str, workspaces: Any) -> frozenset[str] | None:
    if workspaces is None:
        return None
    if isinstance(workspaces, str):
        raise UsageError(f"{name!r}: workspaces is a list of workspace names, not a string")
    return frozenset(workspaces)


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable[..., Any]
    description: str
    context_param: str | None
    # The JSON schema of its arguments when it is not the function's type hints (an MCP
    # server's tool brings its own); the server then checks the arguments itself.
    schema: Mapping[str, Any] | None = field(default=None, compare=False)

    @property
    def interruptible(self) -> bool:
        """An async tool is cancelled at once; a sync one runs in a thread, which cannot be."""
        return inspect.iscoroutinefunction(self.fn)

    async def call(self, context: ToolContext, args: dict[str, Any]) -> Any:
        kwargs = dict(args)
        if self.context_param is not None:
            kwargs[self.context_param] = context
        if inspect.iscoroutinefunction(self.fn):
            return await self.fn(**kwargs)
        # A sync tool must not block the event loop that journals every other run, nor the
        # default executor's threads that DNS lookups use: it gets a bounded pool of its own.
        return await threads.run_sync(self.fn, **kwargs)


class App:
    """A registry of the user's tools, MCP servers, code-first agents and observers of journal
    commits."""

    def __init__(self) -> None:
        # Every workspace's tools: a run looks one up through tools_for(its workspace).
        self.tools: dict[str, Tool] = {}
        self.agents: dict[str, CodeAgent] = {}
        self.commit_listeners: list[CommitListener] = []
        self.mcp_servers: dict[str, McpServer] = {}
        # A tool or MCP server registered for some workspaces only: its name -> those workspaces.
        # Elsewhere it does not exist (not "forbidden", which would tell a tenant it is there).
        self.only_in: dict[str, frozenset[str]] = {}

    def mcp(
        self,
        name: str,
        *,
        command: Sequence[str] | None = None,
        url: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        workspaces: Iterable[str] | None = None,
    ) -> McpServer:
        """Make every tool of a Model Context Protocol server a tool named ``name.<tool>``:
        started with ``command`` (stdio) or reached at ``url`` (streamable HTTP), once per
        process, on first use (see lantern.integrations.mcp). With ``workspaces``, only runs
        of those workspaces see its tools."""
        from lantern.integrations.mcp import McpServer

        if name in self.mcp_servers:
            raise UsageError(f"MCP server {name!r} is registered twice")
        server = McpServer(name, command=command, url=url, env=env, cwd=cwd)
        self.mcp_servers[name] = server
        self._restrict(name, workspaces)
        return server

    def _restrict(self, name: str, workspaces: Iterable[str] | None) -> None:
        only = _workspaces(name, workspaces)
        if only is not None:
            self.only_in[name] = only

    def tools_for(self, workspace: str) -> Toolbox:
        """The tools runs of ``workspace`` see: every lookup of a tool by name goes through
        this, so none can leave out a tool registered for other workspaces only."""
        return Toolbox(self, workspace)

    async def _connect(self, server: McpServer) -> None:
        """Start ``server`` (once per process; its Toolbox asks) and register its tools."""
        for tool in (await server.connect()).values():
            if tool.qualified not in self.tools or self.tools[tool.qualified].schema is not None:
                self.tools[tool.qualified] = _mcp_tool(
                    server, tool.name, tool.description, tool.schema
                )

    async def aclose(self) -> None:
        """Stop the MCP servers this process started."""
        for server in self.mcp_servers.values():
            await server.close()

    def agent(
        self,
        name: Any = None,
        *,
        version: str | None = None,
        budget: Mapping[str, Any] | None = None,
        workspaces: Iterable[str] | None = None,
        concurrency: Mapping[str, Any] | None = None,
        max_concurrent_runs: int | None = None,
    ) -> Callable[[F], F]:
        """Register ``fn(ctx, **input)`` (``async def`` or plain ``def``) as the code-first
        agent ``name`` (default: the function's name), at ``version`` (default: a digest of
        its source), each run's model calls held to ``budget`` (``{"maxUsd": ...,
        "maxTokens": ...}``, as a definition's). With ``workspaces``, only those workspaces
        see it, run it or schedule it; for the others it does not exist. It may also be a
        microVM agent's entrypoint (docs/runtime.md). ``@app.agent`` without parentheses
        works too. ``concurrency={"key": "{{ input.customer }}", "limit": 1}`` and
        ``max_concurrent_runs`` are a definition's flow control (docs/flow-control.md)."""
        bare = version is None and budget is None and workspaces is None
        bare = bare and concurrency is None and max_concurrent_runs is None
        if callable(name) and not isinstance(name, str) and bare:
            fn = name
            self._add_agent(_code_agent(getattr(fn, "__name__", None), fn, None))
            return fn  # type: ignore[no-any-return]

        def register(fn: F) -> F:
            given = getattr(fn, "__name__", None) if name is None else name
            agent = _code_agent(given, fn, version, budget, workspaces)
            limits = flow.code_settings(agent.name, concurrency, max_concurrent_runs)
            self._add_agent(replace(agent, flow=limits or None))
            return fn

        return register

    def _add_agent(self, agent: CodeAgent) -> None:
        if agent.name in self.agents:
            raise UsageError(f"agent {agent.name!r} is registered twice")
        self.agents[agent.name] = agent
        entrypoint(agent.fn, workspaces=agent.workspaces)

    @overload
    def entrypoint(self, fn: F, *, workspaces: Iterable[str] | None = None) -> F: ...
    @overload
    def entrypoint(
        self, fn: None = None, *, workspaces: Iterable[str] | None = None
    ) -> Callable[[F], F]: ...
    def entrypoint(self, fn: F | None = None, *, workspaces: Iterable[str] | None = None) -> Any:
        """Register ``fn(ctx, **input)`` as a microVM agent's entrypoint (a VM runs nothing
        its app did not register: docs/runtime.md); with ``workspaces``, only runs of those
        workspaces may run it. ``@app.entrypoint``, ``@app.entrypoint(workspaces=[...])`` or
        ``app.entrypoint(fn)``."""
        only = _workspaces(getattr(fn, "__name__", "entrypoint"), workspaces)
        return entrypoint(fn, workspaces=only)

    def agent_for(self, workspace: str, name: str) -> CodeAgent | None:
        """The code-first agent ``name`` as ``workspace`` sees it: None where it is not
        registered, or registered for other workspaces only."""
        found = self.agents.get(name)
        return found if found is not None and found.serves(workspace) else None

    def tool(
        self, name: str | None = None, *, workspaces: Iterable[str] | None = None
    ) -> Callable[[F], F]:
        """Register ``fn`` as the tool ``name`` (default: its own name); with ``workspaces``,
        only runs of those workspaces can call it, and only their agents can name it."""

        def register(fn: F) -> F:
            tool_name = name or fn.__name__
            if tool_name in self.tools:
                raise UsageError(f"tool {tool_name!r} is registered twice")
            self.tools[tool_name] = Tool(
                tool_name, fn, inspect.getdoc(fn) or "", _context_param(fn)
            )
            self._restrict(tool_name, workspaces)
            return fn

        return register

    def on_commit(self, listener: CommitListener) -> CommitListener:
        """Call ``listener(run_id, events)`` after each journal commit of this process."""
        self.commit_listeners.append(listener)
        return listener


@dataclass(frozen=True)
class Toolbox:
    """An App's tools as the runs of one workspace see them (``App.tools_for``). A tool or
    MCP server registered for other workspaces only is not there at all: not "forbidden",
    which would tell a tenant it exists."""

    app: App
    workspace: str

    def _serves(self, name: str) -> bool:
        server_name, dot, _ = name.partition(".")
        for restricted in (name, server_name) if dot else (name,):
            only = self.app.only_in.get(restricted)
            if only is not None and self.workspace not in only:
                return False
        return True

    def has(self, name: str) -> bool:
        """Whether ``name`` is a registered tool or names a registered MCP server's
        (``server.tool``), without reaching the server: whether it has that tool is known
        once ``find`` has started it."""
        if not self._serves(name):
            return False
        if name in self.app.tools:
            return True
        server_name, dot, rest = name.partition(".")
        return bool(dot and rest) and server_name in self.app.mcp_servers

    def registered(self, name: str) -> Tool | None:
        """The tool ``name`` if this process has it already, starting no MCP server."""
        return self.app.tools.get(name) if self._serves(name) else None

    async def find(self, name: str) -> Tool | None:
        """The tool ``name``; an MCP server's (``server.tool``) once the server is up. A
        server that cannot be reached raises StepError (class ``tool``, retryable)."""
        if not self._serves(name):
            return None
        found = self.app.tools.get(name)
        if found is not None:
            return found
        server_name, dot, _ = name.partition(".")
        server = self.app.mcp_servers.get(server_name) if dot else None
        if server is None:
            return None
        await self.app._connect(server)
        return self.app.tools.get(name)

    async def resolve(self, names: Sequence[str]) -> list[str]:
        """An agent's tool list with each ``server.*`` replaced by that MCP server's tools
        (in the server's order), leaving out what this workspace is not served; the servers
        named are started first."""
        out: list[str] = []
        for name in names:
            if not self._serves(name):
                continue
            server_name, dot, rest = name.partition(".")
            server = self.app.mcp_servers.get(server_name) if dot else None
            if server is not None:
                await self.app._connect(server)
            if rest == "*" and server is not None:
                out += [f"{server_name}.{t}" for t in server.tools]
            else:
                out.append(name)
        return list(dict.fromkeys(out))


_MCP_CONTEXT = "_lantern_step"  # no MCP tool argument is likely to be called this


def _mcp_tool(server: McpServer, tool: str, description: str, schema: Mapping[str, Any]) -> Tool:
    async def call(**arguments: Any) -> Any:
        context: ToolContext = arguments.pop(_MCP_CONTEXT)
        return await server.call(tool, arguments, context.idempotency_key)

    return Tool(f"{server.name}.{tool}", call, description, _MCP_CONTEXT, schema=schema)


def _context_param(fn: Callable[..., Any]) -> str | None:
    try:
        hints = get_type_hints(fn)
    except Exception:  # unresolvable annotations: fall back to the raw ones
        hints = dict(getattr(fn, "__annotations__", {}))
    for param, hint in hints.items():
        if hint is ToolContext or hint == "ToolContext" or hint == "lantern.ToolContext":
            return param
    return None


def load_app(spec: str | None) -> App:
    """Import ``MODULE:OBJECT`` (or ``MODULE``, taking its ``app``); None gives an empty App."""
    if not spec:
        return App()
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import --app module {module_name!r}: {exc}") from exc
    obj = getattr(module, attr or "app", None)
    if not isinstance(obj, App):
        raise UsageError(f"--app {spec!r} does not name a lantern.App")
    return obj
