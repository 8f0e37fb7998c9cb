package node

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/postgres"
	"github.com/flotilla-dev/flotilla/task"
)

// The balance and hand-off benchmarks run nodes in this process on a fresh
// PostgreSQL database, each node on a store (a pool) of its own, as
// processes would be, with a bucket lease TTL of 3 s (heartbeat 1 s):
//
//	go test -run '^$' -bench 'HandoffGap|TimeToBalancedShare' -benchtime 20x ./node/
//	go test -run '^$' -bench ScaleOutThroughput -benchtime 1x ./node/

const (
	benchTTL       = 3 * time.Second
	benchHeartbeat = time.Second
)

var benchLogger = zap.NewNop()

// benchFleet is a fresh database and the nodes started on it.
type benchFleet struct {
	b      *testing.B
	dsn    string
	admin  *postgres.Store
	policy bucket.Policy
}

func newBenchFleet(b *testing.B) *benchFleet {
	b.Helper()
	ctx := context.Background()
	dsn := testdb.New(b)
	s, err := postgres.New(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	meta, err := s.Migrate(ctx, 0)
	if err != nil {
		b.Fatal(err)
	}
	policy, err := bucket.NewPolicy(meta.NumBuckets)
	if err != nil {
		b.Fatal(err)
	}
	return &benchFleet{b: b, dsn: dsn, admin: s, policy: policy}
}

// start starts a node on a store of its own; it shuts down at the end.
func (f *benchFleet) start(cfg Config, handlers map[string]Handler) *Node {
	f.b.Helper()
	n, stop := f.startStoppable(cfg, handlers)
	f.b.Cleanup(stop)
	return n
}

// startStoppable is start, leaving the shutdown to the caller: stop shuts
// the node down and closes its store.
func (f *benchFleet) startStoppable(cfg Config, handlers map[string]Handler) (*Node, func()) {
	f.b.Helper()
	ctx := context.Background()
	s, err := postgres.New(ctx, f.dsn, postgres.WithMaxConns(8))
	if err != nil {
		f.b.Fatal(err)
	}
	cfg.BucketLeaseTTL, cfg.BucketLeaseHeartbeat, cfg.Logger = benchTTL, benchHeartbeat, benchLogger
	n, err := New(s, cfg)
	if err != nil {
		f.b.Fatal(err)
	}
	for kind, h := range handlers {
		n.Register(kind, h)
	}
	if err := n.Start(ctx); err != nil {
		f.b.Fatal(err)
	}
	return n, sync.OnceFunc(func() {
		_ = n.Shutdown(context.Background())
		s.Close()
	})
}

// within waits for cond, failing after a minute.
func (f *benchFleet) within(what string, cond func() bool) {
	f.b.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			f.b.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// starts records, per epoch of one bucket, the first and the last start of a
// handler there.
type starts struct {
	mu          sync.Mutex
	first, last map[int64]time.Time
}

func (s *starts) handler(bk int) Handler {
	return func(_ context.Context, t *task.Task) error {
		if t.Bucket != bk {
			return nil
		}
		now := time.Now()
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, ok := s.first[t.Epoch]; !ok {
			s.first[t.Epoch] = now
		}
		s.last[t.Epoch] = now
		return nil
	}
}

func (s *starts) firstAt(epoch int64) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.first[epoch]
	return at, ok
}

func (s *starts) lastAt(epoch int64) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last[epoch]
}

// BenchmarkHandoffGap moves one bucket, full of queued tasks of no work,
// back and forth between two nodes by pinning it to each in turn, and
// measures its gap: from the old holder's last start in the bucket to the
// new holder's first. No task runs long, so the hand-off waits for nothing
// but the attempts in flight.
func BenchmarkHandoffGap(b *testing.B) {
	f := newBenchFleet(b)
	const bk = 9
	rec := &starts{first: map[int64]time.Time{}, last: map[int64]time.Time{}}
	a := f.start(Config{NodeID: "a", AllBuckets: true}, map[string]Handler{"work": rec.handler(bk)})
	c := f.start(Config{NodeID: "c", Buckets: bucket.Of(bk)}, map[string]Handler{"work": rec.handler(bk)})
	ctx := context.Background()
	holders := []*Node{a, c}
	// Balance gives the bucket to c, which declares only it; the pins then
	// move it.
	holder := 1
	f.within("c holds the bucket", func() bool { _, ok := c.keeper.Holds(bk); return ok })
	gaps := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	backlog := func(i, n int) {
		tasks := make([]store.NewTask, n)
		for j := range tasks {
			tasks[j] = store.NewTask{Kind: "work", Key: fmt.Sprintf("gap-%d-%d", i, j), Bucket: bk}
		}
		if _, err := f.admin.CreateTasks(ctx, tasks); err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		// Enough work that the holder still claims when the move begins.
		backlog(i, 2000)
		from, to := holders[holder], holders[1-holder]
		oldEpoch, _ := from.keeper.Holds(bk)
		f.within("the holder runs tasks in the bucket", func() bool { _, ok := rec.firstAt(oldEpoch); return ok })
		b.StartTimer()
		if err := f.admin.PinBuckets(ctx, bucket.Of(bk), to.ID()); err != nil {
			b.Fatal(err)
		}
		var newEpoch int64
		f.within("the new holder starts a task in the bucket", func() bool {
			e, ok := to.keeper.Holds(bk)
			if !ok {
				return false
			}
			newEpoch = e
			_, started := rec.firstAt(e)
			return started
		})
		first, _ := rec.firstAt(newEpoch)
		gaps = append(gaps, first.Sub(rec.lastAt(oldEpoch)))
		holder = 1 - holder
	}
	b.StopTimer()
	reportPercentiles(b, gaps)
}

// BenchmarkTimeToBalancedShare starts a node beside one that holds every
// bucket, both declaring every bucket, and measures the time from its
// start to holding its share (32), in milliseconds and in heartbeats.
func BenchmarkTimeToBalancedShare(b *testing.B) {
	f := newBenchFleet(b)
	f.start(Config{NodeID: "first", AllBuckets: true}, map[string]Handler{"work": noop})
	times := make([]time.Duration, 0, b.N)
	for i := 0; i < b.N; i++ {
		started := time.Now()
		n, stop := f.startStoppable(Config{NodeID: fmt.Sprintf("new-%d", i), AllBuckets: true},
			map[string]Handler{"work": noop})
		f.within("the new node holds its share", func() bool { return len(n.Held()) == 32 })
		times = append(times, time.Since(started))
		// It leaves as a rolling deploy would: its buckets go back by
		// hand-off.
		stop()
	}
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	median := times[len(times)/2]
	b.ReportMetric(float64(median.Milliseconds()), "median-ms")
	b.ReportMetric(median.Seconds()/benchHeartbeat.Seconds(), "median-heartbeats")
	b.ReportMetric(float64(times[len(times)-1].Milliseconds()), "max-ms")
}

// BenchmarkScaleOutThroughput offers the integration scenario's load (200
// tasks a second of 100 ms, over 50 keys each limited to 2 running) to one
// node, starts three more that declare the same buckets, and counts the
// tasks finished in each second from two seconds before the scale-out to
// ten after. It reports the lowest and the median second as a share of the
// offered rate.
func BenchmarkScaleOutThroughput(b *testing.B) {
	for i := 0; i < b.N; i++ {
		low, median := scaleOut(b)
		b.ReportMetric(low, "min-second-of-offered")
		b.ReportMetric(median, "median-second-of-offered")
	}
}

func scaleOut(b *testing.B) (low, median float64) {
	const rate, keys = 200, 50
	f := newBenchFleet(b)
	lim := store.Limit{Name: "per-key", Kind: "work", Per: store.PerKey, Concurrency: 2}
	var mu sync.Mutex
	var ends []time.Time
	work := func(ctx context.Context, _ *task.Task) error {
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		mu.Lock()
		ends = append(ends, time.Now())
		mu.Unlock()
		return nil
	}
	cfg := func(id string) Config {
		return Config{NodeID: id, AllBuckets: true, Limits: []store.Limit{lim}, Concurrency: 64}
	}
	first := f.start(cfg("n1"), map[string]Handler{"work": work})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	loaded := make(chan struct{})
	go func() {
		defer close(loaded)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		next := 0
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			tasks := make([]store.NewTask, rate/10)
			for j := range tasks {
				key := fmt.Sprintf("key-%02d", next%keys)
				tasks[j] = store.NewTask{Kind: "work", Key: key, Bucket: f.policy.Of(key), Payload: json.RawMessage(`{}`)}
				next++
			}
			_, _ = f.admin.CreateTasks(ctx, tasks)
		}
	}()
	time.Sleep(6 * time.Second) // the load reaches its steady state
	// The three start together, as replicas of a scale-out do.
	joined := time.Now()
	nodes := make([]*Node, 3)
	var starting sync.WaitGroup
	for i, id := range []string{"n2", "n3", "n4"} {
		starting.Go(func() { nodes[i] = f.start(cfg(id), map[string]Handler{"work": work}) })
	}
	starting.Wait()
	f.within("four nodes hold 16 buckets each", func() bool {
		if len(first.Held()) != 16 {
			return false
		}
		for _, n := range nodes {
			if len(n.Held()) != 16 {
				return false
			}
		}
		return true
	})
	time.Sleep(time.Until(joined.Add(11 * time.Second)))
	cancel()
	<-loaded

	mu.Lock()
	defer mu.Unlock()
	perSecond := make([]int, 12)
	from := joined.Add(-2 * time.Second)
	for _, at := range ends {
		if s := int(at.Sub(from) / time.Second); !at.Before(from) && s < len(perSecond) {
			perSecond[s]++
		}
	}
	b.Logf("tasks finished per second, from 2 s before the scale-out: %v (offered %d)", perSecond, rate)
	sorted := append([]int(nil), perSecond...)
	sort.Ints(sorted)
	return float64(sorted[0]) / rate, float64(sorted[len(sorted)/2]) / rate
}
