-- The claim's walk over flow groups (lantern/store/claims.py): queued runs under flow control
-- in start order, each group seen through its first run, so a claim reads as many groups as it
-- takes runs plus those at their limit, not every key with queued runs. A new run is shown; a
-- claim hides the later shown runs of a group it has seen, and shows the group's next run when
-- it takes one. A shown run that leaves the queue unclaimed (a cancel: it ends without
-- running) shows its group's next run.
ALTER TABLE runs ADD COLUMN flow_passed INTEGER;
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
