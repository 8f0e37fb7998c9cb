package postgres

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// preparedOn returns, for each idle connection of pool, its prepared
// statements (by text) and how many generic plans each has run on. It
// reads them in the simple protocol, which prepares nothing itself.
func preparedOn(ctx context.Context, t *testing.T, pool *pgxpool.Pool) []map[string]int64 {
	t.Helper()
	conns := pool.AcquireAllIdle(ctx)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	var out []map[string]int64
	for _, c := range conns {
		rows, err := c.Query(ctx, `SELECT statement, generic_plans FROM pg_prepared_statements`, pgx.QueryExecModeSimpleProtocol)
		if err != nil {
			t.Fatal(err)
		}
		prepared := map[string]int64{}
		for rows.Next() {
			var (
				sql     string
				generic int64
			)
			if err := rows.Scan(&sql, &generic); err != nil {
				t.Fatal(err)
			}
			prepared[sql] = generic
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		out = append(out, prepared)
	}
	return out
}

// useAtOnce holds n connections of pool at once, which opens those it lacks,
// and hands them back.
func useAtOnce(ctx context.Context, t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	held := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range held {
			c.Release()
		}
	}()
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
}

// checkReady fails t unless every connection of conns has h's statements
// prepared, and the generic plans of those that run on one made.
func checkReady(t *testing.T, what string, conns []map[string]int64, h hotSet) {
	t.Helper()
	for i, prepared := range conns {
		for _, sql := range h.statements() {
			if _, ok := prepared[sql]; !ok {
				t.Errorf("%s connection %d: not prepared: %.60q", what, i, sql)
			}
		}
		for _, g := range h.planned {
			for _, sql := range g.sql {
				if prepared[sql] < 1 {
					t.Errorf("%s connection %d: no generic plan made for %.60q", what, i, sql)
				}
			}
		}
	}
}

func TestWarmOpensConnectionsWithTheHotStatementsPrepared(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	t.Run("as many as asked", func(t *testing.T) {
		s := migratedStore(ctx, t, WithMaxConns(6), WithWarmConns(4))
		if err := s.Warm(ctx); err != nil {
			t.Fatal(err)
		}
		if got := s.pool.Stat().IdleConns(); got != 4 {
			t.Errorf("%d idle connections after Warm, want 4", got)
		}
		if got := s.leases.Stat().IdleConns(); got != 1 {
			t.Errorf("%d idle lease connections after Warm, want 1", got)
		}
		checkReady(t, "main pool", preparedOn(ctx, t, s.pool), poolHot)
		checkReady(t, "lease pool", preparedOn(ctx, t, s.leases), leasesHot)
	})
	t.Run("by default the whole pool", func(t *testing.T) {
		s := migratedStore(ctx, t, WithMaxConns(3))
		if err := s.Warm(ctx); err != nil {
			t.Fatal(err)
		}
		if got := s.pool.Stat().TotalConns(); got != 3 {
			t.Errorf("%d connections after Warm with the default, want the pool's 3", got)
		}
		checkReady(t, "main pool", preparedOn(ctx, t, s.pool), poolHot)
	})
	t.Run("never more than the pool holds", func(t *testing.T) {
		s := migratedStore(ctx, t, WithMaxConns(3), WithWarmConns(10))
		if err := s.Warm(ctx); err != nil {
			t.Fatal(err)
		}
		if got := s.pool.Stat().TotalConns(); got != 3 {
			t.Errorf("%d connections after Warm of 10, want the pool's 3", got)
		}
	})
	t.Run("a connection opened later is ready before its first use", func(t *testing.T) {
		s := migratedStore(ctx, t, WithMaxConns(3), WithWarmConns(1))
		if err := s.Warm(ctx); err != nil {
			t.Fatal(err)
		}
		if got := s.pool.Stat().TotalConns(); got != 1 {
			t.Fatalf("%d connections after Warm of one, want 1", got)
		}
		useAtOnce(ctx, t, s.pool, 3) // two of them opened now, after the warm-up
		conns := preparedOn(ctx, t, s.pool)
		if len(conns) != 3 {
			t.Fatalf("%d idle connections, want 3", len(conns))
		}
		checkReady(t, "main pool", conns, poolHot)
	})
}

// TestAStoreNoNodeWarmedPreparesNothingAhead: a store no node runs on, as a
// command that submits one task opens, prepares nothing it does not run and
// opens no connection ahead; nor does a node's store with the warm-up off.
func TestAStoreNoNodeWarmedPreparesNothingAhead(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for name, warm := range map[string]bool{"never warmed": false, "warm-up off": true} {
		t.Run(name, func(t *testing.T) {
			opts := []Option{WithMaxConns(2)}
			if warm {
				opts = append(opts, WithWarmConns(0))
			}
			s := migratedStore(ctx, t, opts...)
			if warm {
				if err := s.Warm(ctx); err != nil {
					t.Fatal(err)
				}
				if got := s.leases.Stat().TotalConns(); got != 0 {
					t.Errorf("%d lease connections after Warm with the warm-up off, want none", got)
				}
			}
			useAtOnce(ctx, t, s.pool, 2) // the second opened now
			if _, err := s.Meta(ctx); err != nil {
				t.Fatal(err)
			}
			conns := preparedOn(ctx, t, s.pool)
			if len(conns) == 0 {
				t.Fatal("no idle connection to look at after a read")
			}
			for _, prepared := range conns {
				for _, hot := range poolHot.statements() {
					if _, ok := prepared[hot]; ok {
						t.Fatalf("a hot statement was prepared ahead: %.80q", hot)
					}
				}
			}
		})
	}
}

// TestANegativeWarmUpIsRefused: WithWarmConns(-1) names the option and what
// it takes.
func TestANegativeWarmUpIsRefused(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := New(ctx, testdb.New(t), WithWarmConns(-1))
	if err == nil {
		s.Close()
		t.Fatal("New accepted WithWarmConns(-1)")
	}
	if !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), "postgres.WithWarmConns(-1)") ||
		!strings.Contains(err.Error(), "from 0") {
		t.Errorf("error %q: want store.ErrInvalid naming postgres.WithWarmConns(-1) and what it takes", err)
	}
}

// TestTheHotStatementsRunAsPrepared: once warm, a claim, a renewal, an
// outcome write, a command read and a lease renewal prepare nothing new.
func TestTheHotStatementsRunAsPrepared(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// One connection: every statement below runs on the one inspected.
	s := migratedStore(ctx, t, WithMaxConns(1), WithWarmConns(1))
	if err := s.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	before, leasesBefore := preparedOn(ctx, t, s.pool), preparedOn(ctx, t, s.leases)
	if len(before) != 1 || len(leasesBefore) != 1 {
		t.Fatalf("%d and %d idle connections after Warm, want 1 each", len(before), len(leasesBefore))
	}

	leases, err := s.AcquireBuckets(ctx, store.AcquireRequest{Owner: "a", Node: "n", Buckets: bucket.Of(1), TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateTasks(ctx, []store.NewTask{{Kind: "noop", Key: "k", Bucket: 1}}); err != nil {
		t.Fatal(err)
	}
	// The submission's statements are not the node's: what it prepared
	// is not counted.
	before = preparedOn(ctx, t, s.pool)

	claimed, err := s.ClaimTasks(ctx, store.ClaimRequest{Owner: "a", Node: "n", Kinds: []string{"noop"}, Limit: 1,
		LeaseTTL: time.Minute, Buckets: []store.HeldBucket{{Bucket: 1, Epoch: leases[0].Epoch}}})
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v %v, want a task", claimed, err)
	}
	if _, err := s.RenewTaskLeases(ctx, "a", []task.Ref{claimed[0].Ref()}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PendingCommands(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AdvanceActive(ctx, "a", []store.ActiveTransition{{Ref: claimed[0].Ref(), To: task.Succeeded, Node: "n"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AcquireBuckets(ctx, store.AcquireRequest{Owner: "a", Node: "n", Buckets: bucket.Of(1), TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}

	for what, c := range map[string][2][]map[string]int64{
		"main pool":  {before, preparedOn(ctx, t, s.pool)},
		"lease pool": {leasesBefore, preparedOn(ctx, t, s.leases)},
	} {
		if len(c[1]) != 1 {
			t.Fatalf("%s: %d idle connections, want the one warmed", what, len(c[1]))
		}
		for sql := range c[1][0] {
			if _, ok := c[0][0][sql]; !ok {
				t.Errorf("%s: prepared anew after Warm: %.80q", what, sql)
			}
		}
	}
	after := preparedOn(ctx, t, s.pool)[0]
	if got := after[claimSQL]; got <= before[0][claimSQL] {
		t.Errorf("the claim ran on %d generic plans, %d before: not on its prepared plan", got, before[0][claimSQL])
	}
}
