-- Signals (docs/signals.md): what was sent to a run, in arrival order (position), kept until
-- the run is deleted. Which wait took one is journaled (signal_received), not stored here.

CREATE TABLE signals (
    position         INTEGER PRIMARY KEY,
    id               TEXT    NOT NULL UNIQUE,
    run_id           TEXT    NOT NULL REFERENCES runs (id),
    name             TEXT    NOT NULL,
    payload          TEXT    NOT NULL,
    idempotency_key  TEXT,
    request_digest   TEXT,
    received_at      REAL    NOT NULL
);
CREATE INDEX signals_by_run ON signals (run_id, name, position);
CREATE UNIQUE INDEX signals_by_key ON signals (run_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
