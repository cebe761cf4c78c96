-- A code-first run parked by a replica that lacks the version of its code it is pinned to:
-- the version it waits for, so a replica that has it finds the run and adopts it.
ALTER TABLE runs ADD COLUMN waiting_for TEXT;
CREATE INDEX runs_waiting_for ON runs (agent_name, waiting_for) WHERE waiting_for IS NOT NULL;
