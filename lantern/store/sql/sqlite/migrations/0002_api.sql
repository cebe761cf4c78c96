-- The REST API: API keys per workspace, idempotent run creation, cancellation requests.

CREATE TABLE api_keys (
    id           TEXT PRIMARY KEY,
    workspace    TEXT NOT NULL,
    secret_hash  TEXT NOT NULL,
    scopes       TEXT NOT NULL,
    created_at   REAL NOT NULL,
    revoked_at   REAL
);

ALTER TABLE runs ADD COLUMN idempotency_key TEXT;
ALTER TABLE runs ADD COLUMN request_digest TEXT;
ALTER TABLE runs ADD COLUMN cancel_requested INTEGER NOT NULL DEFAULT 0;
CREATE UNIQUE INDEX runs_by_idempotency_key ON runs (workspace, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
