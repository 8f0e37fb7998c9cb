-- The waiting tasks that need resources, by bucket. A holder that declares
-- no capacity and no limit takes none of them (its plain claim passes over
-- every task that needs something), and it says why they wait by reading
-- these rows alone, not its whole backlog. A task that needs nothing has
-- no entry: submitting, claiming and ending it cost what they did.
CREATE INDEX flotilla_tasks_resources_waiting_idx ON flotilla_tasks (bucket)
    WHERE resources IS NOT NULL AND status IN ('queued', 'scheduled', 'retrying');
