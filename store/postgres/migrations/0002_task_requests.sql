-- A stop or a pause issued for an active task is recorded on the task row
-- itself, under the row lock that every move of the task takes, so that a
-- completion, a rescue or a claim reads it from the row it has locked (see
-- stopDestinationSQL) instead of through a snapshot of the command table
-- that may predate the command. Every move out of the active states clears
-- both flags.
ALTER TABLE flotilla_tasks
    ADD COLUMN stop_requested  boolean NOT NULL DEFAULT false,
    ADD COLUMN pause_requested boolean NOT NULL DEFAULT false;

-- Stops issued before this version are pending as command rows only.
UPDATE flotilla_tasks t SET stop_requested = true
WHERE t.status IN ('running', 'stopping', 'pausing')
  AND EXISTS (SELECT 1 FROM flotilla_commands c
              WHERE c.task_id = t.id AND c.acked_at IS NULL AND c.kind = 'stop');
