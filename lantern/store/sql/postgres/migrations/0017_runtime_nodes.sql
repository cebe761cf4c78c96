-- Runtime nodes of the microVM tier (docs/runtime.md): registered by `lantern node`, kept alive by
-- heartbeats; the scheduler leader marks one lost when its heartbeat is older than LANTERN_NODE_TTL.

CREATE TABLE runtime_nodes (
    node_id       text        PRIMARY KEY,
    driver        text        NOT NULL,
    capacity      integer     NOT NULL CHECK (capacity > 0),
    memory_mb     integer     NOT NULL CHECK (memory_mb > 0),
    labels        jsonb       NOT NULL,
    started_at    timestamptz NOT NULL,
    heartbeat_at  timestamptz NOT NULL,
    lost_at       timestamptz
);
