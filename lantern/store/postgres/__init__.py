"""The shared backend: PostgreSQL through psycopg 3, one module per concern (connection
plumbing, row mappers, leases, journal, runs, signing) composed in ``store``."""

from lantern.store.postgres.store import PostgresStore

__all__ = ["PostgresStore"]
