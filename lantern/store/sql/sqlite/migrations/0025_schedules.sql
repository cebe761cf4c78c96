-- Schedules (docs/schedules.md): a definition per (workspace, name) and the firing state
-- every replica reads and advances with one conditional UPDATE on next_fire_at.

CREATE TABLE schedules (
    workspace         TEXT    NOT NULL,
    name              TEXT    NOT NULL,
    definition        TEXT    NOT NULL,
    paused            INTEGER NOT NULL DEFAULT 0,
    next_fire_at      REAL    NOT NULL,
    last_fire_at      REAL,
    last_run_id       TEXT,
    buffered_fire_at  REAL,
    recent_skips      TEXT    NOT NULL DEFAULT '[]',
    created_at        REAL    NOT NULL,
    updated_at        REAL    NOT NULL,
    PRIMARY KEY (workspace, name)
);
CREATE INDEX schedules_due ON schedules (next_fire_at) WHERE NOT paused;
