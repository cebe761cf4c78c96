"""Settings from the environment (README, Configuration); command-line flags override them."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from lantern.durations import parse_duration
from lantern.errors import UsageError

log = logging.getLogger("lantern.config")

DEFAULT_DATABASE_URL = "sqlite:///.lantern/lantern.db"


def _duration(env: Mapping[str, str], name: str, default: str, *, positive: bool = True) -> float:
    raw = env.get(name, default)
    try:
        value = parse_duration(raw)
    except ValueError:
        value = -1.0
    if value <= 0 and positive:
        log.warning("%s=%r is not a positive Go duration; using %s", name, raw, default)
        value = parse_duration(default)
    return value


def _integer(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise UsageError(f"{name}={raw!r} is not a positive integer")
    return value


@dataclass(frozen=True)
class ModelSettings:
    """The model steps' configuration as the environment gives it; lantern.models parses it
    (``Models.from_settings``), so a broken value is one UsageError where a registry is built."""

    routes: str | None = None  # LANTERN_MODEL_ROUTES: JSON {"NAME": ["model", ...]}
    routes_file: str | None = None  # LANTERN_MODEL_ROUTES_FILE: the same object, JSON or YAML
    prices_file: str | None = None  # LANTERN_MODEL_PRICES: a file adding to the price table
    unknown_price: str | None = None  # LANTERN_UNKNOWN_MODEL_PRICE: IN,OUT per million tokens
    workspace_budgets: str | None = None  # LANTERN_WORKSPACE_BUDGETS: JSON per workspace

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ModelSettings:
        e = os.environ if env is None else env
        return cls(
            routes=e.get("LANTERN_MODEL_ROUTES") or None,
            routes_file=e.get("LANTERN_MODEL_ROUTES_FILE") or None,
            prices_file=e.get("LANTERN_MODEL_PRICES") or None,
            unknown_price=e.get("LANTERN_UNKNOWN_MODEL_PRICE", "").strip() or None,
            workspace_budgets=e.get("LANTERN_WORKSPACE_BUDGETS") or None,
        )


DEFAULT_TOOL_THREADS = 32


def tool_threads(env: Mapping[str, str]) -> int:
    """LANTERN_TOOL_THREADS: the sync tools' thread pool (anything but a positive integer: 32)."""
    raw = env.get("LANTERN_TOOL_THREADS", "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else DEFAULT_TOOL_THREADS


def trace_export(env: Mapping[str, str]) -> bool:
    """Whether to export spans over OTLP/HTTP: the standard endpoint variable is set and the
    SDK is not disabled (the exporter reads the other OTEL_* variables itself)."""
    endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    )
    if not endpoint:
        return False
    return env.get("OTEL_SDK_DISABLED", "").strip().lower() != "true"


@dataclass(frozen=True)
class Settings:
    database_url: str = DEFAULT_DATABASE_URL
    lease_ttl: float = 60.0
    step_timeout: float = 600.0  # LANTERN_STEP_TIMEOUT: a step's limit unless it sets its own
    recovery_interval: float = 30.0
    worker_id: str = ""
    host: str = "127.0.0.1"
    port: int = 8787
    max_concurrent_runs: int = 256
    max_body_bytes: int = 10 * 1024 * 1024
    max_recoveries: int = 10
    smtp_url: str | None = None  # LANTERN_SMTP_URL: where email connectors deliver
    data_dir: str | None = None  # LANTERN_DATA_DIR; None: see data_path
    signing_key: str | None = field(default=None, repr=False)  # LANTERN_SIGNING_KEY (PEM)
    egress_allow: str | None = None  # LANTERN_EGRESS_ALLOW: non-public peers tenants may reach
    # LANTERN_OPERATOR_WORKSPACE: its admin keys see every workspace on /v1/workers and, with
    # LANTERN_METRICS=admin, read /metrics
    operator_workspace: str | None = None
    metrics_public: bool = True  # LANTERN_METRICS: "public" (default) or "admin"
    # LANTERN_RATE_LIMIT: requests per second per key (0: none); docs/operations.md says why
    rate_limit: float = 1000.0
    max_connections: int = 1000  # LANTERN_MAX_CONNECTIONS: uvicorn answers 503 past it
    streams_per_key: int = 256  # LANTERN_STREAMS_PER_KEY: open streams and long-polls of a key
    body_timeout: float = 30.0  # LANTERN_BODY_TIMEOUT: a request body must arrive within it
    secrets_key: str | None = field(default=None, repr=False)  # LANTERN_SECRETS_KEY
    node_ttl: float = 15.0  # LANTERN_NODE_TTL: a runtime node silent this long is lost
    runtime_driver: str = "auto"  # LANTERN_RUNTIME_DRIVER: what `lantern node` isolates with
    vm_log_bytes: int = 8 * 1024 * 1024  # LANTERN_VM_LOG_BYTES: a VM's console log, tail kept
    # LANTERN_VM_WORKSPACE_SLOTS: live VMs one workspace holds while another waits (0: half the
    # capacity of the runtime nodes that are up, at least 1)
    vm_workspace_slots: int = 0
    vm_max_timeout: float = 3600.0  # LANTERN_VM_MAX_TIMEOUT: the highest timeoutS accepted
    models: ModelSettings = field(default_factory=ModelSettings)  # routes, prices, budgets
    tool_threads: int = DEFAULT_TOOL_THREADS  # LANTERN_TOOL_THREADS: sync tools' thread pool
    trace_export: bool = False  # OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT set: export spans
    retention: float | None = None  # LANTERN_RETENTION: finished runs kept this long (None: all)
    max_output_bytes: int = 10 * 1024 * 1024  # LANTERN_MAX_OUTPUT_BYTES: a step's output, at most

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        e = os.environ if env is None else env
        port = _integer(e, "LANTERN_PORT", 8787)
        return cls(
            database_url=e.get("LANTERN_DATABASE_URL", DEFAULT_DATABASE_URL),
            lease_ttl=_duration(e, "LANTERN_LEASE_TTL", "60s"),
            step_timeout=_duration(e, "LANTERN_STEP_TIMEOUT", "10m"),
            recovery_interval=_duration(e, "LANTERN_RECOVERY_INTERVAL", "30s"),
            worker_id=e.get("LANTERN_WORKER_ID") or f"{socket.gethostname()}:{port}",
            host=e.get("LANTERN_HOST", "127.0.0.1"),
            port=port,
            max_concurrent_runs=_integer(e, "LANTERN_MAX_CONCURRENT_RUNS", 256),
            max_body_bytes=_integer(e, "LANTERN_MAX_BODY_BYTES", 10 * 1024 * 1024),
            max_recoveries=_integer(e, "LANTERN_MAX_RECOVERIES", 10),
            smtp_url=smtp_url(e),
            data_dir=e.get("LANTERN_DATA_DIR") or None,
            signing_key=e.get("LANTERN_SIGNING_KEY") or None,
            egress_allow=egress_allow(e),
            operator_workspace=e.get("LANTERN_OPERATOR_WORKSPACE") or None,
            metrics_public=_metrics_public(e),
            rate_limit=_rate(e),
            max_connections=_integer(e, "LANTERN_MAX_CONNECTIONS", 1000),
            streams_per_key=_integer(e, "LANTERN_STREAMS_PER_KEY", 256),
            body_timeout=_duration(e, "LANTERN_BODY_TIMEOUT", "30s"),
            secrets_key=e.get("LANTERN_SECRETS_KEY") or None,
            node_ttl=_duration(e, "LANTERN_NODE_TTL", "15s"),
            runtime_driver=e.get("LANTERN_RUNTIME_DRIVER") or "auto",
            vm_log_bytes=max(4096, _integer(e, "LANTERN_VM_LOG_BYTES", 8 * 1024 * 1024)),
            vm_workspace_slots=max(0, _integer(e, "LANTERN_VM_WORKSPACE_SLOTS", 0)),
            vm_max_timeout=_duration(e, "LANTERN_VM_MAX_TIMEOUT", "1h"),
            models=ModelSettings.from_env(e),
            tool_threads=tool_threads(e),
            trace_export=trace_export(e),
            retention=retention(e),
            max_output_bytes=max_output_bytes(e),
        )

    @property
    def data_path(self) -> Path:
        """Where Lantern keeps its files (the receipt signing keys): LANTERN_DATA_DIR, else the
        folder of a SQLite database, else ``.lantern``."""
        if self.data_dir:
            return Path(self.data_dir)
        if self.database_url.startswith("sqlite:///"):
            path = self.database_url.removeprefix("sqlite:///")
            if path not in ("", ":memory:"):
                return Path(path).parent
        return Path(".lantern")


def smtp_url(env: Mapping[str, str] | None = None) -> str | None:
    """LANTERN_SMTP_URL, or None when it is unset or empty. Email connectors read it when they
    send (see lantern.effects.email for its forms), so a step fails clearly without it."""
    e = os.environ if env is None else env
    return e.get("LANTERN_SMTP_URL") or None


def _rate(env: Mapping[str, str]) -> float:
    raw = env.get("LANTERN_RATE_LIMIT", "1000")
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise UsageError(f"LANTERN_RATE_LIMIT={raw!r} is not a number of requests per second")
    return value


def _metrics_public(env: Mapping[str, str]) -> bool:
    raw = env.get("LANTERN_METRICS", "public").strip().lower()
    if raw not in ("public", "admin"):
        raise UsageError(f"LANTERN_METRICS={raw!r} must be public or admin")
    return raw == "public"


def email_from_domains(env: Mapping[str, str] | None = None) -> frozenset[str]:
    """LANTERN_EMAIL_FROM_DOMAINS: the domains email connectors may send from (unset: any)."""
    raw = (os.environ if env is None else env).get("LANTERN_EMAIL_FROM_DOMAINS", "")
    return frozenset(d.strip().lower().rstrip(".") for d in raw.split(",") if d.strip())


def email_max_recipients(env: Mapping[str, str] | None = None) -> int:
    """LANTERN_EMAIL_MAX_RECIPIENTS: to and cc of one email together (default 50)."""
    return _integer(os.environ if env is None else env, "LANTERN_EMAIL_MAX_RECIPIENTS", 50)


def max_queued_runs(env: Mapping[str, str] | None = None) -> int:
    """LANTERN_MAX_QUEUED_RUNS: runs one workspace may have queued at once (docs/security.md)."""
    from lantern.limits import MAX_QUEUED_RUNS

    return _integer(os.environ if env is None else env, "LANTERN_MAX_QUEUED_RUNS", MAX_QUEUED_RUNS)


def max_output_bytes(env: Mapping[str, str] | None = None) -> int:
    """LANTERN_MAX_OUTPUT_BYTES: the largest step output the journal takes (default 10 MiB)."""
    from lantern.limits import MAX_OUTPUT_BYTES

    e = os.environ if env is None else env
    return _integer(e, "LANTERN_MAX_OUTPUT_BYTES", MAX_OUTPUT_BYTES)


def egress_allow(env: Mapping[str, str] | None = None) -> str | None:
    """LANTERN_EGRESS_ALLOW (docs/security.md), or None: tenant URLs reach public addresses only."""
    e = os.environ if env is None else env
    return e.get("LANTERN_EGRESS_ALLOW") or None


def offline_word_delay(env: Mapping[str, str] | None = None) -> float:
    """LANTERN_OFFLINE_WORD_DELAY (a Go duration, default 0s): how long the offline provider
    waits between the words it streams, so a demo's live text can be watched arriving."""
    e = os.environ if env is None else env
    return _duration(e, "LANTERN_OFFLINE_WORD_DELAY", "0s", positive=False)


def rate_limit_window(env: Mapping[str, str] | None = None) -> float:
    """LANTERN_RATE_LIMIT_WINDOW (a Go duration, default 60s): the span a rate limit's
    ``tokensPerMinute`` and ``requestsPerMinute`` hold over. Providers count per minute, so
    only a demo or a test that would otherwise wait out whole minutes sets it shorter; every
    replica sharing a database must use the same one."""
    e = os.environ if env is None else env
    return _duration(e, "LANTERN_RATE_LIMIT_WINDOW", "60s")


def retention(env: Mapping[str, str]) -> float | None:
    """LANTERN_RETENTION (a Go duration, e.g. ``720h``): how long a finished run is kept; unset
    or empty keeps every run. A value that is not a positive duration stops the server rather
    than guess how much to delete."""
    raw = env.get("LANTERN_RETENTION", "").strip()
    if not raw:
        return None
    try:
        value = parse_duration(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise UsageError(f"LANTERN_RETENTION={raw!r} is not a positive Go duration (e.g. 720h)")
    return value
