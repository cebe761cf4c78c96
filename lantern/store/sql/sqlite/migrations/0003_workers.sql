-- Replicas and their heartbeats, for the operational view of the fleet.

CREATE TABLE workers (
    id            TEXT PRIMARY KEY,
    started_at    REAL NOT NULL,
    heartbeat_at  REAL NOT NULL,
    stopped_at    REAL
);
