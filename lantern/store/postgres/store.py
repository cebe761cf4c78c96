"""The shared backend's store: each concern's mixin over one connection pool."""

from __future__ import annotations

from lantern.store.postgres.journal import Journal
from lantern.store.postgres.leases import Leases
from lantern.store.postgres.model_limits import ModelLimits
from lantern.store.postgres.operations import Operations
from lantern.store.postgres.quotas import Quotas
from lantern.store.postgres.retention import Retention
from lantern.store.postgres.runs import Runs
from lantern.store.postgres.runtime import Runtime
from lantern.store.postgres.schedules import Schedules
from lantern.store.postgres.secrets import Secrets
from lantern.store.postgres.signals import Signals
from lantern.store.postgres.signing import Signing


class PostgresStore(
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
    """``base.Store`` on one PostgreSQL database (or schema), shared by every replica."""
