-- /metrics counts the unfinished runs per workspace at every scrape: only those, by index.
CREATE INDEX runs_active ON runs (workspace, status) WHERE status IN ('queued', 'running', 'waiting');
