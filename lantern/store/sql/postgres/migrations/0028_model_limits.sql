-- Rate limits on model calls (docs/rate-limits.md): a definition per (scope, name), where the
-- scope is a workspace or '' for a limit of the whole server, and the sliding window of what
-- matching calls reserved, which every replica moves on with one UPDATE conditional on version.

CREATE TABLE model_limits (
    scope                text        NOT NULL,
    name                 text        NOT NULL,
    model                text        NOT NULL,
    tokens_per_minute    bigint      CHECK (tokens_per_minute IS NULL OR tokens_per_minute > 0),
    requests_per_minute  bigint      CHECK (requests_per_minute IS NULL OR requests_per_minute > 0),
    window_slots         jsonb       NOT NULL DEFAULT '[]',
    version              bigint      NOT NULL DEFAULT 0,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, name)
);
