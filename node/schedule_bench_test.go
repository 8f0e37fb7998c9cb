package node

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/postgres"
)

// BenchmarkScheduleFiring fires 10,000 schedules that all fall due at the
// same second, spread over 64 buckets held by 4 nodes (16 buckets each, each
// node on a pool of its own, as processes are), on PostgreSQL. Each
// iteration sets every schedule's next fire time to a second just ahead and
// waits until every tick has its task. It reports how late the tasks were
// created after their tick (by the database clock: created_at minus
// scheduled_for), and the time the nodes spent in store calls per firing.
//
//	go test -run '^$' -bench ScheduleFiring -benchtime 5x ./node/
func BenchmarkScheduleFiring(b *testing.B) {
	const (
		schedules = 10000
		nodes     = 4
		buckets   = 64
	)
	ctx := context.Background()
	dsn := testdb.New(b)
	admin, err := postgres.New(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(admin.Close)
	if _, err := admin.Migrate(ctx, buckets); err != nil {
		b.Fatal(err)
	}
	policy, _ := bucket.NewPolicy(buckets)
	rows := make([][]any, schedules)
	for i := range rows {
		name := fmt.Sprintf("report-%05d", i)
		rows[i] = []any{name, "* * * * *", "skip", "noop", name, int32(policy.Of(name)), time.Now(), time.Now(), time.Now()}
	}
	if _, err := admin.Pool().CopyFrom(ctx, pgx.Identifier{"flotilla_schedules"},
		[]string{"name", "spec", "catch_up", "kind", "key", "bucket", "next_fire_at", "created_at", "updated_at"},
		pgx.CopyFromRows(rows)); err != nil {
		b.Fatal(err)
	}
	// Nobody fires until the first iteration sets the tick.
	if _, err := admin.Pool().Exec(ctx, `UPDATE flotilla_schedules SET next_fire_at = now() + interval '1 hour'`); err != nil {
		b.Fatal(err)
	}
	if _, err := admin.Pool().Exec(ctx, `ANALYZE flotilla_schedules`); err != nil {
		b.Fatal(err)
	}

	timed := make([]*timedStore, nodes)
	for i := range nodes {
		s, err := postgres.New(ctx, dsn)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(s.Close)
		timed[i] = &timedStore{Store: s}
		lo := i * buckets / nodes
		set, err := bucket.ParseSet(fmt.Sprintf("%d-%d", lo, lo+buckets/nodes-1), buckets)
		if err != nil {
			b.Fatal(err)
		}
		n, err := New(timed[i], Config{NodeID: fmt.Sprintf("n%d", i+1), Buckets: set, Logger: zap.NewNop()})
		if err != nil {
			b.Fatal(err)
		}
		if err := n.Start(ctx); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = n.Shutdown(context.Background()) })
	}

	var lags []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var tick time.Time
		if err := admin.Pool().QueryRow(ctx, `
			UPDATE flotilla_schedules SET next_fire_at = date_trunc('second', now()) + interval '2 seconds'
			RETURNING next_fire_at`).Scan(&tick); err != nil {
			b.Fatal(err)
		}
		// The schedules were moved behind the store's back: announce the
		// change, as the store does for one made through it, or each holder
		// learns of it only at its next look, up to 2.5 s later.
		if _, err := admin.Pool().Exec(ctx, `SELECT pg_notify($1, $2)`, string(store.TopicSchedules),
			bucket.All(64).String()); err != nil {
			b.Fatal(err)
		}
		deadline := time.Now().Add(time.Minute)
		for {
			var fired int
			if err := admin.Pool().QueryRow(ctx, `SELECT count(*) FROM flotilla_tasks WHERE scheduled_for = $1`,
				tick).Scan(&fired); err != nil {
				b.Fatal(err)
			}
			if fired == schedules {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%d of %d schedules fired a minute after their tick", fired, schedules)
			}
			time.Sleep(20 * time.Millisecond)
		}
		r, err := admin.Pool().Query(ctx, `
			SELECT extract(epoch FROM created_at - scheduled_for) FROM flotilla_tasks WHERE scheduled_for = $1`, tick)
		if err != nil {
			b.Fatal(err)
		}
		secs, err := pgx.CollectRows(r, pgx.RowTo[float64])
		if err != nil {
			b.Fatal(err)
		}
		for _, s := range secs {
			lags = append(lags, time.Duration(s*float64(time.Second)))
		}
	}
	b.StopTimer()
	reportPercentiles(b, lags)
	b.ReportMetric(float64(lags[len(lags)-1].Microseconds())/1000, "max-ms")
	var spent time.Duration
	var fired int
	for _, ts := range timed {
		d, n := ts.totals()
		spent, fired = spent+d, fired+n
	}
	b.ReportMetric(float64(spent.Microseconds())/float64(fired), "µs-store/firing")
}

// timedStore adds up the time a node spends reading and firing schedules.
type timedStore struct {
	*postgres.Store
	mu    sync.Mutex
	spent time.Duration
	fired int
}

func (t *timedStore) DueSchedules(ctx context.Context, buckets bucket.Set, limit int) ([]store.Schedule, error) {
	start := time.Now()
	out, err := t.Store.DueSchedules(ctx, buckets, limit)
	t.add(time.Since(start), 0)
	return out, err
}

func (t *timedStore) FireSchedules(ctx context.Context, owner string, reqs []store.FireRequest) ([]store.FireResult, error) {
	start := time.Now()
	out, err := t.Store.FireSchedules(ctx, owner, reqs)
	fired := 0
	for _, r := range out {
		if r.Fired {
			fired++
		}
	}
	t.add(time.Since(start), fired)
	return out, err
}

func (t *timedStore) add(d time.Duration, fired int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.spent += d
	t.fired += fired
}

func (t *timedStore) totals() (time.Duration, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.spent, t.fired
}
