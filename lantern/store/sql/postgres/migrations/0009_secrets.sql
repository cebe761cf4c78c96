-- A workspace's secrets (docs/security.md), sealed with AES-256-GCM by lantern.secrets before
-- they are stored: the database holds ciphertext and the id of the key that sealed it.

CREATE TABLE secrets (
    workspace   text NOT NULL,
    name        text NOT NULL,
    key_id      text NOT NULL,
    sealed      bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace, name)
);
