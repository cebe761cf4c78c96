-- Replicas and their heartbeats, for the operational view of the fleet.

CREATE TABLE workers (
    id            text        PRIMARY KEY,
    started_at    timestamptz NOT NULL,
    heartbeat_at  timestamptz NOT NULL,
    stopped_at    timestamptz
);
