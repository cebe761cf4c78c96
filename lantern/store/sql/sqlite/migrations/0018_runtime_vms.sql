-- A run's VMs, oldest first. The row is placed (state 'scheduled') by the scheduler leader after
-- its vm_scheduled event is journaled; the runtime node takes it ('starting', with the digest
-- of the VM's token and the epoch of the run lease it holds), the relay marks it 'running'
-- and, at its end, 'exited' (the workload ended by itself) or 'terminated'.

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
-- No run ever has two live VMs: the database refuses the second placement.
CREATE UNIQUE INDEX runtime_vms_one_live ON runtime_vms (run_id)
    WHERE state IN ('scheduled', 'starting', 'running');
CREATE INDEX runtime_vms_live ON runtime_vms (node_id, state)
    WHERE state IN ('scheduled', 'starting', 'running');
