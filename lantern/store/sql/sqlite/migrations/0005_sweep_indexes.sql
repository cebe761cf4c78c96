-- The sweep reads expiring leases, not every unfinished run: a pass then costs the same
-- however many runs are running or have finished. A released lease of an unfinished run
-- expires now (so the sweep hands it on); a finished run's lease is set to 0, out of the index.

UPDATE run_locks SET expires_at = CAST(strftime('%s', 'now') AS REAL)
WHERE expires_at = 0
  AND run_id IN (SELECT id FROM runs WHERE status IN ('queued', 'running'));
CREATE INDEX run_locks_expiring ON run_locks (expires_at) WHERE expires_at > 0;
CREATE INDEX runs_queued ON runs (created_at) WHERE status = 'queued';
DROP INDEX runs_unfinished;
