-- Named fenced leases (run_locks generalised: the same UPSERT, the same epoch): the
-- scheduler leader among `lantern serve` replicas holds the one named 'scheduler'.

CREATE TABLE named_leases (
    name        TEXT    PRIMARY KEY,
    holder      TEXT    NOT NULL,
    expires_at  REAL    NOT NULL,
    epoch       INTEGER NOT NULL,
    since       REAL    NOT NULL
);
