-- Signals (docs/signals.md): what was sent to a run, in arrival order (position), kept until
-- the run is deleted. Which wait took one is journaled (signal_received), not stored here.

CREATE TABLE signals (
    position         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id               text        NOT NULL UNIQUE,
    run_id           text        NOT NULL REFERENCES runs (id),
    name             text        NOT NULL,
    payload          text        NOT NULL,
    idempotency_key  text,
    request_digest   text,
    received_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX signals_by_run ON signals (run_id, name, position);
CREATE UNIQUE INDEX signals_by_key ON signals (run_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
