// Package metrics exports a node's view of the fleet to Prometheus: make a
// Metrics on the node's store, give it to the node's Config (it counts what
// the node does, and times each handler as a middleware), Watch the node,
// and serve it on /metrics.
//
//	m, err := metrics.New(s, metrics.Options{})
//	n, err := node.New(s, node.Config{
//		AllBuckets: true, Metrics: m, Middleware: []node.Middleware{m.Middleware()},
//	})
//	m.Watch(n)
//	err = m.Start(ctx) // samples the database-backed gauges
//	defer m.Stop()
//	http.Handle("/metrics", m)
//
// # How it works
//
// Each node counts what it does from the facts it already has: a claim
// knows how many tasks it started and how long each waited, the completer
// what it wrote, the lease keeper what it took and lost (node.Metrics is the
// seam). Nothing is counted over the task table when Prometheus scrapes:
// the gauges that need the database (the backlog of the buckets this node
// holds, the age of their oldest due task, the buckets nobody holds) are
// sampled every Interval by one statement each, the backlog's on the claim
// and active partial indexes only, and a scrape reads the last sample.
//
// A sum over the fleet's nodes of a per-node gauge is the fleet's figure,
// since every bucket has at most one holder; flotilla_buckets_unheld is the
// same on every node (it is the fleet's), so alert on its max.
//
// Labels are kinds, states, outcomes and command kinds: never a task key or
// id, so that the number of series stays bounded by the application.
package metrics
