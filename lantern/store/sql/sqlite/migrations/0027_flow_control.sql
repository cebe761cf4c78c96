-- Flow control (docs/flow-control.md). A run carries its priority and, when its agent has flow
-- control, the concurrency key its input rendered to with the agent's limits as at its create.
-- A lease copies the run's flow group, so the claim counts the runs holding a slot of a group
-- (an unreleased lease: claimed, running, or woken and claimed) from a small index; a parked
-- or finished run has given its lease up and holds none.
ALTER TABLE runs ADD COLUMN priority INTEGER NOT NULL DEFAULT 5;
ALTER TABLE runs ADD COLUMN flow_key TEXT;
ALTER TABLE runs ADD COLUMN flow_limit INTEGER;
ALTER TABLE runs ADD COLUMN flow_max INTEGER;
ALTER TABLE run_locks ADD COLUMN workspace TEXT;
ALTER TABLE run_locks ADD COLUMN agent_name TEXT;
ALTER TABLE run_locks ADD COLUMN flow_key TEXT;
-- The claim's queues: each workspace's runs with no flow control, and each flow group's runs,
-- both in start order (higher priority, then older first).
CREATE INDEX runs_queued_free ON runs (workspace, priority DESC, created_at)
    WHERE status = 'queued' AND flow_key IS NULL;
CREATE INDEX runs_queued_flow ON runs (workspace, agent_name, flow_key, priority DESC, created_at)
    WHERE status = 'queued' AND flow_key IS NOT NULL;
CREATE INDEX run_locks_flow ON run_locks (workspace, agent_name, flow_key)
    WHERE flow_key IS NOT NULL AND expires_at > 0;
