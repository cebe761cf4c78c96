"""The embedded backend's store: each concern's mixin over one pair of connections."""

from __future__ import annotations

from lantern.store.sqlite.journal import Journal
from lantern.store.sqlite.leases import Leases
from lantern.store.sqlite.model_limits import ModelLimits
from lantern.store.sqlite.operations import Operations
from lantern.store.sqlite.quotas import Quotas
from lantern.store.sqlite.retention import Retention
from lantern.store.sqlite.runs import Runs
from lantern.store.sqlite.runtime import Runtime
from lantern.store.sqlite.schedules import Schedules
from lantern.store.sqlite.secrets import Secrets
from lantern.store.sqlite.signals import Signals
from lantern.store.sqlite.signing import Signing


class SQLiteStore(
    Runs,
    Journal,
    Leases,
    Signing,
    Secrets,
    Quotas,
    Runtime,
    Operations,
    Schedules,
    Signals,
    Retention,
    ModelLimits,
):
    """``base.Store`` on one SQLite file."""
