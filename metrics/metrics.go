package metrics

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/reconcile"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// Defaults of Options.
const (
	// DefaultInterval is how often the database-backed gauges are sampled.
	DefaultInterval = 10 * time.Second
	// DefaultSampleTimeout bounds each sampling statement.
	DefaultSampleTimeout = 2 * time.Second
)

// Options configures Metrics; zero fields take their defaults.
type Options struct {
	Interval      time.Duration
	SampleTimeout time.Duration
	Logger        *zap.Logger
	// Registry receives the collectors (default: a new registry with the
	// Go runtime and process collectors).
	Registry *prometheus.Registry
}

// Metrics implements node.Metrics with Prometheus collectors, and serves
// them (it is an http.Handler: node.HealthHandler mounts it on /metrics).
type Metrics struct {
	store    store.Store
	opts     Options
	registry *prometheus.Registry
	handler  http.Handler

	claimBatch      prometheus.Histogram
	claimDuration   prometheus.Histogram
	claimErrors     prometheus.Counter
	wait            *prometheus.HistogramVec
	run             *prometheus.HistogramVec
	transitions     *prometheus.CounterVec
	completeBatch   prometheus.Histogram
	completeDur     prometheus.Histogram
	completeErrors  prometheus.Counter
	fenced          prometheus.Counter
	rescues         *prometheus.CounterVec
	acquisitions    prometheus.Counter
	losses          *prometheus.CounterVec
	renewalFailures *prometheus.CounterVec
	taskLeasesLost  prometheus.Counter
	taskLeasesBusy  prometheus.Counter
	commandLatency  *prometheus.HistogramVec
	firingLag       prometheus.Histogram
	fired           prometheus.Counter
	missedTicks     prometheus.Counter
	sampleErrors    prometheus.Counter
	limitRunning    *prometheus.GaugeVec
	limitClosed     *prometheus.GaugeVec
	limitShare      *prometheus.GaugeVec
	limitClosures   *prometheus.CounterVec
	pruned          *prometheus.CounterVec
	pruneErrors     prometheus.Counter
	handlers        *prometheus.GaugeVec
	handlerDur      *prometheus.HistogramVec
	handoffs        *prometheus.CounterVec
	handoffDuration prometheus.Histogram

	mu     sync.Mutex
	node   *node.Node
	sample sample
	// limitNames is the limits whose gauges are set.
	limitNames map[string]bool

	cancel context.CancelFunc
	done   chan struct{}
}

// sample is the last reading of the database-backed gauges.
type sample struct {
	at                      time.Time // zero before the first
	queued, waiting, active int
	oldestDueAge            time.Duration
	unheld                  int
}

var (
	_ node.Metrics        = (*Metrics)(nil)
	_ node.LimitMetrics   = (*Metrics)(nil)
	_ node.HandoffMetrics = (*Metrics)(nil)
)

// New makes the collectors and registers them. Give the result to
// node.Config.Metrics, then Watch the node once it is made.
func New(s store.Store, opts Options) (*Metrics, error) {
	if opts.Interval < 0 || opts.SampleTimeout < 0 {
		return nil, errors.New("metrics options: Interval and SampleTimeout must be positive (or zero for the default)")
	}
	if opts.Interval == 0 {
		opts.Interval = DefaultInterval
	}
	if opts.SampleTimeout == 0 {
		opts.SampleTimeout = DefaultSampleTimeout
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	reg := opts.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	m := &Metrics{store: s, opts: opts, registry: reg}
	const ns = "flotilla"
	// Batches go up to 1,000 (the node's claim and completion bounds).
	batches := prometheus.ExponentialBuckets(1, 4, 6)
	stmt := prometheus.ExponentialBuckets(0.0005, 4, 9)
	waits := prometheus.ExponentialBuckets(0.005, 4, 11)
	m.claimBatch = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "claim_batch_size",
		Help: "Tasks started by one claim statement.", Buckets: batches})
	m.claimDuration = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "claim_duration_seconds",
		Help: "Time of one claim statement.", Buckets: stmt})
	m.claimErrors = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "claim_errors_total",
		Help: "Claim statements that failed."})
	m.wait = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "task_wait_seconds",
		Help: "Time from a task's due time to the start of its attempt, by kind.", Buckets: waits}, []string{"kind"})
	m.run = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "task_run_seconds",
		Help: "Time from an attempt's start to its handler's return, by kind and the state it led to.", Buckets: waits},
		[]string{"kind", "outcome"})
	m.transitions = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "transitions_total",
		Help: "Task state changes this node wrote, by from and to state. Claims count as from=\"queued\"."},
		[]string{"from", "to"})
	m.completeBatch = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "completion_batch_size",
		Help: "Outcomes written by one completion statement.", Buckets: batches})
	m.completeDur = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "completion_duration_seconds",
		Help: "Time of one completion statement.", Buckets: stmt})
	m.completeErrors = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "completion_errors_total",
		Help: "Completion statements that failed (retried)."})
	m.fenced = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "fenced_outcomes_total",
		Help: "Outcomes refused because their attempt had been superseded."})
	m.rescues = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "rescues_total",
		Help: "Expired tasks found by the reconcile passes, by what became of them."}, []string{"outcome"})
	m.acquisitions = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "bucket_lease_acquisitions_total",
		Help: "Bucket leases taken, or taken again under a new epoch."})
	m.losses = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "bucket_lease_losses_total",
		Help: "Bucket leases lost: taken by another node, or past their local deadline without a renewal."},
		[]string{"cause"})
	m.renewalFailures = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "lease_renewal_failures_total",
		Help: "Lease renewal statements that failed, by lease (bucket or task)."}, []string{"lease"})
	m.taskLeasesLost = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "task_leases_lost_total",
		Help: "Task leases a renewal found lost: the task was rescued, or its bucket moved on."})
	m.taskLeasesBusy = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "task_leases_busy_total",
		Help: "Task leases not renewed in one pass because another transaction held their row."})
	m.commandLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "command_delivery_seconds",
		Help: "Time from a command's issue to its application by the task's node.", Buckets: stmt}, []string{"command"})
	m.firingLag = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "schedule_firing_lag_seconds",
		Help: "How late a schedule's tick fired, by the database clock.", Buckets: stmt})
	m.fired = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "schedule_firings_total",
		Help: "Schedule ticks fired."})
	m.missedTicks = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "schedule_missed_ticks_total",
		Help: "Schedule ticks skipped because nobody served their bucket in time."})
	m.sampleErrors = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "sample_errors_total",
		Help: "Samples of the database-backed gauges that failed."})
	m.limitRunning = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "limit_running",
		Help: "Tasks of a limit's kind running in this node's buckets, by limit (at the last refresh of the limits)."},
		[]string{"limit"})
	m.limitClosed = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "limit_closed_keys",
		Help: "Limit keys a per-key limit holds closed on this node now: their queued tasks wait, by limit."},
		[]string{"limit"})
	m.limitShare = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "limit_share",
		Help: "This node's share of a fleet-wide limit, by limit."}, []string{"limit"})
	m.limitClosures = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "limit_closures_total",
		Help: "Times a limit closed a limit key that was open at the refresh before, by limit."}, []string{"limit"})
	m.handoffs = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "bucket_handoffs_total",
		Help: "Hand-offs of this node's buckets to other nodes that ended, by outcome: handed, called_off " +
			"(balance kept the bucket here after all), lost (the lease was lost first)."}, []string{"outcome"})
	m.handoffDuration = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "bucket_handoff_seconds",
		Help: "Time from the start of a bucket's hand-off (no more claims there) to its end, for every outcome: " +
			"mostly the wait for the tasks running there.", Buckets: stmt})
	m.pruned = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "tasks_pruned_total",
		Help: "Finished tasks removed by retention, by final state."}, []string{"status"})
	m.pruneErrors = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "prune_errors_total",
		Help: "Retention batches that failed (a bucket lost meanwhile is not counted)."})
	m.handlers = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "handlers_running",
		Help: "Handlers running now on this node, by kind (counted by Middleware)."}, []string{"kind"})
	m.handlerDur = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "handler_duration_seconds",
		Help:    "Time a handler ran, by kind and by what it returned: ok, error, paused or panic (counted by Middleware).",
		Buckets: waits}, []string{"kind", "result"})
	err := errors.Join(
		reg.Register(m.handlers), reg.Register(m.handlerDur),
		reg.Register(m.limitRunning), reg.Register(m.limitClosed), reg.Register(m.limitShare),
		reg.Register(m.limitClosures),
		reg.Register(m.claimBatch), reg.Register(m.claimDuration), reg.Register(m.claimErrors),
		reg.Register(m.wait), reg.Register(m.run), reg.Register(m.transitions),
		reg.Register(m.completeBatch), reg.Register(m.completeDur), reg.Register(m.completeErrors),
		reg.Register(m.fenced), reg.Register(m.rescues), reg.Register(m.acquisitions), reg.Register(m.losses),
		reg.Register(m.renewalFailures), reg.Register(m.taskLeasesLost), reg.Register(m.taskLeasesBusy),
		reg.Register(m.commandLatency), reg.Register(m.firingLag), reg.Register(m.fired),
		reg.Register(m.missedTicks), reg.Register(m.sampleErrors), reg.Register(gauges{m}),
		reg.Register(m.pruned), reg.Register(m.pruneErrors), reg.Register(m.handoffs), reg.Register(m.handoffDuration),
	)
	if err != nil {
		return nil, err
	}
	// Series that exist from the start, at zero, so that rate() and the
	// alert rules see them before the first event.
	for _, lease := range []string{"bucket", "task"} {
		m.renewalFailures.WithLabelValues(lease)
	}
	for _, o := range []reconcile.Outcome{reconcile.OutcomeRetried, reconcile.OutcomeLost, reconcile.OutcomeStopped,
		reconcile.OutcomePaused, reconcile.OutcomeConflict, reconcile.OutcomeFenced, reconcile.OutcomeRefused,
		reconcile.OutcomeBusy, reconcile.OutcomeInUse, reconcile.OutcomeFailed} {
		m.rescues.WithLabelValues(string(o))
	}
	for _, cause := range []string{"taken", "expired"} {
		m.losses.WithLabelValues(cause)
	}
	for _, outcome := range []string{node.HandoffDone, node.HandoffCalledOff, node.HandoffLost} {
		m.handoffs.WithLabelValues(outcome)
	}
	m.handler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	return m, nil
}

// ServeHTTP serves the registry in Prometheus's text format.
func (m *Metrics) ServeHTTP(w http.ResponseWriter, r *http.Request) { m.handler.ServeHTTP(w, r) }

// Registry returns the registry the collectors are in.
func (m *Metrics) Registry() *prometheus.Registry { return m.registry }

// Watch names the node whose in-memory state (buckets held, attempts
// running) the gauges read at scrape time, and whose held buckets the
// sampler reads the backlog of.
//
// Watch, Start and Stop do nothing on a nil *Metrics, so that a process that
// exports no metrics needs no branch around them.
func (m *Metrics) Watch(n *node.Node) {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.node = n
	m.mu.Unlock()
}

// Claimed implements node.Metrics.
func (m *Metrics) Claimed(started []*task.Task, took time.Duration, err error) {
	if err != nil {
		m.claimErrors.Inc()
		return
	}
	m.claimDuration.Observe(took.Seconds())
	m.claimBatch.Observe(float64(len(started)))
	for _, t := range started {
		m.transitions.WithLabelValues(string(task.Queued), string(task.Running)).Inc()
		if !t.StartedAt.IsZero() && !t.RunAt.IsZero() {
			m.wait.WithLabelValues(t.Kind).Observe(max(t.StartedAt.Sub(t.RunAt), 0).Seconds())
		}
	}
}

// Flushed implements node.Metrics.
func (m *Metrics) Flushed(done []node.Finished, took time.Duration, err error) {
	if err != nil {
		m.completeErrors.Inc()
		return
	}
	m.completeDur.Observe(took.Seconds())
	m.completeBatch.Observe(float64(len(done)))
	for _, f := range done {
		if f.Fenced {
			m.fenced.Inc()
			continue
		}
		m.transitions.WithLabelValues(string(f.From), string(f.To)).Inc()
		m.run.WithLabelValues(f.Kind, string(f.To)).Observe(max(f.Ran, 0).Seconds())
	}
}

// TaskLeasesRenewed implements node.Metrics.
func (m *Metrics) TaskLeasesRenewed(_, busy, lost int, err error) {
	if err != nil {
		m.renewalFailures.WithLabelValues("task").Inc()
		return
	}
	m.taskLeasesBusy.Add(float64(busy))
	m.taskLeasesLost.Add(float64(lost))
}

// BucketLeasesTicked implements node.Metrics.
func (m *Metrics) BucketLeasesTicked(acquired, lost int, err error) {
	if err != nil {
		m.renewalFailures.WithLabelValues("bucket").Inc()
		return
	}
	m.acquisitions.Add(float64(acquired))
	m.losses.WithLabelValues("taken").Add(float64(lost))
}

// HandoffEnded implements node.HandoffMetrics.
func (m *Metrics) HandoffEnded(outcome string, took time.Duration) {
	m.handoffs.WithLabelValues(outcome).Inc()
	m.handoffDuration.Observe(took.Seconds())
}

// BucketLeasesExpired implements node.Metrics.
func (m *Metrics) BucketLeasesExpired(lost int) {
	m.losses.WithLabelValues("expired").Add(float64(lost))
}

// Rescued implements node.Metrics.
func (m *Metrics) Rescued(rep reconcile.Report) {
	for _, e := range rep.Entries {
		m.rescues.WithLabelValues(string(e.Outcome)).Inc()
		if e.To != "" && e.From != "" && moved(e.Outcome) {
			m.transitions.WithLabelValues(string(e.From), string(e.To)).Inc()
		}
	}
}

// moved reports whether a rescue outcome wrote a transition.
func moved(o reconcile.Outcome) bool {
	switch o {
	case reconcile.OutcomeRetried, reconcile.OutcomeLost, reconcile.OutcomeStopped, reconcile.OutcomePaused:
		return true
	}
	return false
}

// CommandApplied implements node.Metrics.
func (m *Metrics) CommandApplied(kind string, latency time.Duration) {
	m.commandLatency.WithLabelValues(kind).Observe(max(latency, 0).Seconds())
}

// LimitsRefreshed implements node.LimitMetrics. The gauges of a limit that
// no longer names one of the node's kinds are removed.
func (m *Metrics) LimitsRefreshed(uses []node.LimitUse) {
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := map[string]bool{}
	for _, u := range uses {
		seen[u.Limit] = true
		m.limitRunning.WithLabelValues(u.Limit).Set(float64(u.Running))
		m.limitClosures.WithLabelValues(u.Limit).Add(float64(u.Closures))
		if u.Per == store.PerFleet {
			m.limitShare.WithLabelValues(u.Limit).Set(float64(u.Share))
		} else {
			m.limitClosed.WithLabelValues(u.Limit).Set(float64(u.ClosedKeys))
		}
	}
	for name := range m.limitNames {
		if !seen[name] {
			m.limitRunning.DeleteLabelValues(name)
			m.limitClosed.DeleteLabelValues(name)
			m.limitShare.DeleteLabelValues(name)
		}
	}
	m.limitNames = seen
}

// ScheduleAdvanced implements node.Metrics.
func (m *Metrics) ScheduleAdvanced(fired bool, lag time.Duration, missed int) {
	if fired {
		m.fired.Inc()
		m.firingLag.Observe(max(lag, 0).Seconds())
	}
	m.missedTicks.Add(float64(missed))
}

// Pruned implements node.Metrics.
func (m *Metrics) Pruned(_ int, res store.PruneResult, err error) {
	switch {
	case errors.Is(err, store.ErrFenced):
	case err != nil:
		m.pruneErrors.Inc()
	}
	for st, c := range res.ByStatus {
		m.pruned.WithLabelValues(string(st)).Add(float64(c.Tasks))
	}
}
