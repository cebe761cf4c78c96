-- Queued runs by workspace, oldest first: the per-workspace queue quota counts them, and
-- claiming takes the oldest of each workspace in turn (one tenant's backlog cannot starve
-- the rest).

CREATE INDEX runs_queued_by_workspace ON runs (workspace, created_at) WHERE status = 'queued';
