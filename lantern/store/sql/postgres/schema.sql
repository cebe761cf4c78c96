-- The whole schema as the migrations leave it (a test keeps the two equal).

CREATE TABLE agents (
    workspace   text        NOT NULL,
    name        text        NOT NULL,
    version     integer     NOT NULL,
    definition  jsonb       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace, name, version)
);

CREATE TABLE runs (
    id             text        PRIMARY KEY,
    workspace      text        NOT NULL,
    agent_name     text        NOT NULL,
    agent_version  integer     NOT NULL,
    status         text        NOT NULL
        CHECK (status IN ('queued', 'running', 'waiting', 'succeeded', 'failed', 'cancelled')),
    input          jsonb,
    output         jsonb,
    error          jsonb,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    idempotency_key  text,
    request_digest   text,
    cancel_requested boolean NOT NULL DEFAULT false,
    wake_at          timestamptz,
    parent_run_id    text,
    input_tokens     bigint  NOT NULL DEFAULT 0,
    output_tokens    bigint  NOT NULL DEFAULT 0,
    cost_usd         double precision NOT NULL DEFAULT 0,
    model_calls      integer NOT NULL DEFAULT 0,
    waiting_for      text,
    priority         smallint NOT NULL DEFAULT 5,
    flow_key         text,
    flow_limit       integer,
    flow_max         integer,
    flow_passed      boolean,
    FOREIGN KEY (workspace, agent_name, agent_version) REFERENCES agents (workspace, name, version)
);
CREATE INDEX runs_by_workspace ON runs (workspace, id);
-- Only unfinished runs are indexed, so finding work costs the same however many runs finished.
CREATE UNIQUE INDEX runs_by_idempotency_key ON runs (workspace, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX runs_queued ON runs (created_at) WHERE status = 'queued';
CREATE INDEX runs_waking ON runs (wake_at) WHERE status = 'waiting';
CREATE INDEX runs_by_parent ON runs (parent_run_id) WHERE parent_run_id IS NOT NULL;
CREATE INDEX runs_active ON runs (workspace, status) WHERE status IN ('queued', 'running', 'waiting');
CREATE INDEX runs_waiting_for ON runs (agent_name, waiting_for) WHERE waiting_for IS NOT NULL;

CREATE TABLE run_locks (
    run_id      text        PRIMARY KEY REFERENCES runs (id),
    worker_id   text        NOT NULL,
    expires_at  timestamptz NOT NULL,
    epoch       bigint      NOT NULL,
    workspace   text,
    agent_name  text,
    flow_key    text
);
CREATE INDEX run_locks_by_worker ON run_locks (worker_id);
CREATE INDEX run_locks_expiring ON run_locks (expires_at) WHERE expires_at > 'epoch';

-- Large payloads are stored once, by content, and referenced from events.
CREATE TABLE blobs (
    digest  text  PRIMARY KEY,
    body    bytea NOT NULL
);

CREATE TABLE journal_events (
    run_id       text        NOT NULL REFERENCES runs (id),
    seq          bigint      NOT NULL,
    kind         text        NOT NULL,
    step_id      text,
    node_id      text,
    attempt      integer,
    data         jsonb       NOT NULL,
    blob_digest  text,
    hash         text,
    at           timestamptz NOT NULL,
    PRIMARY KEY (run_id, seq)
);
-- The invariant the replay gate rests on: a step completes once.
CREATE UNIQUE INDEX journal_one_completion ON journal_events (run_id, step_id)
    WHERE kind = 'step_completed';

CREATE TABLE side_effect_receipts (
    run_id           text        NOT NULL REFERENCES runs (id),
    step_id          text        NOT NULL,
    delivery         text        NOT NULL,
    attempt          integer     NOT NULL,
    idempotency_key  text        NOT NULL,
    kind             text        NOT NULL,
    target           text,
    status           text        NOT NULL CHECK (status IN ('claimed', 'delivered', 'failed')),
    response         jsonb,
    claimed_at       timestamptz NOT NULL DEFAULT now(),
    completed_at     timestamptz,
    PRIMARY KEY (run_id, step_id, delivery)
);

CREATE TABLE api_keys (
    id           text PRIMARY KEY,
    workspace    text NOT NULL,
    secret_hash  text NOT NULL,
    scopes       text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    revoked_at   timestamptz,
    name         text
);
CREATE TABLE workers (
    id            text        PRIMARY KEY,
    started_at    timestamptz NOT NULL,
    heartbeat_at  timestamptz NOT NULL,
    stopped_at    timestamptz
);

CREATE TABLE signing_secrets (
    workspace        text        PRIMARY KEY,
    secret           text        NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    previous_secret  text,
    previous_until   timestamptz
);

CREATE TABLE approvals (
    run_id      text        NOT NULL REFERENCES runs (id),
    node_id     text        NOT NULL,
    decision    text        NOT NULL CHECK (decision IN ('approved', 'rejected')),
    decided_by  text        NOT NULL,
    comment     text,
    decided_at  timestamptz NOT NULL DEFAULT now(),
    decided_by_name text,
    PRIMARY KEY (run_id, node_id)
);

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

-- A run's usage is the sum of its journal's usage, kept in the same transaction.
CREATE FUNCTION lantern_add_run_usage() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE runs SET
        input_tokens = input_tokens + COALESCE((NEW.data #>> '{usage,inputTokens}')::bigint, 0),
        output_tokens = output_tokens + COALESCE((NEW.data #>> '{usage,outputTokens}')::bigint, 0),
        cost_usd = cost_usd + COALESCE((NEW.data #>> '{usage,costUsd}')::double precision, 0),
        model_calls = model_calls + COALESCE((NEW.data #>> '{usage,modelCalls}')::integer, 0)
    WHERE id = NEW.run_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER journal_events_usage AFTER INSERT ON journal_events FOR EACH ROW
    WHEN (NEW.kind = 'step_completed' AND NEW.data ? 'usage')
    EXECUTE FUNCTION lantern_add_run_usage();

CREATE TABLE secrets (
    workspace   text NOT NULL,
    name        text NOT NULL,
    key_id      text NOT NULL,
    sealed      bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace, name)
);

CREATE INDEX runs_queued_by_workspace ON runs (workspace, created_at) WHERE status = 'queued';

CREATE TABLE workspace_claims (
    workspace   text PRIMARY KEY,
    claimed_at  timestamptz NOT NULL
);

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

CREATE TABLE runtime_vms (
    vm_id         text        PRIMARY KEY,
    run_id        text        NOT NULL REFERENCES runs (id),
    node_id       text        NOT NULL,
    driver        text        NOT NULL,
    attempt       integer     NOT NULL,
    state         text        NOT NULL
        CHECK (state IN ('scheduled', 'starting', 'running', 'exited', 'terminated')),
    reason        text,
    exit_code     integer,
    token_digest  text,
    lease_epoch   bigint,
    memory_mb     integer     NOT NULL,
    resume        boolean     NOT NULL DEFAULT false,
    created_at    timestamptz NOT NULL,
    started_at    timestamptz,
    ended_at      timestamptz
);
CREATE UNIQUE INDEX runtime_vms_attempt ON runtime_vms (run_id, attempt);
CREATE UNIQUE INDEX runtime_vms_one_live ON runtime_vms (run_id)
    WHERE state IN ('scheduled', 'starting', 'running');
CREATE INDEX runtime_vms_live ON runtime_vms (node_id, state)
    WHERE state IN ('scheduled', 'starting', 'running');

CREATE TABLE named_leases (
    name        text        PRIMARY KEY,
    holder      text        NOT NULL,
    expires_at  timestamptz NOT NULL,
    epoch       bigint      NOT NULL,
    since       timestamptz NOT NULL
);

CREATE TABLE schedules (
    workspace         text        NOT NULL,
    name              text        NOT NULL,
    definition        jsonb       NOT NULL,
    paused            boolean     NOT NULL DEFAULT false,
    next_fire_at      timestamptz NOT NULL,
    last_fire_at      timestamptz,
    last_run_id       text,
    buffered_fire_at  timestamptz,
    recent_skips      jsonb       NOT NULL DEFAULT '[]',
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace, name)
);
CREATE INDEX schedules_due ON schedules (next_fire_at) WHERE NOT paused;

CREATE TABLE workspace_settings (
    workspace    text PRIMARY KEY,
    retention_s  double precision CHECK (retention_s IS NULL OR retention_s > 0),
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- Keyed by id (ids sort by creation, and a run finishes after it is created) rather than by
-- updated_at, which every journal append changes: indexing it would cost each append.
CREATE INDEX runs_finished ON runs (id) WHERE status IN ('succeeded', 'failed', 'cancelled');

CREATE INDEX journal_events_by_blob ON journal_events (blob_digest) WHERE blob_digest IS NOT NULL;

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

-- The claim's queues: each workspace's runs with no flow control, and each flow group's runs,
-- both in start order (higher priority, then older first).
CREATE INDEX runs_queued_free ON runs (workspace, priority DESC, created_at)
    WHERE status = 'queued' AND flow_key IS NULL;
CREATE INDEX runs_queued_flow ON runs (workspace, agent_name, flow_key, priority DESC, created_at)
    WHERE status = 'queued' AND flow_key IS NOT NULL;
CREATE INDEX run_locks_flow ON run_locks (workspace, agent_name, flow_key)
    WHERE flow_key IS NOT NULL AND expires_at > 'epoch';
-- The claim's walk over flow groups (migration 0029).
CREATE INDEX runs_flow_heads ON runs (workspace, priority DESC, created_at)
    WHERE status = 'queued' AND flow_key IS NOT NULL AND flow_passed IS NULL;

CREATE FUNCTION lantern_flow_head_left() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(1279348291);  -- the claim's lock (postgres/leases.py)
    UPDATE runs SET flow_passed = NULL WHERE id = (
        SELECT r.id FROM runs r
        WHERE r.workspace = NEW.workspace AND r.agent_name = NEW.agent_name
          AND r.flow_key = NEW.flow_key AND r.status = 'queued'
          AND NOT EXISTS (SELECT 1 FROM run_locks l WHERE l.run_id = r.id)
        ORDER BY r.priority DESC, r.created_at LIMIT 1)
      AND flow_passed IS NOT NULL;
    RETURN NULL;
END
$$;

CREATE TRIGGER runs_flow_head_left AFTER UPDATE OF status ON runs FOR EACH ROW
    WHEN (OLD.status = 'queued' AND NEW.status NOT IN ('queued', 'running', 'waiting')
          AND NEW.flow_key IS NOT NULL
          AND NEW.flow_passed IS NULL)
    EXECUTE FUNCTION lantern_flow_head_left();

CREATE TABLE model_limits (
    scope                text        NOT NULL,
    name                 text        NOT NULL,
    model                text        NOT NULL,
    tokens_per_minute    bigint      CHECK (tokens_per_minute IS NULL OR tokens_per_minute > 0),
    requests_per_minute  bigint      CHECK (requests_per_minute IS NULL OR requests_per_minute > 0),
    window_slots         jsonb       NOT NULL DEFAULT '[]',
    version              bigint      NOT NULL DEFAULT 0,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, name)
);
