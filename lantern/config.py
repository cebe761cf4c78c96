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
    max_concurrent_runs: int = 64
    max_body_bytes: int = 10 * 1024 * 1024
    max_recoveries: int = 10
    smtp_url: str | None = None  # LANTERN_SMTP_URL: where email connectors deliver
    data_dir: str | None = None  # LANTERN_DATA_DIR; None: see data_path
    signing_key: str | None = field(default=None, repr=False)  # LANTERN_SIGNING_KEY (PEM)

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
            max_concurrent_runs=_integer(e, "LANTERN_MAX_CONCURRENT_RUNS", 64),
            max_body_bytes=_integer(e, "LANTERN_MAX_BODY_BYTES", 10 * 1024 * 1024),
            max_recoveries=_integer(e, "LANTERN_MAX_RECOVERIES", 10),
            smtp_url=smtp_url(e),
            data_dir=e.get("LANTERN_DATA_DIR") or None,
            signing_key=e.get("LANTERN_SIGNING_KEY") or None,
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


def offline_word_delay(env: Mapping[str, str] | None = None) -> float:
    """LANTERN_OFFLINE_WORD_DELAY (a Go duration, default 0s): how long the offline provider
    waits between the words it streams, so a demo's live text can be watched arriving."""
    e = os.environ if env is None else env
    return _duration(e, "LANTERN_OFFLINE_WORD_DELAY", "0s", positive=False)
