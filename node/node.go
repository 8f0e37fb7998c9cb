package node

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// Handler runs one attempt of a task. It returns nil when the work is done,
// and an error to have the attempt retried (while attempts remain) or the
// task failed. It may set t.Result (JSON) to record a result: with success,
// and with a failure too, when the attempt's output helps whoever finds it.
//
// ctx is cancelled when the attempt must stop: its timeout passed
// (ErrTimeout), this node lost the task's bucket (ErrBucketLost) or the task
// lease (ErrTaskLeaseLost), or a shutdown ran out of patience
// (ErrShuttingDown), or the task was stopped (ErrStopRequested);
// context.Cause(ctx) tells which. t.Epoch and t.ClaimSeq
// are the fencing token for the handler's own side effects.
type Handler func(ctx context.Context, t *task.Task) error

// Causes of a handler's context cancellation, from context.Cause.
var (
	ErrTimeout       = errors.New("the task's timeout passed")
	ErrBucketLost    = errors.New("bucket lease lost: another node holds the task's bucket, or may soon")
	ErrTaskLeaseLost = errors.New("task lease lost: the attempt is no longer renewed")
	ErrShuttingDown  = errors.New("node is shutting down: the task is released for another attempt")
)

// ErrStopRequested is the cause of a handler's context cancellation when
// its task was stopped through the command channel.
var ErrStopRequested = errors.New("stop requested: the task is being stopped")

// ErrStopped is returned by Start and Submit on a node that has been shut
// down.
var ErrStopped = errors.New("node has been shut down")

type state int

const (
	stateNew state = iota
	stateStarting
	stateRunning
	stateStopped
)

func (s state) String() string {
	switch s {
	case stateNew:
		return "new"
	case stateStarting:
		return "starting"
	case stateRunning:
		return "running"
	case stateStopped:
		return "stopped"
	}
	return fmt.Sprintf("state(%d)", int(s))
}

// Node is one worker process of a fleet: it holds the leases of the buckets
// it declares, claims the tasks of the kinds registered with it in the
// buckets it holds, runs them and records their outcomes.
type Node struct {
	store       store.Store
	cfg         Config
	id          string
	incarnation string
	log         *zap.Logger
	metrics     Metrics
	// jitter draws the full-jitter retry delay in [0, ceiling]; tests
	// replace it to make due times exact.
	jitter func(ceiling time.Duration) time.Duration
	// stmtTimeout bounds each store call of the loops: heartbeat/2, so a
	// stuck call never delays the next renewal (DESIGN §6).
	stmtTimeout time.Duration

	// life serialises Start and Shutdown.
	life sync.Mutex

	// mu guards the node's lifecycle state, its handlers and its view of
	// the fleet; the attempts have a registry, and a lock, of their own.
	mu       sync.Mutex
	state    state
	handlers map[string]Handler
	// fleet is the fleet's metadata, read once (by Start or the first
	// Submit); fleetOK says it has been.
	fleet   store.Meta
	fleetOK bool

	// attempts holds every attempt this node has claimed and not yet
	// settled (see capacity).
	attempts *attempts
	// draining is set once Shutdown has begun: new attempts are released
	// without running.
	draining atomic.Bool
	// refusals counts outcomes the store refused for a reason other than
	// fencing: each is a bug in the node or the store, which tests check
	// never happens.
	refusals atomic.Int64

	// Set by Start, read-only afterwards.
	kinds    []string
	declared bucket.Set
	keeper   *leaseKeeper
	runCtx   context.Context
	stopRun  context.CancelCauseFunc

	leaseLoop     *loop
	heartbeatLoop *loop
	claimLoop     *loop
	listenLoop    *loop
	scheduleLoop  *loop
	limitLoop     *loop
	shareLoop     *loop
	// listening is set while the node's notification subscription is up:
	// loops that sleep past their poll, counting on being woken, poll
	// instead while it is not (see scheduleWait).
	listening atomic.Bool
	// claimMu is held by whoever claims: a claim pass, or the completer
	// claiming along with an outcome write (flushAndClaim). Each counts the
	// free slots and registers what it claimed before the other counts.
	claimMu sync.Mutex
	// lostClaims is set when a claim statement failed, and may have
	// committed: the next claim pass reads back what it took
	// (lostclaims.go).
	lostClaims atomic.Bool
	// limits is the holder's in-memory view of its limits (limits.go).
	limits    *limiter
	scheduler *scheduler
	completer *completer
	rescuer   *rescuer
	pruner    *pruner
	renewer   *renewer
	commander *commander
	balancer  *balancer
	handoffs  *handoffs

	// claimPasses counts finished claim passes; tests wait on it to know
	// that a pass has looked at the queue.
	claimPasses atomic.Int64
	// schedulePasses counts finished schedule passes, for the same reason.
	schedulePasses atomic.Int64
	// leasePasses counts finished bucket lease passes (tick and balance).
	leasePasses atomic.Int64

	shutdownErr error
}

// New returns a node for the store, with cfg's defaults filled in; it
// refuses a configuration that cannot work, naming the field. The node does
// nothing until Start.
func New(s store.Store, cfg Config) (*Node, error) {
	if s == nil {
		return nil, errors.New("node: the store is nil")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	n := &Node{
		store:         s,
		cfg:           cfg,
		id:            cfg.NodeID,
		incarnation:   cfg.NodeID + "/" + randomHex(8),
		stmtTimeout:   max(cfg.BucketLeaseHeartbeat/2, 100*time.Millisecond),
		handlers:      map[string]Handler{},
		attempts:      newAttempts(),
		leaseLoop:     newLoop("bucket lease"),
		heartbeatLoop: newLoop("node heartbeat"),
		claimLoop:     newLoop("claim"),
		listenLoop:    newLoop("notification listener"),
		scheduleLoop:  newLoop("schedule"),
		limitLoop:     newLoop("limits"),
		shareLoop:     newLoop("shares"),
		scheduler:     newScheduler(),
		jitter:        defaultJitter,
		metrics:       cfg.Metrics,
	}
	n.log = cfg.logger().With(zap.String("node", n.id))
	n.limits = newLimiter(n.store, n.incarnation, n.id, n.cfg.Capacity, n.cfg.Concurrency, n.cfg.BucketLeaseTTL,
		n.cfg.Clock.Now, n.log)
	if lm, ok := cfg.Metrics.(LimitMetrics); ok {
		n.limits.metrics = lm
	}
	n.limits.onReady = n.claimLoop.poke
	n.completer = newCompleter(n)
	n.balancer = newBalancer(n)
	n.handoffs = newHandoffs(n)
	n.rescuer = newRescuer(n)
	n.pruner = newPruner(n)
	n.commander = &commander{
		store: s, owner: n.incarnation, node: n.id, attempts: n.attempts, completer: n.completer,
		clock: cfg.Clock, stopGrace: cfg.StopGrace, poll: cfg.CommandPoll, stmtTimeout: n.stmtTimeout,
		metrics: n.metrics, log: n.log, loop: newLoop("command"),
	}
	n.renewer = &renewer{
		store: s, owner: n.incarnation, attempts: n.attempts, clock: cfg.Clock,
		ttl: cfg.TaskLeaseTTL, margin: taskLeaseMargin(cfg.TaskLeaseTTL), stmtTimeout: n.stmtTimeout,
		log: n.log, loop: newLoop("task lease renewal"), metrics: n.metrics,
	}
	return n, nil
}

// ID returns the node id.
func (n *Node) ID() string { return n.id }

// Incarnation returns the node id and this process's boot nonce: the owner
// recorded on every lease the node takes, so a restarted node is never
// mistaken for its previous life.
func (n *Node) Incarnation() string { return n.incarnation }

// Held returns the buckets this node serves now, with their epochs.
func (n *Node) Held() []store.HeldBucket {
	n.mu.Lock()
	k := n.keeper
	n.mu.Unlock()
	if k == nil {
		return nil
	}
	return k.Held()
}

// Register makes the node run tasks of kind with h. It must be called
// before Start: the kinds are part of the node's registration, and the
// claim asks only for them. Registering an empty kind, a nil handler, a kind
// twice, or after Start is a programming error and panics, as
// http.ServeMux.Handle does; RegisterSafely returns the error instead.
//
// The node runs h wrapped in Config.Middleware, and that inside Recover.
func (n *Node) Register(kind string, h Handler) {
	if err := n.RegisterSafely(kind, h); err != nil {
		panic(err.Error())
	}
}

// RegisterSafely is Register returning an error where Register panics.
func (n *Node) RegisterSafely(kind string, h Handler) error {
	switch {
	case kind == "":
		return errors.New("node: Register with an empty kind")
	case h == nil:
		return fmt.Errorf("node: Register(%q) with a nil handler", kind)
	}
	if err := store.CheckName("kind", kind, true); err != nil {
		return fmt.Errorf("node: Register: %w", err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.state != stateNew {
		return fmt.Errorf("node: Register(%q) after Start: kinds are fixed once the node has started", kind)
	}
	if _, dup := n.handlers[kind]; dup {
		return fmt.Errorf("node: kind %q is registered twice", kind)
	}
	n.handlers[kind] = Recover(Chain(h, n.cfg.Middleware...))
	return nil
}

// registeredKinds lists the registered kinds, sorted.
func (n *Node) registeredKinds() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	kinds := make([]string, 0, len(n.handlers))
	for k := range n.handlers {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	return kinds
}

// fleetMeta returns the fleet's metadata, reading it on first use.
func (n *Node) fleetMeta(ctx context.Context) (store.Meta, error) {
	n.mu.Lock()
	if n.fleetOK {
		defer n.mu.Unlock()
		return n.fleet, nil
	}
	n.mu.Unlock()
	meta, err := n.store.Meta(ctx)
	if err != nil {
		return store.Meta{}, fmt.Errorf("reading the fleet's metadata: %w", err)
	}
	n.mu.Lock()
	n.fleet, n.fleetOK = meta, true
	n.mu.Unlock()
	return meta, nil
}

// ownership is the set of buckets this node declares in a fleet of count
// buckets, and whether that is every bucket.
func (n *Node) ownership(count int) (bucket.Set, bool) {
	if n.cfg.AllBuckets {
		return bucket.All(count), true
	}
	return n.cfg.Buckets, n.cfg.Buckets.IsAll(count)
}

// Start joins the fleet. In order: it reads the fleet's bucket count and
// checks the declared buckets against it (an error matching
// bucket.ErrInvalidSet, before any lease is taken); registers the node
// (*store.NodeAliveError when a live process uses the same id); takes the
// bucket leases it can, so that Held is filled when Start returns; and
// starts the background loops.
//
// ctx bounds the start-up only. The node runs until Shutdown, whatever
// happens to ctx afterwards; its values are kept for the loops.
func (n *Node) Start(ctx context.Context) error {
	n.life.Lock()
	defer n.life.Unlock()
	n.mu.Lock()
	st := n.state
	if st == stateNew {
		// Register is refused from here on, so the kinds read below are
		// the kinds the node runs.
		n.state = stateStarting
	}
	n.mu.Unlock()
	switch st {
	case stateRunning:
		return fmt.Errorf("node %s: already started", n.id)
	case stateStopped:
		return fmt.Errorf("node %s: %w", n.id, ErrStopped)
	}
	if err := n.start(ctx); err != nil {
		n.mu.Lock()
		n.state = stateNew // nothing is left behind: Start may be tried again
		n.mu.Unlock()
		return err
	}
	return nil
}

func (n *Node) start(ctx context.Context) error {
	// Warm while the start's own statements run: the warm-up holds the
	// pool's connections and hands each back once its hot statements are
	// ready, so that the start's statements and the first claim run on
	// ready connections as soon as there is one, and the node's first
	// tasks start as fast as its thousandth. Start returns once the store
	// is warm; a start that fails cuts the warm-up short.
	warmCtx, stopWarm := context.WithCancel(ctx)
	defer stopWarm()
	warmed := n.warm(warmCtx)
	started := false
	defer func() {
		if !started {
			stopWarm()
		}
		<-warmed
	}()
	meta, err := n.store.Meta(ctx)
	if err != nil {
		return fmt.Errorf("node %s: reading the fleet's metadata: %w", n.id, err)
	}
	if n.cfg.NumBuckets != 0 && n.cfg.NumBuckets != meta.NumBuckets {
		return fmt.Errorf("node %s: %w", n.id, &store.BucketCountError{Fleet: meta.NumBuckets, Requested: n.cfg.NumBuckets})
	}
	declared, all := n.ownership(meta.NumBuckets)
	if err := declared.CheckRange(meta.NumBuckets); err != nil {
		return fmt.Errorf("node %s: declared buckets: %w", n.id, err)
	}
	if err := n.declareSchedules(ctx, meta); err != nil {
		return fmt.Errorf("node %s: %w", n.id, err)
	}
	for _, l := range n.cfg.Limits {
		if _, err := n.store.UpsertLimit(ctx, l); err != nil {
			return fmt.Errorf("node %s: declaring limit %s: %w", n.id, l.Name, err)
		}
	}
	kinds := n.registeredKinds()
	if len(kinds) == 0 {
		n.log.Warn("no kinds registered: this node will hold its buckets but run nothing")
	}

	n.mu.Lock()
	n.kinds, n.declared = kinds, declared
	n.mu.Unlock()
	err = n.store.RegisterNode(ctx, n.registration(regStarting), n.cfg.BucketLeaseTTL)
	if err != nil {
		var alive *store.NodeAliveError
		if errors.As(err, &alive) {
			return err
		}
		return fmt.Errorf("node %s: registering: %w", n.id, err)
	}

	keeper := &leaseKeeper{
		store: n.store, owner: n.incarnation, node: n.id, declared: declared,
		ttl: n.cfg.BucketLeaseTTL, heartbeat: n.cfg.BucketLeaseHeartbeat,
		margin: deadlineMargin(n.cfg.BucketLeaseTTL), clock: n.cfg.Clock, log: n.log,
		onAcquired: n.bucketsAcquired, onLost: n.bucketsLost, metrics: n.metrics,
		held: map[int]heldLease{}, giving: map[int]bool{},
	}
	n.mu.Lock()
	n.fleet, n.fleetOK = meta, true
	n.keeper = keeper
	n.mu.Unlock()

	// A balancing node takes, of the free buckets it declares, only those
	// the fleet's assignment gives it; the others are for the nodes already
	// there, or handed to it by their holders.
	n.balancer.plan(ctx, true)
	if err := n.firstTake(ctx, keeper); err != nil {
		// Leave nothing behind: a lease the statement may have taken after
		// all, and the registration.
		keeper.release(ctx, bucket.Set{})
		keeper.stopTimer()
		n.stopRegistration(ctx)
		return fmt.Errorf("node %s: taking bucket leases: %w", n.id, err)
	}

	// Before the first claim: a node in a fleet with limits never claims
	// as if there were none.
	n.limits.refresh(ctx, keeper.Held(), kinds)

	n.runCtx, n.stopRun = context.WithCancelCause(context.WithoutCancel(ctx))
	n.mu.Lock()
	n.state = stateRunning
	n.mu.Unlock()
	n.startLoops()
	if !n.cfg.NoBalance {
		// Serving now: other nodes may hand it buckets.
		if err := n.store.RegisterNode(ctx, n.registration(regServing), n.cfg.BucketLeaseTTL); err != nil {
			n.log.Warn("registering as a balancing node failed; the node is handed nothing until it is",
				zap.Error(err))
			n.balancer.reregister.Store(true)
		}
	}

	n.log.Info("node started",
		zap.String("incarnation", n.incarnation),
		zap.String("declared", declared.String()),
		zap.Bool("all_buckets", all),
		zap.String("held", keeper.heldSet().String()),
		zap.Strings("kinds", kinds),
		zap.Int("fleet_buckets", meta.NumBuckets),
		zap.Int("concurrency", n.cfg.Concurrency))
	started = true
	return nil
}

// firstTake takes the node's first bucket leases. A lease statement is
// bounded by half a heartbeat, and on a loaded machine (a busy SQLite
// writer, a server catching up) one can miss that bound once or twice: that
// is no reason for a process to exit. A statement that ran out of its own
// time is sent again, for about one lease TTL in all; any other error, or
// the end of ctx, ends the start at once.
func (n *Node) firstTake(ctx context.Context, k *leaseKeeper) error {
	tries := max(2, int(k.ttl/max(k.heartbeat/2, 100*time.Millisecond)))
	for try := 1; ; try++ {
		err := k.tick(ctx)
		if err == nil || try >= tries || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		n.log.Warn("taking the first bucket leases ran out of time; trying again",
			zap.Int("try", try), zap.Int("of", tries), zap.Error(err))
	}
}

// startLoops starts the background loops. The completer runs before the
// claim loop so that no outcome waits for it, and the subscription is taken
// before the claim loop's first pass so that no announcement falls between
// the two.
func (n *Node) startLoops() {
	ctx, c := n.runCtx, n.cfg
	must := func(err error) {
		if err != nil {
			// Each loop is new here; a second start is a bug in this file.
			panic(err)
		}
	}
	must(n.completer.loop.start(ctx, n.completer.run))
	if nt, ok := n.store.(store.Notifier); ok {
		sub := n.subscribe(ctx, nt)
		must(n.listenLoop.start(ctx, func(ctx context.Context) { n.listen(ctx, nt, sub) }))
	}
	// The lease loop ticks once at once: a bucket released between Start's
	// first tick and the subscription above is then taken now, not a
	// heartbeat later.
	// A failed renewal is tried again after a third of a heartbeat, not a
	// whole one: with the default heartbeat of TTL/3 a node would get only
	// two tries before its local deadline, and on a loaded machine (a busy
	// SQLite file, a slow server) two slow statements in a row would cost
	// it its buckets.
	retry := max(c.BucketLeaseHeartbeat/3, 100*time.Millisecond)
	must(n.leaseLoop.start(ctx, func(ctx context.Context) {
		paced(ctx, c.Clock, n.leaseLoop.wake, func(ctx context.Context) time.Duration {
			defer n.leasePasses.Add(1)
			if n.keeper.tick(ctx) != nil { // the keeper logs a failure, and serves until its deadline
				return retry
			}
			n.balancer.pass(ctx)
			return c.BucketLeaseHeartbeat
		})
	}))
	must(n.heartbeatLoop.start(ctx, func(ctx context.Context) {
		every(ctx, c.Clock, c.BucketLeaseHeartbeat, n.heartbeatLoop.wake, false, n.heartbeat)
	}))
	must(n.renewer.loop.start(ctx, n.renewer.run))
	must(n.handoffs.loop.start(ctx, n.handoffs.run))
	must(n.claimLoop.start(ctx, func(ctx context.Context) {
		every(ctx, c.Clock, c.PollInterval, n.claimLoop.wake, true, n.claimPass)
	}))
	must(n.rescuer.loop.start(ctx, n.rescuer.run))
	must(n.pruner.loop.start(ctx, n.pruner.run))
	// From boot, not from the first claim (DESIGN invariant 8): a command
	// is never left waiting for this node to have had work.
	must(n.commander.loop.start(ctx, n.commander.run))
	must(n.scheduleLoop.start(ctx, func(ctx context.Context) {
		paced(ctx, c.Clock, n.scheduleLoop.wake, func(ctx context.Context) time.Duration {
			n.schedulePass(ctx)
			return n.scheduleWait(ctx)
		})
	}))
	must(n.limitLoop.start(ctx, func(ctx context.Context) {
		every(ctx, c.Clock, c.BucketLeaseHeartbeat, n.limitLoop.wake, false, n.limitPass)
	}))
	must(n.shareLoop.start(ctx, func(ctx context.Context) {
		every(ctx, c.Clock, min(c.BucketLeaseHeartbeat, shareRenewal), n.shareLoop.wake, false, n.sharePass)
	}))
}

// defaultJitter draws uniformly from [0, ceiling].
func defaultJitter(ceiling time.Duration) time.Duration {
	switch {
	case ceiling <= 0:
		return 0
	case ceiling == math.MaxInt64:
		return time.Duration(rand.Int64N(int64(ceiling)))
	}
	return time.Duration(rand.Int64N(int64(ceiling) + 1))
}

// heartbeat tells the fleet this incarnation is alive.
func (n *Node) heartbeat(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, n.stmtTimeout)
	defer cancel()
	err := n.store.HeartbeatNode(ctx, n.incarnation, n.cfg.BucketLeaseTTL)
	switch {
	case err == nil:
	case errors.Is(err, store.ErrNotFound):
		n.log.Error("node heartbeat refused: this incarnation is no longer the registered one "+
			"(another process took the node id after this one's liveness lapsed)", zap.Error(err))
	default:
		n.log.Warn("node heartbeat failed", zap.Error(err))
	}
}

// Registration states, for registration.
const (
	regStarting = iota // registered, not yet serving: handed nothing
	regServing
	regLeaving
)

// registration is what the node registers: its declaration, kinds and
// version, whether it balances and whether it is leaving. A node that is
// still starting registers as one that does not balance, so that no node
// hands it a bucket before its loops run, where it would wait unclaimed:
// Start registers it as balancing once they do.
func (n *Node) registration(state int) store.NodeInfo {
	return store.NodeInfo{
		ID: n.id, Incarnation: n.incarnation, Buckets: n.declared, Kinds: n.kinds, Version: n.cfg.Version,
		Balance: !n.cfg.NoBalance && state != regStarting, Leaving: state == regLeaving,
	}
}

// stopRegistration marks the incarnation stopped, on its own short timeout
// so that a cancelled caller cannot skip it.
func (n *Node) stopRegistration(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := n.store.StopNode(ctx, n.incarnation); err != nil {
		n.log.Warn("marking the node stopped failed; its liveness will lapse", zap.Error(err))
	}
}

// warm warms the store, if it is a store.Warmer, in a goroutine of its
// own; the channel closes when it is done. A failure is a warning: the
// node starts cold. A warm-up cut short by its context (a start that
// failed or was abandoned) is not one.
func (n *Node) warm(ctx context.Context) <-chan struct{} {
	done := make(chan struct{})
	w, ok := n.store.(store.Warmer)
	if !ok {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		began := time.Now()
		if err := w.Warm(ctx); err != nil {
			if ctx.Err() == nil {
				n.log.Warn("warming the store failed; the first tasks may start slower", zap.Error(err))
			}
			return
		}
		n.log.Info("store warmed", zap.Duration("took", time.Since(began)))
	}()
	return done
}

// bucketsAcquired is the keeper's news of buckets taken: there may be work
// waiting in them, and tasks that the previous holder left running, which
// the new epoch has fenced and which are rescued at once.
func (n *Node) bucketsAcquired(hs []store.HeldBucket) {
	if n.limits != nil {
		n.limits.acquiredBuckets(hs)
		n.limitLoop.poke()
	}
	n.claimLoop.poke()
	n.scheduleLoop.poke()
	n.rescuer.loop.poke()
}

// bucketsLost is the keeper's news of buckets this node holds no more (lost,
// expired or handed over): the limiter forgets what it knew of them, so that
// a bucket taken again starts as on any takeover.
func (n *Node) bucketsLost(bs []int) {
	if n.limits != nil {
		n.limits.bucketsLeft(bs)
	}
	n.handoffs.loop.poke() // a hand-off of a lost bucket ends
}

// isDraining reports whether Shutdown has begun.
func (n *Node) isDraining() bool { return n.draining.Load() }
