// Package dashboard serves the operator's console of a fleet: what failed,
// and fixing it. The fleet page counts tasks by kind and state and charts
// the attempts that ended in the last hour and day, beside the bucket map and
// the nodes; the task list filters and pages the tasks, and acts on every
// task a filter matches (retry, stop, cancel; reviewed, confirmed, capped);
// a task's page shows why it waits or was skipped, its payload with secrets
// masked, an exec task's output, its retry links and its trail, with stop,
// pause, resume and retry; the pipelines are listed, and each pipeline's page
// draws its graph, with retry from a step and stop, pause and resume; the
// schedules are paused and resumed.
//
//	d, err := dashboard.New(ctx, dashboard.Config{Store: s, Token: token})
//	defer d.Close()
//	http.ListenAndServe("127.0.0.1:8089", d)
//
// It needs only a store.Store: `worker ui` runs it as a process of its own,
// which works when no node runs, and `worker run --ui` mounts it beside
// /healthz. Pages are rendered on the server with html/template from
// embedded files, the graph and the charts as SVG; the one script only opens
// the live streams.
//
// What it reads, it reads through store.Store's own queries: each uses an
// index (the task list walks the primary key backwards from its cursor; the
// backlog and the counts by kind read only the claim and active partial
// indexes; the charts read the per-minute counts nodes write, package
// rollup), and each runs under the request's QueryTimeout. It never counts
// the task table. A live view has one reader, whoever watches: the first
// viewer starts it, every viewer gets its renderings, the last ends it.
//
// Security. Without a token it is read-only and open to read. With one,
// reading needs a signed-in operator too (AuthAll), unless Config.Auth is
// AuthActions, which the pages then say. Sessions live in the server's
// memory: the cookie carries a random id, signing out ends the session
// everywhere, and sessions expire. Sign-in is rate limited per client address
// and overall. Actions need the session, its CSRF token and the same origin,
// and go through package commands or store.RetryTask with "ui:<name>", so
// every trail says who acted. Notices are kept in the session, never taken
// from an address; data goes into no path segment; live events are encoded
// by the event stream format's rules. Payload and result fields named like
// secrets are masked until an operator reveals them, which the log records.
// Responses carry a Content-Security-Policy that allows only this origin's
// script and style. The page never shows the connection string: the server
// does not have it.
package dashboard
