-- Run control: runs parked at an approval or a sub-agent, and the decisions that resume them.

ALTER TABLE runs ADD COLUMN wake_at timestamptz;
ALTER TABLE runs ADD COLUMN parent_run_id text;
-- The dispatcher reads parked runs that are due, never every waiting run.
CREATE INDEX runs_waking ON runs (wake_at) WHERE status = 'waiting';
CREATE INDEX runs_by_parent ON runs (parent_run_id) WHERE parent_run_id IS NOT NULL;

CREATE TABLE approvals (
    run_id      text        NOT NULL REFERENCES runs (id),
    node_id     text        NOT NULL,
    decision    text        NOT NULL CHECK (decision IN ('approved', 'rejected')),
    decided_by  text        NOT NULL,
    comment     text,
    decided_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, node_id)
);
