-- Task metadata: what travels with a task apart from its payload (a trace
-- context, a request id), as a JSON object of strings; NULL for none.
ALTER TABLE flotilla_tasks ADD COLUMN metadata TEXT;
