-- Pipelines: tasks that wait for other tasks of the same pipeline, as in
-- the PostgreSQL store's migration 3.
--
-- A pipeline's steps all live in the bucket of its key. A step is a task
-- with pipeline_id and step set; a retry adds a new task for a step, and
-- the newest is the step's current one. AUTOINCREMENT so that an id is
-- never handed out twice.
CREATE TABLE flotilla_pipelines (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    name       TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    bucket     INTEGER NOT NULL CHECK (bucket >= 0),
    created_at INTEGER NOT NULL
);

-- deps_left counts the dependencies of a pending step that have not ended.
-- The write that ends a dependency decrements it inside the writer's
-- transaction, which one write lock serialises with every other write to
-- the file.
ALTER TABLE flotilla_tasks ADD COLUMN pipeline_id INTEGER;
ALTER TABLE flotilla_tasks ADD COLUMN step TEXT;
ALTER TABLE flotilla_tasks ADD COLUMN deps_left INTEGER NOT NULL DEFAULT 0;

-- The tasks of one pipeline: GetPipeline, the names an append must not take.
-- Partial, so that tasks outside pipelines cost it nothing.
CREATE INDEX flotilla_tasks_pipeline_idx ON flotilla_tasks (pipeline_id, id) WHERE pipeline_id IS NOT NULL;

-- One row per dependency of a step's task: the task it names (the current
-- task of that step when the dependent was created) and its policy.
CREATE TABLE flotilla_task_deps (
    task_id   INTEGER NOT NULL,
    dep_id    INTEGER NOT NULL,
    dep_step  TEXT    NOT NULL,
    on_policy TEXT    NOT NULL CHECK (on_policy IN ('success', 'any', 'failure')),
    ord       INTEGER NOT NULL, -- the dependency's place in the step's list
    PRIMARY KEY (task_id, dep_id)
) WITHOUT ROWID;

-- The dependents of a task that ends: read by every write that ends a
-- pipeline step.
CREATE INDEX flotilla_task_deps_dep_idx ON flotilla_task_deps (dep_id);
