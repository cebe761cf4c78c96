-- Receipts: one signed receipt per finished run, and the public half of every key that ever
-- signed one (each replica registers its keys on start, so any replica serves them all).
-- The receipt body is kept as the exact canonical JSON that was signed.

CREATE TABLE signing_keys (
    kid         TEXT PRIMARY KEY,
    x           TEXT NOT NULL,
    created_at  REAL NOT NULL
);

CREATE TABLE receipts (
    run_id      TEXT PRIMARY KEY REFERENCES runs (id),
    key_id      TEXT NOT NULL REFERENCES signing_keys (kid),
    body        TEXT NOT NULL,
    signature   TEXT NOT NULL,
    created_at  REAL NOT NULL
);
