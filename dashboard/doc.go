// Package dashboard serves the operator's web view of a fleet: the bucket
// map and the nodes (live, by server-sent events), tasks with filters and
// keyset pages, one task with its trail and the stop, pause and resume
// buttons, and the schedules.
//
// It needs only a store.Store: `worker ui` runs it as a process of its own,
// which works when no node runs, and `worker run --ui` mounts it beside
// /healthz. Pages are rendered on the server with html/template from
// embedded files; the one script only opens the live streams.
//
// What it reads, it reads through store.Store's own queries: each uses an
// index (the task list walks the primary key backwards from its cursor; the
// backlog counts only the claim and active partial indexes), and each runs
// under the request's QueryTimeout. It never counts the task table.
//
// Security: it is read-only unless a token is configured. With one, an
// operator signs in with the token and a name; actions then need the
// session cookie (HttpOnly, SameSite=Strict) and a CSRF token bound to it,
// and a request from another origin is refused. Every action goes through
// package commands (or the schedule calls of package flotilla), with
// IssuedBy "ui:<name>", so the audit trail says who acted. Responses carry a
// Content-Security-Policy that allows only this origin's script and style.
// The page never shows the connection string: the server does not have it.
package dashboard
