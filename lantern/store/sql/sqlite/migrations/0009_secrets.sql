-- A workspace's secrets (docs/security.md), sealed with AES-256-GCM by lantern.secrets before
-- they are stored: the database holds ciphertext and the id of the key that sealed it.

CREATE TABLE secrets (
    workspace   TEXT NOT NULL,
    name        TEXT NOT NULL,
    key_id      TEXT NOT NULL,
    sealed      BLOB NOT NULL,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL,
    PRIMARY KEY (workspace, name)
);
