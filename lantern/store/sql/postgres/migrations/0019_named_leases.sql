-- Named fenced leases (run_locks generalised: the same UPSERT, the same epoch): the
-- scheduler leader among `lantern serve` replicas holds the one named 'scheduler'.

CREATE TABLE named_leases (
    name        text        PRIMARY KEY,
    holder      text        NOT NULL,
    expires_at  timestamptz NOT NULL,
    epoch       bigint      NOT NULL,
    since       timestamptz NOT NULL
);
