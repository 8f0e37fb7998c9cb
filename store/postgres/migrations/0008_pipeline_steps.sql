-- The tasks of each pipeline, listed in a table of their own.
--
-- flotilla_tasks_pipeline_idx found them before, but an index on the task
-- table gains an entry at every move of a step that is not a HOT update:
-- a step's release, claim and end each added one. A row here is written
-- once, with the task, and removed with it by the prune.
CREATE TABLE flotilla_pipeline_steps (
    pipeline_id bigint NOT NULL,
    task_id     bigint NOT NULL,
    PRIMARY KEY (pipeline_id, task_id)
);

INSERT INTO flotilla_pipeline_steps (pipeline_id, task_id)
SELECT pipeline_id, id FROM flotilla_tasks WHERE pipeline_id IS NOT NULL;

DROP INDEX flotilla_tasks_pipeline_idx;
