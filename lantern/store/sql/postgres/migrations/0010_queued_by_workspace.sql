-- Queued runs by workspace, oldest first: the per-workspace queue quota counts them. Claiming
-- is fair across workspaces: it takes the oldest queued run of each workspace in turn,
-- starting with the workspace served least recently (workspace_claims), so one tenant's
-- backlog cannot starve the rest.

CREATE INDEX runs_queued_by_workspace ON runs (workspace, created_at) WHERE status = 'queued';

CREATE TABLE workspace_claims (
    workspace   text PRIMARY KEY,
    claimed_at  timestamptz NOT NULL
);
