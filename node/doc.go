// Package node runs handlers: a program that does the work of a fleet makes
// a Node on the fleet's store, registers a handler for each kind it runs,
// starts it, and shuts it down when the program ends.
//
//	client, err := flotilla.Connect(ctx, dsn)
//	n, err := node.New(client.Store(), node.Config{
//		AllBuckets: true,        // or Buckets: the ones this process serves
//		Slog:       slog.Default(),
//		Middleware: []node.Middleware{node.LogAttempts(slog.Default())},
//	})
//	err = flotilla.Handle(n, sendEmail) // a typed handler; n.Register for an untyped one
//	err = n.Start(ctx)
//	defer n.Shutdown(context.WithoutCancel(ctx))
//
// Config has a named default for every field, and New refuses what cannot
// work, naming the field. A handler's context ends when its attempt must
// stop, and context.Cause says why (ErrTimeout, ErrStopRequested,
// ErrBucketLost, ErrTaskLeaseLost, ErrShuttingDown). Config.Middleware
// wraps every handler; the node runs the chain inside Recover, so that a
// panic fails its attempt rather than the process.
//
// # How it works
//
// A node holds the leases of the buckets it declares, and only there
// claims, runs, rescues and fires. What the node owns: the local deadline of each bucket lease (how long it
// may trust the database's last answer), and the handlers it runs. What the
// database decides: who holds a bucket, under which epoch, and whether a
// write about a running task still comes from the attempt that claimed it.
//
// A started node runs a few loops, each with one lifecycle (started by
// Start, ended by Shutdown): the lease loop renews and acquires the
// declared buckets every heartbeat; the node heartbeat keeps the node live;
// the claim loop claims as many tasks as it can start now, of the kinds
// registered, in the buckets it holds, stamped with their epochs; the task
// lease renewer extends the leases of the attempts it runs, in one
// statement; the completer writes outcomes in batches; the rescuer
// (package reconcile) moves on the tasks of held buckets whose attempt is
// gone: at every acquisition, at once, and every ReconcileInterval; and,
// when the store
// pushes notifications, a listener wakes the claim loop for new work and the
// lease loop for released buckets. Polling backs every notification up.
//
// On failure: a renewal that fails is not a lost lease; the node serves
// until the local deadline, which a timer of its own enforces. A definite
// answer that another node holds a bucket, or a passed deadline, stops
// claiming there at once and cancels the handlers of its tasks (their
// writes would be fenced anyway); so does a task lease that is no longer
// renewed. Such attempts are dropped without a write, and the bucket's
// holder rescues their tasks. A handler that panics fails its attempt.
//
// Shutdown stops claiming, lets running handlers finish for
// ShutdownTimeout, releases the tasks of those that do not (their attempts
// are not counted), and releases the bucket leases so that a standby takes
// over at once.
package node
