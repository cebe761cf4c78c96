-- The whole schema as the migrations leave it (a test keeps the two equal).
-- Times are unix seconds (REAL); JSON is TEXT.

CREATE TABLE agents (
    workspace   TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    version     INTEGER NOT NULL,
    definition  TEXT    NOT NULL,
    created_at  REAL    NOT NULL,
    PRIMARY KEY (workspace, name, version)
);

CREATE TABLE runs (
    id             TEXT    PRIMARY KEY,
    workspace      TEXT    NOT NULL,
    agent_name     TEXT    NOT NULL,
    agent_version  INTEGER NOT NULL,
    status         TEXT    NOT NULL
        CHECK (status IN ('queued', 'running', 'waiting', 'succeeded', 'failed', 'cancelled')),
    input          TEXT,
    output         TEXT,
    error          TEXT,
    created_at     REAL    NOT NULL,
    updated_at     REAL    NOT NULL,
    idempotency_key  TEXT,
    request_digest   TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    wake_at          REAL,
    parent_run_id    TEXT,
    input_tokens     INTEGER NOT NULL DEFAULT 0,
    output_tokens    INTEGER NOT NULL DEFAULT 0,
    cost_usd         REAL    NOT NULL DEFAULT 0,
    model_calls      INTEGER NOT NULL DEFAULT 0,
    waiting_for      TEXT,
    priority         INTEGER NOT NULL DEFAULT 5,
    flow_key         TEXT,
    flow_limit       INTEGER,
    flow_max         INTEGER,
    flow_passed      INTEGER,
    FOREIGN KEY (workspace, agent_name, agent_version) REFERENCES agents (workspace, name, version)
);
CREATE INDEX runs_by_workspace ON runs (workspace, id);
CREATE UNIQUE INDEX runs_by_idempotency_key ON runs (workspace, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX runs_queued ON runs (created_at) WHERE status = 'queued';
CREATE INDEX runs_waking ON runs (wake_at) WHERE status = 'waiting';
CREATE INDEX runs_by_parent ON runs (parent_run_id) WHERE parent_run_id IS NOT NULL;
CREATE INDEX runs_active ON runs (workspace, status) WHERE status IN ('queued', 'running', 'waiting');
CREATE INDEX runs_waiting_for ON runs (agent_name, waiting_for) WHERE waiting_for IS NOT NULL;

CREATE TABLE run_locks (
    run_id      TEXT    PRIMARY KEY REFERENCES runs (id),
    worker_id   TEXT    NOT NULL,
    expires_at  REAL    NOT NULL,
    epoch       INTEGER NOT NULL,
    workspace   TEXT,
    agent_name  TEXT,
    flow_key    TEXT
);
CREATE INDEX run_locks_by_worker ON run_locks (worker_id);
CREATE INDEX run_locks_expiring ON run_locks (expires_at) WHERE expires_at > 0;

CREATE TABLE blobs (
    digest  TEXT PRIMARY KEY,
    body    BLOB NOT NULL
);

CREATE TABLE journal_events (
    run_id       TEXT    NOT NULL REFERENCES runs (id),
    seq          INTEGER NOT NULL,
    kind         TEXT    NOT NULL,
    step_id      TEXT,
    node_id      TEXT,
    attempt      INTEGER,
    data         TEXT    NOT NULL,
    blob_digest  TEXT,
    hash         TEXT,
    at           REAL    NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE UNIQUE INDEX journal_one_completion ON journal_events (run_id, step_id)
    WHERE kind = 'step_completed';

CREATE TABLE side_effect_receipts (
    run_id           TEXT    NOT NULL REFERENCES runs (id),
    step_id          TEXT    NOT NULL,
    delivery         TEXT    NOT NULL,
    attempt          INTEGER NOT NULL,
    idempotency_key  TEXT    NOT NULL,
    kind             TEXT    NOT NULL,
    target           TEXT,
    status           TEXT    NOT NULL CHECK (status IN ('claimed', 'delivered', 'failed')),
    response         TEXT,
    claimed_at       REAL    NOT NULL,
    completed_at     REAL,
    PRIMARY KEY (run_id, step_id, delivery)
);

CREATE TABLE api_keys (
    id           TEXT PRIMARY KEY,
    workspace    TEXT NOT NULL,
    secret_hash  TEXT NOT NULL,
    scopes       TEXT NOT NULL,
    created_at   REAL NOT NULL,
    revoked_at   REAL,
    name         TEXT
);
CREATE TABLE workers (
    id            TEXT PRIMARY KEY,
    started_at    REAL NOT NULL,
    heartbeat_at  REAL NOT NULL,
    stopped_at    REAL
);

CREATE TABLE signing_secrets (
    workspace        TEXT PRIMARY KEY,
    secret           TEXT NOT NULL,
    created_at       REAL NOT NULL,
    previous_secret  TEXT,
    previous_until   REAL
);

CREATE TABLE approvals (
    run_id      TEXT NOT NULL REFERENCES runs (id),
    node_id     TEXT NOT NULL,
    decision    TEXT NOT NULL CHECK (decision IN ('approved', 'rejected')),
    decided_by  TEXT NOT NULL,
    comment     TEXT,
    decided_at  REAL NOT NULL,
    decided_by_name TEXT,
    PRIMARY KEY (run_id, node_id)
);

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

-- A run's usage is the sum of its journal's usage, kept in the same transaction.
CREATE TRIGGER journal_events_usage AFTER INSERT ON journal_events
WHEN NEW.kind = 'step_completed' AND json_type(NEW.data, '$.usage') = 'object'
BEGIN
    UPDATE runs SET
        input_tokens = input_tokens + COALESCE(json_extract(NEW.data, '$.usage.inputTokens'), 0),
        output_tokens = output_tokens + COALESCE(json_extract(NEW.data, '$.usage.outputTokens'), 0),
        cost_usd = cost_usd + COALESCE(json_extract(NEW.data, '$.usage.costUsd'), 0),
        model_calls = model_calls + COALESCE(json_extract(NEW.data, '$.usage.modelCalls'), 0)
    WHERE id = NEW.run_id;
END;

CREATE TABLE secrets (
    workspace   TEXT NOT NULL,
    name        TEXT NOT NULL,
    key_id      TEXT NOT NULL,
    sealed      BLOB NOT NULL,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL,
    PRIMARY KEY (workspace, name)
);

CREATE INDEX runs_queued_by_workspace ON runs (workspace, created_at) WHERE status = 'queued';

CREATE TABLE workspace_claims (
    workspace   TEXT PRIMARY KEY,
    claimed_at  REAL NOT NULL
);

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

CREATE TABLE runtime_vms (
    vm_id         TEXT    PRIMARY KEY,
    run_id        TEXT    NOT NULL REFERENCES runs (id),
    node_id       TEXT    NOT NULL,
    driver        TEXT    NOT NULL,
    attempt       INTEGER NOT NULL,
    state         TEXT    NOT NULL
        CHECK (state IN ('scheduled', 'starting', 'running', 'exited', 'terminated')),
    reason        TEXT,
    exit_code     INTEGER,
    token_digest  TEXT,
    lease_epoch   INTEGER,
    memory_mb     INTEGER NOT NULL,
    resume        INTEGER NOT NULL DEFAULT 0,
    created_at    REAL    NOT NULL,
    started_at    REAL,
    ended_at      REAL
);
CREATE UNIQUE INDEX runtime_vms_attempt ON runtime_vms (run_id, attempt);
CREATE UNIQUE INDEX runtime_vms_one_live ON runtime_vms (run_id)
    WHERE state IN ('scheduled', 'starting', 'running');
CREATE INDEX runtime_vms_live ON runtime_vms (node_id, state)
    WHERE state IN ('scheduled', 'starting', 'running');

CREATE TABLE named_leases (
    name        TEXT    PRIMARY KEY,
    holder      TEXT    NOT NULL,
    expires_at  REAL    NOT NULL,
    epoch       INTEGER NOT NULL,
    since       REAL    NOT NULL
);

CREATE TABLE schedules (
    workspace         TEXT    NOT NULL,
    name              TEXT    NOT NULL,
    definition        TEXT    NOT NULL,
    paused            INTEGER NOT NULL DEFAULT 0,
    next_fire_at      REAL    NOT NULL,
    last_fire_at      REAL,
    last_run_id       TEXT,
    buffered_fire_at  REAL,
    recent_skips      TEXT    NOT NULL DEFAULT '[]',
    created_at        REAL    NOT NULL,
    updated_at        REAL    NOT NULL,
    PRIMARY KEY (workspace, name)
);
CREATE INDEX schedules_due ON schedules (next_fire_at) WHERE NOT paused;

CREATE TABLE workspace_settings (
    workspace    TEXT PRIMARY KEY,
    retention_s  REAL CHECK (retention_s IS NULL OR retention_s > 0),
    updated_at   REAL    NOT NULL
);

-- Keyed by id (ids sort by creation, and a run finishes after it is created) rather than by
-- updated_at, which every journal append changes: indexing it would cost each append.
CREATE INDEX runs_finished ON runs (id) WHERE status IN ('succeeded', 'failed', 'cancelled');

CREATE INDEX journal_events_by_blob ON journal_events (blob_digest) WHERE blob_digest IS NOT NULL;

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

-- The claim's queues: each workspace's runs with no flow control, and each flow group's runs,
-- both in start order (higher priority, then older first).
CREATE INDEX runs_queued_free ON runs (workspace, priority DESC, created_at)
    WHERE status = 'queued' AND flow_key IS NULL;
CREATE INDEX runs_queued_flow ON runs (workspace, agent_name, flow_key, priority DESC, created_at)
    WHERE status = 'queued' AND flow_key IS NOT NULL;
CREATE INDEX run_locks_flow ON run_locks (workspace, agent_name, flow_key)
    WHERE flow_key IS NOT NULL AND expires_at > 0;
-- The claim's walk over flow groups (migration 0029).
CREATE INDEX runs_flow_heads ON runs (workspace, priority DESC, created_at)
    WHERE status = 'queued' AND flow_key IS NOT NULL AND flow_passed IS NULL;

CREATE TRIGGER runs_flow_head_left AFTER UPDATE OF status ON runs
WHEN OLD.status = 'queued' AND NEW.status NOT IN ('queued', 'running', 'waiting')
     AND NEW.flow_key IS NOT NULL
     AND NEW.flow_passed IS NULL
BEGIN
    UPDATE runs SET flow_passed = NULL WHERE id = (
        SELECT r.id FROM runs r
        WHERE r.workspace = NEW.workspace AND r.agent_name = NEW.agent_name
          AND r.flow_key = NEW.flow_key AND r.status = 'queued'
          AND NOT EXISTS (SELECT 1 FROM run_locks l WHERE l.run_id = r.id)
        ORDER BY r.priority DESC, r.created_at LIMIT 1)
      AND flow_passed IS NOT NULL;
END;

CREATE TABLE model_limits (
    scope                TEXT    NOT NULL,
    name                 TEXT    NOT NULL,
    model                TEXT    NOT NULL,
    tokens_per_minute    INTEGER CHECK (tokens_per_minute IS NULL OR tokens_per_minute > 0),
    requests_per_minute  INTEGER CHECK (requests_per_minute IS NULL OR requests_per_minute > 0),
    window_slots         TEXT    NOT NULL DEFAULT '[]',
    version              INTEGER NOT NULL DEFAULT 0,
    created_at           REAL    NOT NULL,
    updated_at           REAL    NOT NULL,
    PRIMARY KEY (scope, name)
);
