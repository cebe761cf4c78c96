-- The REST API: API keys per workspace, idempotent run creation, cancellation requests.

CREATE TABLE api_keys (
    id           text        PRIMARY KEY,
    workspace    text        NOT NULL,
    secret_hash  text        NOT NULL,
    scopes       text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    revoked_at   timestamptz
);

ALTER TABLE runs ADD COLUMN idempotency_key text;
ALTER TABLE runs ADD COLUMN request_digest text;
ALTER TABLE runs ADD COLUMN cancel_requested boolean NOT NULL DEFAULT false;
CREATE UNIQUE INDEX runs_by_idempotency_key ON runs (workspace, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
