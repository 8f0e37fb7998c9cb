-- Flow control: limits declared as data the fleet shares, what a task
-- counts under and needs, and the latest reason it waits; as in the
-- PostgreSQL store's migration 4.
--
-- limit_key and resources are read only by the limited claim and by the
-- holder rebuilding its counters; the plain claim does not filter on them.
-- Constant defaults: adding them rewrites no row.
ALTER TABLE flotilla_tasks ADD COLUMN limit_key TEXT NOT NULL DEFAULT '';
ALTER TABLE flotilla_tasks ADD COLUMN resources TEXT; -- JSON {"gpu": 1}; NULL needs nothing
ALTER TABLE flotilla_tasks ADD COLUMN wait_reason TEXT NOT NULL DEFAULT '';

CREATE TABLE flotilla_limits (
    name        TEXT    PRIMARY KEY,
    kind        TEXT    NOT NULL,
    per         TEXT    NOT NULL CHECK (per IN ('key', 'fleet')),
    concurrency INTEGER NOT NULL DEFAULT 0 CHECK (concurrency >= 0),
    rate        INTEGER NOT NULL DEFAULT 0 CHECK (rate >= 0),
    period_ms   INTEGER NOT NULL DEFAULT 0 CHECK (period_ms >= 0),
    burst       INTEGER NOT NULL DEFAULT 0 CHECK (burst >= 0),
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    CHECK ((concurrency > 0) <> (rate > 0))
);

-- One row per holder of a fleet-wide limit: its share and the demand it
-- published with it. A share is trusted until expires_at; TakeShare, in the
-- writer's transaction (the file's one write lock stands for PostgreSQL's
-- lock on the limit's row), counts a lapsed holder by the tasks of the kind
-- it still runs. DeleteLimit deletes a limit's shares with it (foreign keys
-- are off on every connection).
CREATE TABLE flotilla_limit_shares (
    limit_name TEXT    NOT NULL,
    owner      TEXT    NOT NULL,
    node       TEXT    NOT NULL,
    share      INTEGER NOT NULL CHECK (share >= 0),
    demand     INTEGER NOT NULL CHECK (demand >= 0),
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (limit_name, owner)
);
