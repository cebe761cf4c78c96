-- Runtime nodes of the microVM tier (docs/runtime.md): registered by `lantern node`, kept alive by
-- heartbeats; the scheduler leader marks one lost when its heartbeat is older than LANTERN_NODE_TTL.

CREATE TABLE runtime_nodes (
    node_id       TEXT    PRIMARY KEY,
    driver        TEXT    NOT NULL,
    capacity      INTEGER NOT NULL CHECK (capacity > 0),
    memory_mb     INTEGER NOT NULL CHECK (memory_mb > 0),
    labels        TEXT    NOT NULL,
    started_at    REAL    NOT NULL,
    heartbeat_at  REAL    NOT NULL,
    lost_at       REAL
);
