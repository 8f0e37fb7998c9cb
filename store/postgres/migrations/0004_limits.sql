-- Flow control: limits declared as data the fleet shares, what a task
-- counts under and needs, and the latest reason it waits.
--
-- limit_key and resources are read only by the limited claim and by the
-- holder rebuilding its counters; the plain claim (claimSQL) does not read
-- them, so a fleet without limits pays only their bytes. Both have a
-- constant default, so adding them rewrites no row.
ALTER TABLE flotilla_tasks
    ADD COLUMN limit_key   text  NOT NULL DEFAULT '',
    ADD COLUMN resources   jsonb,           -- {"gpu": 1}; NULL needs nothing
    ADD COLUMN wait_reason text  NOT NULL DEFAULT '';

CREATE TABLE flotilla_limits (
    name        text        PRIMARY KEY,
    kind        text        NOT NULL,
    per         text        NOT NULL CHECK (per IN ('key', 'fleet')),
    concurrency int         NOT NULL DEFAULT 0 CHECK (concurrency >= 0),
    rate        int         NOT NULL DEFAULT 0 CHECK (rate >= 0),
    period_ms   bigint      NOT NULL DEFAULT 0 CHECK (period_ms >= 0),
    burst       int         NOT NULL DEFAULT 0 CHECK (burst >= 0),
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL,
    CHECK ((concurrency > 0) <> (rate > 0))
);

-- One row per holder of a fleet-wide limit: its share and the demand it
-- published with it. A share is trusted until expires_at; TakeShare, under
-- a lock on the limit's row, counts a lapsed holder by the tasks of the
-- kind it still runs.
CREATE TABLE flotilla_limit_shares (
    limit_name text        NOT NULL REFERENCES flotilla_limits (name) ON DELETE CASCADE,
    owner      text        NOT NULL,
    node       text        NOT NULL,
    share      int         NOT NULL CHECK (share >= 0),
    demand     int         NOT NULL CHECK (demand >= 0),
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (limit_name, owner)
);
