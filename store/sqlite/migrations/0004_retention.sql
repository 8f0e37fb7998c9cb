-- Retention, as in the PostgreSQL store's migration 5: the finished tasks
-- of each bucket by state and end, which the prune walks from the oldest
-- end; the claim never reads it.
CREATE INDEX flotilla_tasks_finished_idx ON flotilla_tasks (bucket, status, finished_at)
    WHERE status IN ('succeeded', 'failed', 'timed_out', 'stopped', 'cancelled', 'lost', 'skipped');

-- The commands of a pruned task go with it.
CREATE INDEX flotilla_commands_task_idx ON flotilla_commands (task_id);
