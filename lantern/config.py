"""Settings from the environment (CONTRACT §2); command-line flags override them."""

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
    rate_limit: float = 100.0  # LANTERN_RATE_LIMIT: requests per second per key (0: none)
    max_connections: int = 1000  # LANTERN_MAX_CONNECTIONS: uvicorn answers 503 past it
    body_timeout: float = 30.0  # LANTERN_BODY_TIMEOUT: a request body must arrive within it
    secrets_key: str | None = field(default=None, repr=False)  # LANTERN_SECRETS_KEY
    node_ttl: float = 15.0  # LANTERN_NODE_TTL: a runtime node silent this long is lost (§11)
    runtime_driver: str = "auto"  # LANTERN_RUNTIME_DRIVER: what `lantern node` isolates with

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
            body_timeout=_duration(e, "LANTERN_BODY_TIMEOUT", "30s"),
            secrets_key=e.get("LANTERN_SECRETS_KEY") or None,
            node_ttl=_duration(e, "LANTERN_NODE_TTL", "15s"),
            runtime_driver=e.get("LANTERN_RUNTIME_DRIVER") or "auto",
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
    raw = env.get("LANTERN_RATE_LIMIT", "100")
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
    """LANTERN_MAX_QUEUED_RUNS: runs one workspace may have queued at once (CONTRACT §12)."""
    from lantern.limits import MAX_QUEUED_RUNS

    return _integer(os.environ if env is None else env, "LANTERN_MAX_QUEUED_RUNS", MAX_QUEUED_RUNS)


def egress_allow(env: Mapping[str, str] | None = None) -> str | None:
    """LANTERN_EGRESS_ALLOW (CONTRACT §12), or None: tenant URLs reach public addresses only."""
    e = os.environ if env is None else env
    return e.get("LANTERN_EGRESS_ALLOW") or None


def offline_word_delay(env: Mapping[str, str] | None = None) -> float:
    """LANTERN_OFFLINE_WORD_DELAY (a Go duration, default 0s): how long the offline provider
    waits between the words it streams, so a demo's live text can be watched arriving."""
    e = os.environ if env is None else env
    return _duration(e, "LANTERN_OFFLINE_WORD_DELAY", "0s", positive=False)
