-- Retention (docs/retention.md): a workspace's own setting, finished runs found oldest first,
-- and the events that still reference a blob found without reading a whole journal.

CREATE TABLE workspace_settings (
    workspace    TEXT PRIMARY KEY,
    retention_s  REAL CHECK (retention_s IS NULL OR retention_s > 0),
    updated_at   REAL    NOT NULL
);

-- Keyed by id (ids sort by creation, and a run finishes after it is created) rather than by
-- updated_at, which every journal append changes: indexing it would cost each append.
CREATE INDEX runs_finished ON runs (id) WHERE status IN ('succeeded', 'failed', 'cancelled');

CREATE INDEX journal_events_by_blob ON journal_events (blob_digest) WHERE blob_digest IS NOT NULL;
