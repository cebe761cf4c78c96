-- A run's VMs, oldest first. The row is placed (state 'scheduled') by the scheduler leader after
-- its vm_scheduled event is journaled; the runtime node takes it ('starting', with the digest
-- of the VM's token and the epoch of the run lease it holds), the relay marks it 'running'
-- and, at its end, 'exited' (the workload ended by itself) or 'terminated'.

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
-- No run ever has two live VMs: the database refuses the second placement.
CREATE UNIQUE INDEX runtime_vms_one_live ON runtime_vms (run_id)
    WHERE state IN ('scheduled', 'starting', 'running');
CREATE INDEX runtime_vms_live ON runtime_vms (node_id, state)
    WHERE state IN ('scheduled', 'starting', 'running');
