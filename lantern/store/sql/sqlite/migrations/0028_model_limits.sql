-- Rate limits on model calls (docs/rate-limits.md): a definition per (scope, name), where the
-- scope is a workspace or '' for a limit of the whole server, and the sliding window of what
-- matching calls reserved, which every replica moves on with one UPDATE conditional on version.

CREATE TABLE model_limits (
    scope                TEXT    NOT NULL,
    name                 TEXT    NOT NULL,
    model                TEXT    NOT NULL,
    tokens_per_minute    INTEGER CHECK (tokens_per_minute IS NULL OR tokens_per_minute > 0),
    requests_per_minute  INTEGER CHECK (requests_per_minute IS NULL OR requests_per_minute > 0),
    window_slots         TEXT    NOT NULL DEFAULT '[]',
    version              INTEGER NOT NULL DEFAULT 0,
    created_at           REAL    NOT NULL,
    updated_at           REAL    NOT NULL,
    PRIMARY KEY (scope, name)
);
