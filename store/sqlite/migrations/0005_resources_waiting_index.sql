-- The waiting tasks that need resources, by bucket, as in the PostgreSQL
-- store's migration 7: a holder with no capacity and no limit says why they
-- wait by reading these rows alone, inside the writer's lock, not its whole
-- backlog. A task that needs nothing has no entry.
CREATE INDEX flotilla_tasks_resources_waiting_idx ON flotilla_tasks (bucket)
    WHERE resources IS NOT NULL AND status IN ('queued', 'scheduled', 'retrying');
