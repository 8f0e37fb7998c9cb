// Package flotilla runs background tasks for Go programs, on SQLite for one
// machine and PostgreSQL for a fleet of them. Describe a task as a Go type
// that names its kind, write a handler for it, submit tasks, and the nodes
// of the fleet run them, retried, timed out, paused and stopped as asked.
//
//	type Email struct {
//		To string `json:"to"`
//	}
//
//	func (Email) Kind() string { return "email" }
//
//	err := flotilla.Migrate(ctx, "sqlite:app.db") // creates the schema, or upgrades it
//	client, err := flotilla.Connect(ctx, "sqlite:app.db")
//	n, err := node.New(client.Store(), node.Config{AllBuckets: true})
//	err = flotilla.Handle(n, func(ctx context.Context, job *flotilla.Job[Email]) (string, error) {
//		return send(ctx, job.Args.To) // the result, stored as JSON
//	})
//	err = n.Start(ctx)
//	t, err := flotilla.SubmitArgs(ctx, client, Email{To: "ada@example.com"}, flotilla.WithKey("user-42"))
//	id, err := flotilla.WaitResult[string](ctx, client, t.ID)
//
// A node (package node) runs handlers; a Client only submits and inspects,
// so a web server that enqueues work needs no node. Handle registers a
// handler for a type's kind: the payload is decoded into the type strictly
// (a field the type lacks fails the task at once, naming the field), and
// the handler's result is stored with the task, read back with ResultOf.
// SubmitArgs submits one task, with options (WithKey, WithPriority,
// WithMaxAttempts, WithRunAt, WithUniqueKey, ...); SubmitTx and
// SubmitSQLiteTx submit inside the application's own transaction, so that a
// task exists only if the transaction commits. Stop, Pause and Resume
// control a task wherever it runs, taking Reason and By.
//
// Package flotillatest runs a handler in a test without a fleet, checks
// what a function submitted, and starts a one-node fleet on a temporary
// file; package otel traces each submit and each attempt, the attempt a
// child of the submit.
//
// # Routing
//
// A task's key picks its bucket, and each bucket has one holder at a time,
// the only node that runs its tasks. Submit routes a task by its key to the
// key's bucket, and by default refuses a task that would wait silently: one
// whose bucket no live node holds, or whose kind the bucket's holder does
// not run (docs/design.md, invariants 7 and 11). A task without a key has no
// bucket of its own: Submit places it in a bucket that a live node holds and
// whose holder runs its kind, and refuses it only when there is none. A
// Client never runs tasks and never consumes commands: it issues them, and
// the nodes apply them.
package flotilla

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/flotilla-dev/flotilla/balance"
	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/commands"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store"
	storedsn "github.com/flotilla-dev/flotilla/store/dsn"
	"github.com/flotilla-dev/flotilla/task"
)

// Client enqueues and inspects tasks. It is safe for concurrent use.
type Client struct {
	store      store.Store
	policy     bucket.Policy
	owned      bool // Close closes the store
	middleware []SubmitMiddleware

	mu      sync.Mutex
	fleet   fleetView
	viewTTL time.Duration
}

// Connect opens a Client on the fleet at dsn: a PostgreSQL URL
// (postgres://...) or an SQLite file (sqlite:PATH, or a path ending in .db);
// see package dsn. A database without the schema is refused with an error
// matching ErrNoSchema, and nothing is created: Migrate creates the schema.
// Close closes what Connect opened.
func Connect(ctx context.Context, dsn string, opts ...ClientOption) (*Client, error) {
	target, err := storedsn.Parse(dsn)
	if err != nil {
		return nil, err
	}
	if target.Kind == storedsn.SQLite {
		// Opening a missing file would create it, empty.
		if _, err := os.Stat(target.Path); errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%s: %w", target, ErrNoSchema)
		}
	}
	s, err := target.Open(ctx)
	if err != nil {
		return nil, err
	}
	c, err := NewClient(ctx, s, opts...)
	if err != nil {
		s.Close()
		var se *store.SchemaError
		if errors.As(err, &se) && se.Database == 0 {
			return nil, fmt.Errorf("%s: %w", target, ErrNoSchema)
		}
		return nil, err
	}
	c.owned = true
	return c, nil
}

// NewClient wraps a store. It reads the fleet's bucket count, refusing a
// schema this binary does not know (*store.SchemaError).
func NewClient(ctx context.Context, s store.Store, opts ...ClientOption) (*Client, error) {
	meta, err := s.Meta(ctx)
	if err != nil {
		return nil, err
	}
	policy, err := bucket.NewPolicy(meta.NumBuckets)
	if err != nil {
		return nil, err
	}
	c := &Client{store: s, policy: policy, viewTTL: time.Second}
	for _, opt := range opts {
		opt(c)
	}
	return c, nil
}

// Close closes the store if Connect opened it.
func (c *Client) Close() {
	if c.owned {
		c.store.Close()
	}
}

// Store is the store under the client, for tools that need more.
func (c *Client) Store() store.Store { return c.store }

// Policy is the fleet's bucket policy.
func (c *Client) Policy() bucket.Policy { return c.policy }

// TaskRequest describes a task to submit. It is node.SubmitRequest, so
// that a task is described the same way whether a client or a node submits
// it; store.CheckNewTasks says what is valid, with the same typed errors
// (*store.InvalidError) as the command line prints.
type TaskRequest = node.SubmitRequest

// ErrRefused is matched by every refusal that comes from the fleet's state
// rather than from the request itself.
var ErrRefused = errors.New("refused by the fleet")

// UnheldBucketError refuses a task whose bucket no live node holds or
// declares. For a task without a key, Bucket is -1: no live node holds any
// bucket.
type UnheldBucketError struct {
	Key    string
	Bucket int
}

func (e *UnheldBucketError) Error() string {
	if e.Bucket < 0 {
		return "no live node holds any bucket: a task without a key would wait unserved; " +
			"start a node, or submit with flotilla.AllowUnowned()"
	}
	return fmt.Sprintf("no live node holds bucket %d (key %q): the task would wait unserved; "+
		"start a node that declares bucket %d, or submit with flotilla.AllowUnowned()", e.Bucket, e.Key, e.Bucket)
}

func (e *UnheldBucketError) Is(target error) bool { return target == ErrRefused }

// UnservedKindError refuses a task whose bucket's holder does not run its
// kind. For a task without a key, Bucket is -1 and Holder empty: no node
// that holds a bucket runs the kind, and Kinds lists what they run.
type UnservedKindError struct {
	Kind   string
	Bucket int
	Holder string   // node id
	Kinds  []string // what the holder runs
}

func (e *UnservedKindError) Error() string {
	if e.Bucket < 0 {
		return fmt.Sprintf("no live node that holds a bucket runs kind %q (they run: %s); "+
			"submit with flotilla.AllowUnknownKind() to let the task wait for a node that does",
			e.Kind, strings.Join(e.Kinds, ", "))
	}
	return fmt.Sprintf("node %s holds bucket %d but does not run kind %q (it runs: %s); "+
		"submit with flotilla.AllowUnknownKind() to let the task wait for a node that does",
		e.Holder, e.Bucket, e.Kind, strings.Join(e.Kinds, ", "))
}

func (e *UnservedKindError) Is(target error) bool { return target == ErrRefused }

// Submit creates one task, with opts applied over r. See SubmitMany.
func (c *Client) Submit(ctx context.Context, r TaskRequest, opts ...SubmitOption) (*task.Task, error) {
	out, err := c.SubmitMany(ctx, []TaskRequest{r}, opts...)
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

// SubmitMany creates tasks atomically, all or none, after checking that each
// would be served (unless told otherwise by opts). The field options of
// opts (WithKey, WithPriority, ...) apply to every task.
//
// A task with a key goes to the key's bucket (xxhash64(key) mod N). A task
// without one has no ordering to keep and no bucket of its own: it goes to a
// bucket chosen at random among those a live node holds and whose holder
// runs its kind (any held bucket with AllowUnknownKind). When there is none
// it is refused, *UnheldBucketError when no live node holds any bucket and
// *UnservedKindError when the holders do not run its kind; with
// AllowUnowned it goes to a random bucket nobody holds instead. Its stored
// key stays "".
func (c *Client) SubmitMany(ctx context.Context, rs []TaskRequest, opts ...SubmitOption) ([]*task.Task, error) {
	o := newSubmitOptions(opts)
	return c.submitWith(ctx, o, rs, func(ctx context.Context, nts []store.NewTask) ([]*task.Task, error) {
		if err := c.checkServed(ctx, nts, o); err != nil {
			return nil, err
		}
		return c.store.CreateTasks(ctx, nts)
	})
}

// submitWith is every submit of tasks: opts' fields are applied to each
// request, the middleware runs around the rest, and the requests are routed
// (within o's checks) and given to create.
func (c *Client) submitWith(ctx context.Context, o submitOptions, rs []TaskRequest,
	create func(context.Context, []store.NewTask) ([]*task.Task, error)) ([]*task.Task, error) {
	applied := make([]TaskRequest, len(rs))
	for i, r := range rs {
		applied[i] = o.apply(r)
	}
	last := func(ctx context.Context, rs []TaskRequest) ([]*task.Task, error) {
		nts, err := c.route(ctx, rs, o)
		if err != nil {
			return nil, err
		}
		return create(ctx, nts)
	}
	return chainSubmit(last, c.middleware)(ctx, applied)
}

// route turns requests into the store's form, with their buckets.
func (c *Client) route(ctx context.Context, rs []TaskRequest, o submitOptions) ([]store.NewTask, error) {
	if len(rs) == 0 {
		return nil, fmt.Errorf("%w: no tasks to submit", store.ErrInvalid)
	}
	nts := make([]store.NewTask, len(rs))
	keyless := false
	for i, r := range rs {
		b := 0 // a task without a key is placed below, once its input is valid
		if r.RoutingKey() != "" {
			b = c.policy.Of(r.RoutingKey())
		} else {
			keyless = true
		}
		nts[i] = r.NewTask(b)
	}
	if err := store.CheckNewTasks(nts, c.policy.Count()); err != nil {
		return nil, err
	}
	if !keyless {
		return nts, nil
	}
	view, err := c.view(ctx)
	if err != nil {
		return nil, err
	}
	for i := range nts {
		if store.LimitKeyOf(nts[i].Key, nts[i].LimitKey) != "" {
			continue
		}
		b, err := c.place(view, nts[i].Kind, o)
		if err != nil && len(nts) > 1 {
			return nil, fmt.Errorf("task %d of %d: %w", i, len(nts), err)
		}
		if err != nil {
			return nil, err
		}
		nts[i].Bucket = b
	}
	return nts, nil
}

// place chooses the bucket of a task without a key (see SubmitMany).
func (c *Client) place(view fleetView, kind string, o submitOptions) (int, error) {
	var served []int
	kinds := map[string]bool{}
	for b, holder := range view.holders {
		if o.allowUnknownKind || runs(holder, kind) {
			served = append(served, b)
		}
		for _, k := range holder.Kinds {
			kinds[k] = true
		}
	}
	if len(served) > 0 {
		return served[rand.IntN(len(served))], nil
	}
	if o.allowUnowned {
		var unheld []int
		for b := range c.policy.Count() {
			if _, held := view.holders[b]; !held {
				unheld = append(unheld, b)
			}
		}
		if len(unheld) > 0 {
			return unheld[rand.IntN(len(unheld))], nil
		}
	}
	if len(view.holders) == 0 {
		return 0, &UnheldBucketError{Bucket: -1}
	}
	run := make([]string, 0, len(kinds))
	for k := range kinds {
		run = append(run, k)
	}
	sort.Strings(run)
	return 0, &UnservedKindError{Kind: kind, Bucket: -1, Kinds: run}
}

// checkServed refuses a task with a key whose bucket would not serve it; a
// task without one was placed where it is served (route).
func (c *Client) checkServed(ctx context.Context, nts []store.NewTask, o submitOptions) error {
	if o.allowUnowned && o.allowUnknownKind {
		return nil
	}
	view, err := c.view(ctx)
	if err != nil {
		return err
	}
	for _, nt := range nts {
		if store.LimitKeyOf(nt.Key, nt.LimitKey) == "" {
			continue
		}
		holder, ok := view.holders[nt.Bucket]
		if !ok {
			if o.allowUnowned {
				continue
			}
			return &UnheldBucketError{Key: nt.Key, Bucket: nt.Bucket}
		}
		if !o.allowUnknownKind && !runs(holder, nt.Kind) {
			return &UnservedKindError{Kind: nt.Kind, Bucket: nt.Bucket, Holder: holder.ID, Kinds: holder.Kinds}
		}
	}
	return nil
}

// fleetView is who holds which bucket and what each holder runs, read at
// most once per viewTTL so that a busy client does not read every lease for
// every task.
type fleetView struct {
	read    time.Time
	holders map[int]store.NodeInfo
}

func (c *Client) view(ctx context.Context) (fleetView, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.fleet.read.IsZero() && time.Since(c.fleet.read) < c.viewTTL {
		return c.fleet, nil
	}
	return c.readViewLocked(ctx)
}

// freshView reads the fleet's state now, for reports that show it.
func (c *Client) freshView(ctx context.Context) (fleetView, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.readViewLocked(ctx)
}

func (c *Client) readViewLocked(ctx context.Context) (fleetView, error) {
	leases, err := c.store.ListBuckets(ctx)
	if err != nil {
		return fleetView{}, err
	}
	nodes, err := c.store.ListNodes(ctx)
	if err != nil {
		return fleetView{}, err
	}
	byIncarnation := map[string]store.NodeInfo{}
	for _, n := range nodes {
		if n.Alive {
			byIncarnation[n.Incarnation] = n
		}
	}
	v := fleetView{read: time.Now(), holders: map[int]store.NodeInfo{}}
	for _, l := range leases {
		if n, ok := byIncarnation[l.Holder]; ok && l.Holder != "" {
			v.holders[l.Bucket] = n
		}
	}
	// A bucket whose lease lapsed for a moment (a renewal slower than its
	// bound on a loaded machine) while a live node declares it is served:
	// that node takes it at its next pass. Only a bucket no live node
	// holds or declares would leave a task unserved.
	for _, l := range leases {
		if _, held := v.holders[l.Bucket]; held {
			continue
		}
		for _, n := range nodes {
			if n.Alive && !n.Leaving && n.StoppedAt.IsZero() && n.Buckets.Contains(l.Bucket) {
				if cur, ok := v.holders[l.Bucket]; !ok || n.ID < cur.ID {
					v.holders[l.Bucket] = n
				}
			}
		}
	}
	c.fleet = v
	return v, nil
}

func runs(n store.NodeInfo, kind string) bool {
	for _, k := range n.Kinds {
		if k == kind {
			return true
		}
	}
	return false
}

// Get returns a task as it is now, as List returns each. A missing one
// matches store.ErrNotFound.
func (c *Client) Get(ctx context.Context, id int64) (*task.Task, error) {
	return c.store.GetTask(ctx, id)
}

// Report returns a task with its audit trail and, while it waits, why: what
// `worker get` prints.
func (c *Client) Report(ctx context.Context, id int64) (*TaskReport, error) {
	t, err := c.store.GetTask(ctx, id)
	if err != nil {
		return nil, err
	}
	events, err := c.store.TaskEvents(ctx, id)
	if err != nil {
		return nil, err
	}
	r := &TaskReport{Task: t, Events: events}
	if t.Status.Claimable() {
		view, err := c.view(ctx)
		if err != nil {
			return nil, err
		}
		r.Waiting = waitingReason(t, view)
	}
	return r, nil
}

// Wait reads task id until it has ended (succeeded, failed, stopped, ...:
// task.Status.Terminal) and returns it as it ended. When ctx ends first it
// returns ctx's error, with the task as it was last read (nil if no read
// finished). It reads often at first and less often as the task runs on, at
// most every half second.
func (c *Client) Wait(ctx context.Context, id int64) (*task.Task, error) {
	poll := 5 * time.Millisecond
	tick := time.NewTimer(poll)
	defer tick.Stop()
	var last *task.Task
	for {
		t, err := c.store.GetTask(ctx, id)
		switch {
		case err != nil && ctx.Err() != nil && last != nil:
			return last, fmt.Errorf("task %d is still %s: %w", id, last.Status, context.Cause(ctx))
		case err != nil:
			return nil, err
		case t.Status.Terminal():
			return t, nil
		}
		last = t
		select {
		case <-ctx.Done():
			return t, fmt.Errorf("task %d is still %s: %w", id, t.Status, context.Cause(ctx))
		case <-tick.C:
		}
		poll = min(2*poll, 500*time.Millisecond)
		tick.Reset(poll)
	}
}

// TaskReport is a task with its trail (Report).
type TaskReport struct {
	Task   *task.Task
	Events []task.Event
	// Waiting says why a claimable task is not running, when the fleet's
	// state explains it: nobody holds its bucket, or the holder does not
	// run its kind. Empty otherwise.
	Waiting string
}

func waitingReason(t *task.Task, v fleetView) string {
	holder, ok := v.holders[t.Bucket]
	if !ok {
		return fmt.Sprintf("no live node holds bucket %d", t.Bucket)
	}
	if !runs(holder, t.Kind) {
		return fmt.Sprintf("node %s holds bucket %d but does not run kind %q", holder.ID, t.Bucket, t.Kind)
	}
	return ""
}

// List returns tasks matching the filter, newest first.
func (c *Client) List(ctx context.Context, f store.TaskFilter) ([]*task.Task, error) {
	return c.store.ListTasks(ctx, f)
}

// BucketReport is one bucket as an operator sees it.
type BucketReport struct {
	Bucket    int
	Holder    string // node id; "" when nobody holds it
	Epoch     int64
	ExpiresAt time.Time
	Standby   []string // live nodes that declare the bucket but do not hold it
	Queued    int      // claimable and due
	Waiting   int      // scheduled or retrying, not yet due
	Running   int      // running, stopping or pausing
	// Target is the node the fleet's assignment gives the bucket to
	// (package balance); "" when no node in particular.
	Target string
	// Successor is the node the holder is handing the bucket to while its
	// tasks there finish, since HandoffSince; "" when no hand-off is under
	// way. HandedBy is the node that handed it to its holder, until the
	// holder takes it up.
	Successor    string
	HandoffSince time.Time
	HandedBy     string
	// Pin is the node an operator moved the bucket to (MoveBuckets).
	Pin string
}

// Buckets reports every bucket of the fleet, ascending.
func (c *Client) Buckets(ctx context.Context) ([]BucketReport, error) {
	leases, err := c.store.ListBuckets(ctx)
	if err != nil {
		return nil, err
	}
	nodes, err := c.store.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	backlog, err := c.store.BucketBacklog(ctx)
	if err != nil {
		return nil, err
	}
	byBucket := map[int]store.Backlog{}
	for _, b := range backlog {
		byBucket[b.Bucket] = b
	}
	targets := balance.Assign(balance.FromStore(len(leases), nodes, leases))
	out := make([]BucketReport, len(leases))
	for i, l := range leases {
		r := BucketReport{Bucket: l.Bucket, Epoch: l.Epoch, Standby: []string{}, Target: targets.Target(l.Bucket),
			Successor: l.Successor, HandoffSince: l.HandoffSince, HandedBy: l.HandedBy, Pin: l.Pin}
		if l.Holder != "" {
			r.Holder, r.ExpiresAt = l.Node, l.ExpiresAt
		}
		for _, n := range nodes {
			if n.Alive && n.Incarnation != l.Holder && n.Buckets.Contains(l.Bucket) {
				r.Standby = append(r.Standby, n.ID)
			}
		}
		sort.Strings(r.Standby)
		bl := byBucket[l.Bucket]
		r.Queued, r.Waiting, r.Running = bl.Queued, bl.Waiting, bl.Active
		out[i] = r
	}
	return out, nil
}

// Nodes lists the registered nodes.
func (c *Client) Nodes(ctx context.Context) ([]store.NodeInfo, error) {
	return c.store.ListNodes(ctx)
}

// WaitCommand waits until command id is acknowledged (see commands.Wait),
// reading it every poll.
func (c *Client) WaitCommand(ctx context.Context, id int64, poll time.Duration) (store.Command, task.Status, error) {
	return commands.Wait(ctx, c.store, id, poll)
}
