package node

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"time"
	"unicode"

	"log/slog"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/clock"
	"github.com/flotilla-dev/flotilla/internal/zapslog"
	"github.com/flotilla-dev/flotilla/schedule"
	"github.com/flotilla-dev/flotilla/store"
)

// Defaults of Config. A zero field takes its default; a negative one is
// refused.
const (
	// DefaultConcurrency is how many handlers a node runs at once.
	DefaultConcurrency = 100
	// DefaultBucketLeaseTTL is how long a bucket lease lasts without a
	// renewal: how long a dead node's buckets wait for a successor.
	DefaultBucketLeaseTTL = 15 * time.Second
	// DefaultTaskLeaseTTL is how long a running task's lease lasts without a
	// renewal; renewals run every TTL/3.
	DefaultTaskLeaseTTL = 30 * time.Second
	// DefaultShutdownTimeout is how long a graceful shutdown waits for
	// running handlers before it cancels them and releases their tasks.
	DefaultShutdownTimeout = 30 * time.Second
	// DefaultPollInterval is how often the claim loop looks for work when no
	// notification has woken it. Each poll is one claim statement that uses
	// a partial index, so a second is cheap and bounds the delay when a
	// notification is missed (or the store has none).
	DefaultPollInterval = 1 * time.Second
	// DefaultMaxAttempts is the number of attempts of a task submitted
	// without MaxAttempts; the store applies it.
	DefaultMaxAttempts = store.DefaultMaxAttempts
	// DefaultBackoffBase is the retry delay scale: attempt n waits a random
	// time up to base × 2^(n-1).
	DefaultBackoffBase = 1 * time.Second
	// DefaultBackoffMax caps the retry delay.
	DefaultBackoffMax = 10 * time.Minute
	// DefaultCommandPoll is how often the node reads its pending commands
	// when no notification has woken it: the delay of a stop whose
	// notification was missed.
	DefaultCommandPoll = 1 * time.Second
	// DefaultSchedulePoll is how soon the node looks again for due
	// schedules when one is due that it could not fire, or a read failed.
	DefaultSchedulePoll = 250 * time.Millisecond
	// DefaultStopGrace is how long a stopped handler has to return after
	// its context is cancelled before the node abandons it.
	DefaultStopGrace = 10 * time.Second
	// DefaultPruneInterval is how often, on average, the node prunes the
	// finished tasks of the buckets it holds (Config.Retention).
	DefaultPruneInterval = time.Minute
	// DefaultPruneBatch is the most tasks one prune statement removes.
	DefaultPruneBatch = store.DefaultPruneBatch
	// DefaultHandoffTimeout is how long a node handing a bucket to another
	// lets the handlers it runs there finish.
	DefaultHandoffTimeout = 30 * time.Second
)

// Config configures a Node. Build it with the zero values you do not care
// about; New fills in the defaults and refuses what cannot work, naming the
// field.
type Config struct {
	// NodeID names the process in leases, logs and `worker nodes`. Default:
	// "<hostname>-<pid>-<4 random hex digits>". Two live processes may not
	// share one.
	NodeID string

	// Buckets are the buckets this node declares: it holds their leases
	// when it can, and serves only those. AllBuckets declares every bucket
	// of the fleet instead, whatever its count; exactly one of the two must
	// be given. An empty Buckets is never read as "every bucket", so that a
	// set that came out empty by mistake is refused rather than taking over
	// the fleet.
	Buckets    bucket.Set
	AllBuckets bool

	// NumBuckets is the fleet's bucket count as this node expects it. Zero
	// takes the fleet's; any other count that differs from the fleet's
	// refuses to start (*store.BucketCountError): the count is fixed for
	// the life of a fleet, and a node hashing keys with another would route
	// them to the wrong buckets.
	NumBuckets int

	// Concurrency is the number of handlers run at once (DefaultConcurrency).
	Concurrency int

	// BucketLeaseTTL is the bucket lease duration (DefaultBucketLeaseTTL),
	// also used as the node's liveness TTL. BucketLeaseHeartbeat is how
	// often leases and liveness are renewed (default TTL/3); it must be
	// below the TTL.
	BucketLeaseTTL       time.Duration
	BucketLeaseHeartbeat time.Duration

	// TaskLeaseTTL is the task lease duration (DefaultTaskLeaseTTL); the
	// leases of running tasks are renewed every TTL/3.
	TaskLeaseTTL time.Duration

	// ShutdownTimeout is how long Shutdown lets running handlers finish
	// (DefaultShutdownTimeout).
	ShutdownTimeout time.Duration

	// PollInterval is the claim loop's fallback period (DefaultPollInterval).
	PollInterval time.Duration

	// ReconcileInterval is how often the node looks for expired tasks in
	// the buckets it holds, to rescue them (default TaskLeaseTTL: a task
	// lease that ran out is found within one more TTL). Tasks that a
	// takeover fenced are rescued at once, not at the next interval.
	ReconcileInterval time.Duration

	// BackoffBase and BackoffMax shape the delay before a failed attempt is
	// retried: full jitter, a random delay between 0 and
	// min(BackoffMax, BackoffBase × 2^(attempt-1)).
	BackoffBase time.Duration
	BackoffMax  time.Duration

	// CommandPoll is how often the node reads the commands for the tasks
	// it runs when no notification woke it (DefaultCommandPoll). It polls
	// from Start, whether or not it runs anything yet.
	CommandPoll time.Duration

	// StopGrace is how long a handler whose task was stopped may take to
	// return (DefaultStopGrace); after it, the task is recorded stopped and
	// the handler abandoned: whatever it writes later is fenced.
	StopGrace time.Duration

	// Schedules are declared by the application: each is created, or its
	// definition updated, when the node starts (a schedule an operator has
	// paused stays paused). Whichever node holds a schedule's bucket fires
	// it, whether or not that node declared it.
	Schedules []schedule.Definition

	// SchedulePoll is how soon the node looks again for due schedules in
	// the buckets it holds when one is due that it could not fire, or a
	// read failed (DefaultSchedulePoll); otherwise it sleeps until the next
	// tick, at most half ScheduleMisfire, and a schedule's change wakes it.
	// ScheduleMisfire is how late a
	// tick may be and still fire as on time (schedule.DefaultMisfire); an
	// older tick was missed, and its schedule's catch-up policy decides. It
	// must exceed SchedulePoll.
	SchedulePoll    time.Duration
	ScheduleMisfire time.Duration

	// Limits are declared by the application: each is created, or its rule
	// replaced, when the node starts, like Schedules; `worker limit set`
	// changes them too. Every node reads the fleet's limits at start and at
	// every heartbeat.
	Limits []store.Limit

	// Capacity is what the node has of each named resource (gpu=1,
	// mem=8): it starts a task only when what is free covers what the
	// task needs. A node without one starts no task that needs anything.
	Capacity store.Resources

	// Retention is how long finished tasks, their events and their
	// acknowledged commands are kept, per final state and per kind; the
	// states it leaves out keep store.DefaultAges, and an age of 0 keeps
	// forever (store.KeepForever keeps everything). The node prunes the
	// buckets it holds, and only those.
	Retention store.Retention
	// PruneInterval is the mean time between two retention passes
	// (DefaultPruneInterval); each wait is drawn between half and one and a
	// half of it. PruneBatch is the most tasks one prune statement removes
	// (DefaultPruneBatch, at most store.MaxPruneBatch).
	PruneInterval time.Duration
	PruneBatch    int

	// NoBalance opts the node out of balancing. By default a node shares
	// the buckets it declares with the other balancing nodes that declare
	// them: every node computes the same assignment (package balance), and
	// a bucket moves from its holder to its target by a live hand-off. A
	// node with NoBalance holds every bucket it declares that no live node
	// holds, and is given, and gives away, only what an operator pins
	// (`worker buckets move`), as nodes did before balancing.
	NoBalance bool
	// HandoffTimeout is how long a node handing a bucket to another (for
	// balance, a pin, or at Shutdown) lets the handlers it runs there finish
	// (DefaultHandoffTimeout); it then cancels them (ErrHandingOff), their
	// tasks go back to queued, no attempt counted, and the bucket moves.
	HandoffTimeout time.Duration

	// Executor runs handlers (default GoroutineExecutor).
	Executor Executor

	// Clock drives every local timer: lease deadlines, loops, task timeouts
	// and the shutdown timeout (default clock.Real). Lease expiry and due
	// times are the database's.
	Clock clock.Clock

	// Slog receives every log line, with the node id added: an application
	// that logs with log/slog gives its logger here (default: none).
	// Logger does the same for one that logs with zap, as the worker
	// binary does; give at most one of the two.
	Slog   *slog.Logger
	Logger *zap.Logger

	// Middleware wraps every handler the node runs, the first outermost
	// (see Middleware): logging (LogAttempts), metrics (package metrics),
	// traces (package otel). The node runs the whole chain inside Recover.
	Middleware []Middleware

	// Version is recorded with the node, for `worker nodes`.
	Version string

	// Metrics receives what the node learns as it works (default: none);
	// package metrics exports it to Prometheus.
	Metrics Metrics
}

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	if c.NodeID == "" {
		c.NodeID = defaultNodeID()
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.BucketLeaseTTL == 0 {
		c.BucketLeaseTTL = DefaultBucketLeaseTTL
	}
	if c.BucketLeaseHeartbeat == 0 {
		c.BucketLeaseHeartbeat = c.BucketLeaseTTL / 3
	}
	if c.TaskLeaseTTL == 0 {
		c.TaskLeaseTTL = DefaultTaskLeaseTTL
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.ReconcileInterval == 0 {
		c.ReconcileInterval = c.TaskLeaseTTL
	}
	if c.BackoffBase == 0 {
		c.BackoffBase = DefaultBackoffBase
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = max(DefaultBackoffMax, c.BackoffBase)
	}
	if c.CommandPoll == 0 {
		c.CommandPoll = DefaultCommandPoll
	}
	if c.StopGrace == 0 {
		c.StopGrace = DefaultStopGrace
	}
	if c.SchedulePoll == 0 {
		c.SchedulePoll = DefaultSchedulePoll
	}
	if c.ScheduleMisfire == 0 {
		c.ScheduleMisfire = schedule.DefaultMisfire
	}
	c.Retention = c.Retention.WithDefaults()
	if c.PruneInterval == 0 {
		c.PruneInterval = DefaultPruneInterval
	}
	if c.PruneBatch == 0 {
		c.PruneBatch = DefaultPruneBatch
	}
	if c.HandoffTimeout == 0 {
		c.HandoffTimeout = DefaultHandoffTimeout
	}
	if c.Executor == nil {
		c.Executor = GoroutineExecutor{}
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Logger == nil && c.Slog == nil {
		c.Logger = zap.NewNop()
	}
	if c.Metrics == nil {
		c.Metrics = nopMetrics{}
	}
	return c
}

// validate refuses a configuration a node cannot run with. It expects
// withDefaults to have been applied, so a zero duration here was asked for
// explicitly only where the default derives from another field.
func (c Config) validate() error {
	positive := []struct {
		field string
		value time.Duration
	}{
		{"BucketLeaseTTL", c.BucketLeaseTTL},
		{"BucketLeaseHeartbeat", c.BucketLeaseHeartbeat},
		{"TaskLeaseTTL", c.TaskLeaseTTL},
		{"ShutdownTimeout", c.ShutdownTimeout},
		{"PollInterval", c.PollInterval},
		{"ReconcileInterval", c.ReconcileInterval},
		{"BackoffBase", c.BackoffBase},
		{"BackoffMax", c.BackoffMax},
		{"CommandPoll", c.CommandPoll},
		{"StopGrace", c.StopGrace},
		{"SchedulePoll", c.SchedulePoll},
		{"ScheduleMisfire", c.ScheduleMisfire},
		{"PruneInterval", c.PruneInterval},
		{"HandoffTimeout", c.HandoffTimeout},
	}
	for _, p := range positive {
		if p.value <= 0 {
			return fmt.Errorf("node config: %s is %v; it must be positive (or zero for the default)", p.field, p.value)
		}
	}
	switch {
	case strings.TrimSpace(c.NodeID) != c.NodeID || strings.ContainsAny(c.NodeID, " \t\r\n/") ||
		strings.ContainsFunc(c.NodeID, unicode.IsControl):
		return fmt.Errorf("node config: NodeID %q contains whitespace, a control character or '/'; "+
			"use letters, digits, '-', '_' or '.'", c.NodeID)
	case c.Concurrency < 0:
		return fmt.Errorf("node config: Concurrency is %d; it must be positive (or zero for %d)",
			c.Concurrency, DefaultConcurrency)
	case c.BucketLeaseHeartbeat >= c.BucketLeaseTTL:
		return fmt.Errorf("node config: BucketLeaseHeartbeat %v is not below BucketLeaseTTL %v; "+
			"leases would lapse between renewals (the default heartbeat is TTL/3)",
			c.BucketLeaseHeartbeat, c.BucketLeaseTTL)
	case c.BucketLeaseTTL <= deadlineMargin(c.BucketLeaseTTL):
		return fmt.Errorf("node config: BucketLeaseTTL %v leaves no time inside the safety margin of %v",
			c.BucketLeaseTTL, deadlineMargin(c.BucketLeaseTTL))
	case c.TaskLeaseTTL/3 <= 0:
		return fmt.Errorf("node config: TaskLeaseTTL %v is too short to renew every TTL/3", c.TaskLeaseTTL)
	case c.PruneBatch < 0 || c.PruneBatch > store.MaxPruneBatch:
		return fmt.Errorf("node config: PruneBatch is %d; want 1 to %d (or zero for %d)",
			c.PruneBatch, store.MaxPruneBatch, DefaultPruneBatch)
	case c.Retention.Check() != nil:
		return fmt.Errorf("node config: Retention: %w", c.Retention.Check())
	case c.checkSchedules() != nil:
		return c.checkSchedules()
	case c.checkLimits() != nil:
		return c.checkLimits()
	case c.ScheduleMisfire <= c.SchedulePoll:
		return fmt.Errorf("node config: ScheduleMisfire %v is not above SchedulePoll %v; "+
			"ticks fired on time would count as missed", c.ScheduleMisfire, c.SchedulePoll)
	case c.BackoffMax < c.BackoffBase:
		return fmt.Errorf("node config: BackoffMax %v is below BackoffBase %v", c.BackoffMax, c.BackoffBase)
	case c.Slog != nil && c.Logger != nil:
		return fmt.Errorf("node config: both Slog and Logger are set; give the one your application logs with")
	case c.AllBuckets && !c.Buckets.Empty():
		return fmt.Errorf("node config: both AllBuckets and Buckets %q are set; give one of them", c.Buckets)
	case !c.AllBuckets && c.Buckets.Empty():
		return fmt.Errorf("node config: Buckets is empty; declare buckets like %q, or set AllBuckets",
			"0-31,40,42-45")
	}
	return nil
}

// logger is the zap logger the node logs through: Logger, or one that
// writes to Slog's handler.
func (c Config) logger() *zap.Logger {
	if c.Slog != nil {
		return zapslog.New(c.Slog)
	}
	return c.Logger
}

// defaultNodeID is "<hostname>-<pid>-<4 random hex digits>": readable in
// `worker nodes`, and distinct for two processes that share a host and, in
// containers, a pid.
func defaultNodeID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "node"
	}
	host = strings.Map(func(r rune) rune {
		if r == '/' || r == ' ' || r < ' ' {
			return '-'
		}
		return r
	}, host)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), randomHex(2))
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	// crypto/rand.Read never fails (it panics on a broken system source).
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// ValidateConfig checks a Config as New would, without a store, so that a
// command line can refuse bad flags before it connects to anything.
func ValidateConfig(c Config) error { return c.withDefaults().validate() }

// checkSchedules refuses a declared schedule that could never be stored,
// and a name declared twice, before the node touches the store.
func (c Config) checkSchedules() error {
	one, _ := bucket.NewPolicy(1) // routing is checked at Start, against the fleet
	seen := map[string]bool{}
	for i, d := range c.Schedules {
		if _, err := d.Resolve(one, time.Unix(0, 0)); err != nil {
			return fmt.Errorf("node config: Schedules[%d]: %w", i, err)
		}
		if seen[d.Name] {
			return fmt.Errorf("node config: Schedules[%d]: schedule %q is declared twice", i, d.Name)
		}
		seen[d.Name] = true
	}
	return nil
}

// checkLimits refuses a declared limit or capacity no store could keep.
func (c Config) checkLimits() error {
	seen := map[string]bool{}
	for i, l := range c.Limits {
		if err := store.CheckLimit(l); err != nil {
			return fmt.Errorf("node config: Limits[%d]: %w", i, err)
		}
		if seen[l.Name] {
			return fmt.Errorf("node config: Limits[%d]: limit %q is declared twice", i, l.Name)
		}
		seen[l.Name] = true
	}
	if err := store.CheckResources("capacity", c.Capacity); err != nil {
		return fmt.Errorf("node config: Capacity: %w", err)
	}
	return nil
}
