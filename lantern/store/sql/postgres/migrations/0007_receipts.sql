-- Receipts: one signed receipt per finished run, and the public half of every key that ever
-- signed one (each replica registers its keys on start, so any replica serves them all).
-- The receipt body is kept as the exact canonical JSON that was signed (text, not jsonb,
-- which would reorder it).

CREATE TABLE signing_keys (
    kid         text        PRIMARY KEY,
    x           text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE receipts (
    run_id      text        PRIMARY KEY REFERENCES runs (id),
    key_id      text        NOT NULL REFERENCES signing_keys (kid),
    body        text        NOT NULL,
    signature   text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
