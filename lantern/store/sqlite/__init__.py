"""The embedded backend: SQLite in WAL mode with ``synchronous=FULL``, one module per concern
(connection plumbing, row mappers, leases, journal, runs, signing) composed in ``store``."""

from lantern.store.sqlite.store import SQLiteStore

__all__ = ["SQLiteStore"]
