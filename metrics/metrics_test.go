package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/flotilla-dev/flotilla/commands"
	"github.com/flotilla-dev/flotilla/internal/patience"
	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/metrics"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/postgres"
	"github.com/flotilla-dev/flotilla/task"
)

const numBuckets = 8

type testBundle struct {
	ctx   context.Context
	store *postgres.Store
	m     *metrics.Metrics
	node  *node.Node
	url   string
}

// setup runs one node on a fresh PostgreSQL database, with its metrics on
// /metrics of an HTTP server, as `worker run --http` serves them.
func setup(t *testing.T) *testBundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	dsn := testdb.New(t)
	s, err := postgres.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if _, err := s.Migrate(ctx, numBuckets); err != nil {
		t.Fatal(err)
	}
	// The sampler is driven by the test (Sample), not by its period.
	m, err := metrics.New(s, metrics.Options{Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.New(s, node.Config{
		NodeID: "metrics-test", AllBuckets: true, Metrics: m, PollInterval: 50 * time.Millisecond,
		CommandPoll: 50 * time.Millisecond, BackoffBase: time.Millisecond,
		Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
	})
	if err != nil {
		t.Fatal(err)
	}
	n.Register("ok", func(context.Context, *task.Task) error { return nil })
	n.Register("fail", func(context.Context, *task.Task) error { return errors.New("boom") })
	n.Register("block", func(ctx context.Context, _ *task.Task) error {
		<-ctx.Done()
		return context.Cause(ctx)
	})
	m.Watch(n)
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Shutdown(context.Background()) })
	srv := httptest.NewServer(node.HealthHandler(n))
	t.Cleanup(srv.Close)
	return &testBundle{ctx: ctx, store: s, m: m, node: n, url: srv.URL + "/metrics"}
}

// scrape reads /metrics as Prometheus does.
func (b *testBundle) scrape(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(b.url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// value is the value of the series of name whose labels include labels
// (name=value pairs); histograms answer their sample count. ok is false
// when there is no such series.
func value(fams map[string]*dto.MetricFamily, name string, labels ...string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

// countTasks counts tasks in the database by listing them (the test's
// tables are small).
func (b *testBundle) countTasks(t *testing.T, st task.Status, kind string) int {
	t.Helper()
	ts, err := b.store.ListTasks(b.ctx, store.TaskFilter{Statuses: []task.Status{st}, Kind: kind, Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	return len(ts)
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(patience.Scale(30 * time.Second))
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30s; last: %s", what, state)
		}
		time.Sleep(20 * time.Millisecond) // poll interval, not a wait for a condition
	}
}

func TestScrapedValuesMatchTheDatabase(t *testing.T) {
	b := setup(t)
	submit := func(kind string, count, maxAttempts int) []*task.Task {
		var out []*task.Task
		for i := range count {
			tk, err := b.node.Submit(b.ctx, node.SubmitRequest{Kind: kind, Key: fmt.Sprintf("%s-%d", kind, i), MaxAttempts: maxAttempts})
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, tk)
		}
		return out
	}
	submit("ok", 20, 0)
	submit("fail", 5, 1)
	// Tasks of a kind no node serves stay queued in the held buckets: the
	// backlog and its oldest due task.
	orphans, err := b.store.CreateTasks(b.ctx, []store.NewTask{
		{Kind: "nobody-serves", Key: "a", Bucket: 1}, {Kind: "nobody-serves", Key: "b", Bucket: 2},
		{Kind: "nobody-serves", Key: "c", Bucket: 3},
	})
	if err != nil {
		t.Fatal(err)
	}

	eventually(t, "the transitions scraped equal the tasks finished in the database", func() (bool, string) {
		fams := b.scrape(t)
		ok, _ := value(fams, "flotilla_transitions_total", "from", "running", "to", "succeeded")
		failed, _ := value(fams, "flotilla_transitions_total", "from", "running", "to", "failed")
		dbOK, dbFailed := b.countTasks(t, task.Succeeded, ""), b.countTasks(t, task.Failed, "")
		return ok == 20 && failed == 5 && dbOK == 20 && dbFailed == 5,
			fmt.Sprintf("scraped %v succeeded and %v failed; database %d and %d", ok, failed, dbOK, dbFailed)
	})

	if err := b.m.Sample(b.ctx); err != nil {
		t.Fatal(err)
	}
	fams := b.scrape(t)
	leases, err := b.store.ListBuckets(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	held := 0
	for _, l := range leases {
		if l.Holder == b.node.Incarnation() {
			held++
		}
	}
	now, err := b.store.Now(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	oldest := orphans[0].RunAt
	for _, o := range orphans {
		if o.RunAt.Before(oldest) {
			oldest = o.RunAt
		}
	}
	checks := []struct {
		name   string
		labels []string
		want   float64
	}{
		{"flotilla_buckets_held", nil, float64(held)},
		{"flotilla_buckets_unheld", nil, 0},
		{"flotilla_bucket_lease_acquisitions_total", nil, float64(held)},
		{"flotilla_tasks", []string{"state", "queued"}, float64(b.countTasks(t, task.Queued, ""))},
		{"flotilla_tasks", []string{"state", "active"}, 0},
		{"flotilla_transitions_total", []string{"from", "queued", "to", "running"}, 25},
		{"flotilla_task_run_seconds", []string{"kind", "ok", "outcome", "succeeded"}, 20},
		{"flotilla_task_run_seconds", []string{"kind", "fail", "outcome", "failed"}, 5},
		{"flotilla_task_wait_seconds", []string{"kind", "ok"}, 20},
	}
	for _, c := range checks {
		got, ok := value(fams, c.name, c.labels...)
		if !ok || got != c.want {
			t.Errorf("%s%v = %v (present: %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if held != numBuckets {
		t.Errorf("the node holds %d buckets in the database, want all %d", held, numBuckets)
	}
	age, _ := value(fams, "flotilla_oldest_due_age_seconds")
	if maxAge := now.Sub(oldest).Seconds(); age <= 0 || age > maxAge {
		t.Errorf("oldest due age %vs, want in (0, %v]: the orphans have waited since %v", age, maxAge, oldest)
	}
	batches, _ := value(fams, "flotilla_claim_batch_size")
	if batches < 1 {
		t.Errorf("no claim batch observed")
	}
	for _, name := range []string{"flotilla_claim_duration_seconds", "flotilla_completion_batch_size",
		"flotilla_completion_duration_seconds", "flotilla_node_ready", "go_goroutines"} {
		if _, ok := value(fams, name); !ok {
			t.Errorf("%s is not exported", name)
		}
	}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "key" || lp.GetName() == "id" || lp.GetName() == "task" {
					t.Errorf("%s has a per-task label %s=%s", name, lp.GetName(), lp.GetValue())
				}
			}
		}
	}
}

func TestAStopsDeliveryIsTimedAndTheBucketsAreUnheldAfterShutdown(t *testing.T) {
	b := setup(t)
	tk, err := b.node.Submit(b.ctx, node.SubmitRequest{Kind: "block", Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the task runs", func() (bool, string) {
		got, err := b.store.GetTask(b.ctx, tk.ID)
		if err != nil {
			t.Fatal(err)
		}
		return got.Status == task.Running, string(got.Status)
	})
	fams := b.scrape(t)
	if got, _ := value(fams, "flotilla_attempts_active", "kind", "block"); got != 1 {
		t.Errorf("attempts active of kind block: %v, want 1", got)
	}
	if _, err := commands.Stop(b.ctx, b.store, tk.ID, "test", "metrics-test"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the task is stopped and the stop's delivery observed", func() (bool, string) {
		got, err := b.store.GetTask(b.ctx, tk.ID)
		if err != nil {
			t.Fatal(err)
		}
		n, _ := value(b.scrape(t), "flotilla_command_delivery_seconds", "command", "stop")
		return got.Status == task.Stopped && n == 1, fmt.Sprintf("task %s, %v deliveries", got.Status, n)
	})
	// The stop's note cancels the handler before the command is read, so the
	// handler's outcome may be written before the move to stopping: the
	// trail then goes from running straight to stopped.
	fams = b.scrape(t)
	viaStopping, _ := value(fams, "flotilla_transitions_total", "from", "stopping", "to", "stopped")
	direct, _ := value(fams, "flotilla_transitions_total", "from", "running", "to", "stopped")
	if viaStopping+direct != 1 {
		t.Errorf("transitions to stopped: %v from stopping and %v from running, want 1 in all", viaStopping, direct)
	}

	if err := b.node.Shutdown(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.m.Sample(b.ctx); err != nil {
		t.Fatal(err)
	}
	leases, err := b.store.ListBuckets(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	free := 0
	for _, l := range leases {
		if l.Holder == "" {
			free++
		}
	}
	if got, _ := value(b.scrape(t), "flotilla_buckets_unheld"); got != float64(free) || free != numBuckets {
		t.Errorf("buckets unheld after shutdown: scraped %v, database %d, want %d", got, free, numBuckets)
	}
}

func TestOptionsAreChecked(t *testing.T) {
	_, err := metrics.New(nil, metrics.Options{Interval: -time.Second})
	if err == nil || !strings.Contains(err.Error(), "Interval") {
		t.Errorf("a negative interval: %v, want an error naming Interval", err)
	}
}

// TestTheAlertRulesNameExportedMetrics keeps docs/alerts.rules.yml in step
// with what a node exports: a renamed metric would leave an alert that can
// never fire.
func TestTheAlertRulesNameExportedMetrics(t *testing.T) {
	b := setup(t)
	if err := b.m.Sample(b.ctx); err != nil {
		t.Fatal(err)
	}
	fams := b.scrape(t)
	rules, err := os.ReadFile("../docs/alerts.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	names := regexp.MustCompile(`\bflotilla_[a-z_]+\b`).FindAllString(string(rules), -1)
	if len(names) == 0 {
		t.Fatal("the rules name no flotilla metric")
	}
	for _, name := range names {
		if _, ok := fams[name]; !ok {
			t.Errorf("docs/alerts.rules.yml names %s, which a node does not export", name)
		}
	}
}

func TestANilMetricsDoesNothing(t *testing.T) {
	var m *metrics.Metrics
	m.Watch(nil)
	if err := m.Start(context.Background()); err != nil {
		t.Errorf("Start of a nil *Metrics: %v", err)
	}
	m.Stop()
}

func TestStartSamplesAtOnceAndStopsOnce(t *testing.T) {
	b := setup(t)
	if err := b.m.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.m.Stop)
	eventually(t, "the first sample, taken at Start", func() (bool, string) {
		_, ok := value(b.scrape(t), "flotilla_sample_age_seconds")
		return ok, "no sample yet"
	})
	if err := b.m.Start(b.ctx); err == nil || !strings.Contains(err.Error(), "started twice") {
		t.Errorf("a second Start: %v, want an error", err)
	}
	b.m.Stop()
	b.m.Stop()
}

// TestLimitGaugesFollowTheRefreshes: each refresh sets the limit gauges,
// adds its closures, and removes the gauges of a limit no longer reported.
func TestLimitGaugesFollowTheRefreshes(t *testing.T) {
	m, err := metrics.New(nil, metrics.Options{})
	if err != nil {
		t.Fatal(err)
	}
	gather := func() map[string]*dto.MetricFamily {
		fams, err := m.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]*dto.MetricFamily{}
		for _, f := range fams {
			out[f.GetName()] = f
		}
		return out
	}
	m.LimitsRefreshed([]node.LimitUse{
		{Limit: "api", Kind: "fetch", Per: store.PerKey, Running: 4, ClosedKeys: 2, Closures: 2},
		{Limit: "train", Kind: "train", Per: store.PerFleet, Running: 1, Share: 3},
	})
	m.LimitsRefreshed([]node.LimitUse{{Limit: "api", Kind: "fetch", Per: store.PerKey, Running: 2, ClosedKeys: 1, Closures: 1}})
	fams := gather()
	for _, c := range []struct {
		name, limit string
		want        float64
	}{
		{"flotilla_limit_running", "api", 2},
		{"flotilla_limit_closed_keys", "api", 1},
		{"flotilla_limit_closures_total", "api", 3},
		{"flotilla_limit_closures_total", "train", 0},
	} {
		if got, ok := value(fams, c.name, "limit", c.limit); !ok || got != c.want {
			t.Errorf("%s{limit=%q} = %v (found %v), want %v", c.name, c.limit, got, ok, c.want)
		}
	}
	for _, name := range []string{"flotilla_limit_running", "flotilla_limit_share"} {
		if got, ok := value(fams, name, "limit", "train"); ok {
			t.Errorf("%s{limit=\"train\"} = %v after the limit was no longer reported", name, got)
		}
	}
}

// TestHandOffsAndSharesAreExported: when a second node joins, the first
// hands it half its buckets, and says so: hand-offs by outcome, their
// duration, its share and what it holds.
func TestHandOffsAndSharesAreExported(t *testing.T) {
	b := setup(t)
	fams := b.scrape(t)
	if v, ok := value(fams, "flotilla_bucket_handoffs_total", "outcome", node.HandoffDone); !ok || v != 0 {
		t.Errorf("hand-offs before any: %v (present %v), want 0", v, ok)
	}
	second, err := node.New(b.store, node.Config{
		NodeID: "second", AllBuckets: true, BucketLeaseHeartbeat: 100 * time.Millisecond,
		Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = second.Shutdown(context.Background()) })
	deadline := time.Now().Add(30 * time.Second)
	for len(second.Held()) != numBuckets/2 {
		if time.Now().After(deadline) {
			t.Fatalf("the second node holds %d buckets, want %d", len(second.Held()), numBuckets/2)
		}
		time.Sleep(10 * time.Millisecond)
	}
	fams = b.scrape(t)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"flotilla_bucket_handoffs_total", []string{"outcome", node.HandoffDone}, numBuckets / 2},
		{"flotilla_bucket_handoff_seconds", nil, numBuckets / 2},
		{"flotilla_buckets_held", nil, numBuckets / 2},
		{"flotilla_buckets_share", nil, numBuckets / 2},
		{"flotilla_buckets_handing_off", nil, 0},
	} {
		if v, ok := value(fams, c.name, c.labels...); !ok || v != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, v, ok, c.want)
		}
	}
}
