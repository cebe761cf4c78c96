-- Schedules (docs/schedules.md): a definition per (workspace, name) and the firing state
-- every replica reads and advances with one conditional UPDATE on next_fire_at.

CREATE TABLE schedules (
    workspace         text        NOT NULL,
    name              text        NOT NULL,
    definition        jsonb       NOT NULL,
    paused            boolean     NOT NULL DEFAULT false,
    next_fire_at      timestamptz NOT NULL,
    last_fire_at      timestamptz,
    last_run_id       text,
    buffered_fire_at  timestamptz,
    recent_skips      jsonb       NOT NULL DEFAULT '[]',
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace, name)
);
CREATE INDEX schedules_due ON schedules (next_fire_at) WHERE NOT paused;
