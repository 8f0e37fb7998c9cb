-- Task metadata: what travels with a task apart from its payload (a trace
-- context, a request id), as a JSON object of strings; NULL for none. Adding
-- a column without a default rewrites nothing.
ALTER TABLE flotilla_tasks ADD COLUMN metadata jsonb;
