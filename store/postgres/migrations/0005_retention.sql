-- Retention: the holder of each bucket prunes its finished tasks once they
-- have outlived their age (PruneFinished).
--
-- The prune walks, per bucket and final state, the tasks that finished
-- longest ago: this index holds finished rows only, so the claim never
-- reads it, and a completion adds one entry to it (completions already
-- change status, so they were never HOT updates).
CREATE INDEX flotilla_tasks_finished_idx ON flotilla_tasks (bucket, status, finished_at)
    WHERE status IN ('succeeded', 'failed', 'timed_out', 'stopped', 'cancelled', 'lost', 'skipped');

-- The commands of a pruned task go with it; without this index each batch
-- would read the whole command table to find them.
CREATE INDEX flotilla_commands_task_idx ON flotilla_commands (task_id);
