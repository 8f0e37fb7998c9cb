package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/patience"
	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// TestClaimUsesTheClaimIndex checks the plan the claim runs on, its
// generic one (claimSettingSQL), where it matters: with many finished
// tasks beside a few queued ones, it must walk the partial claim index,
// never scan the table; and so it must with statistics that have not seen
// the queued tasks yet, and when a node's connection made the plan at its
// first claim on a table of a page or none, never analyzed, and keeps it
// as the table grows.
func TestClaimUsesTheClaimIndex(t *testing.T) {
	t.Parallel()
	t.Run("analyzed", func(t *testing.T) {
		testClaimPlan(t, func(ctx context.Context, s *Store) { fillForPlans(ctx, t, s, true) })
	})
	t.Run("not_analyzed", func(t *testing.T) {
		testClaimPlan(t, func(ctx context.Context, s *Store) { fillForPlans(ctx, t, s, false) })
	})
	// Made on a deep backlog, a generic plan guesses that a claim with a
	// limit it does not know takes a tenth of the claimable rows.
	t.Run("deep_backlog", func(t *testing.T) {
		testClaimPlan(t, func(ctx context.Context, s *Store) {
			if _, err := s.pool.Exec(ctx, `INSERT INTO flotilla_tasks (kind, key, bucket, status, run_at, max_attempts, created_at, updated_at)
				SELECT 'noop', 'k' || g, g % 64, 'queued', now(), 3, now(), now() FROM generate_series(1, 200000) g`); err != nil {
				t.Fatal(err)
			}
			if _, err := s.pool.Exec(ctx, `ANALYZE flotilla_tasks`); err != nil {
				t.Fatal(err)
			}
		})
	})
	// A node of a large fleet holds a few of its buckets.
	t.Run("1024_buckets", func(t *testing.T) {
		ranges := []bucket.Set{}
		for _, r := range []string{"0-15", "512-527"} {
			set, err := bucket.ParseSet(r, 1024)
			if err != nil {
				t.Fatal(err)
			}
			ranges = append(ranges, set)
		}
		testClaimPlanOver(t, 1024, ranges, func(ctx context.Context, s *Store) { fillForPlans(ctx, t, s, true) })
	})
	for _, rows := range []int{0, 50} {
		t.Run(fmt.Sprintf("tiny_never_analyzed_%d", rows), func(t *testing.T) {
			testClaimPlan(t, func(ctx context.Context, s *Store) {
				if _, err := s.pool.Exec(ctx, `INSERT INTO flotilla_tasks (kind, key, bucket, status, run_at, max_attempts, created_at, updated_at)
					SELECT 'noop', 'k' || g, g % 64, 'queued', now(), 3, now(), now() FROM generate_series(1, $1::int) g`, rows); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

func testClaimPlan(t *testing.T, fill func(context.Context, *Store)) {
	testClaimPlanOver(t, 64, []bucket.Set{bucket.All(64), bucket.Of(3, 17)}, fill)
}

// testClaimPlanOver is testClaimPlan on a fleet of numBuckets, claiming in
// each of the held sets in turn.
func testClaimPlanOver(t *testing.T, numBuckets int, sets []bucket.Set, fill func(context.Context, *Store)) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := migratedFleet(ctx, t, numBuckets)
	fill(ctx, s)

	for i, held := range sets {
		leases, err := s.AcquireBuckets(ctx, store.AcquireRequest{Owner: "a", Node: "n", Buckets: held, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		var hb []store.HeldBucket
		for _, l := range leases {
			hb = append(hb, store.HeldBucket{Bucket: l.Bucket, Epoch: l.Epoch})
		}
		h, err := heldArraysOf(hb)
		if err != nil {
			t.Fatal(err)
		}
		// As ClaimTasks runs it: in a transaction, under claimSettingSQL,
		// prepared. EXPLAIN of a statement with parameters plans it for
		// their values; the plan a prepared statement runs on is what
		// EXPLAIN EXECUTE shows, which takes its arguments as literals.
		args := []any{h.buckets, "a", []string{"noop"}, 100, "n", time.Minute.Microseconds(), h.epochByBucket}
		literals := make([]string, len(args))
		for k, arg := range args {
			literals[k] = sqlLiteral(t, arg)
		}
		plan := explainIn(ctx, t, s, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, claimSettingSQL, "0"); err != nil {
				return err
			}
			// A name of its own: a prepared statement outlives its
			// transaction, on a connection the pool hands out again.
			_, err := tx.Exec(ctx, fmt.Sprintf("PREPARE claim_%d AS %s", i, claimSQL))
			return err
		}, fmt.Sprintf("EXECUTE claim_%d(%s)", i, strings.Join(literals, ", ")))
		text := strings.Join(plan, "\n")
		if !strings.Contains(text, "flotilla_tasks_claim_idx") {
			t.Errorf("holding %s, the claim does not use flotilla_tasks_claim_idx:\n%s", held, text)
		}
		// Walking the index in order, it neither reads the finished tasks
		// nor sorts the claimable ones, and it finds the rows it moves by
		// their ids, not by hashing or merging the table.
		for _, bad := range []string{"Seq Scan on flotilla_tasks ", "Sort", "Hash", "Merge"} {
			if strings.Contains(text, bad) {
				t.Errorf("holding %s, the claim's plan has a %s:\n%s", held, strings.TrimSpace(bad), text)
			}
		}
		// The held leases are read by their buckets: a scan of the lease
		// table reads every bucket of the fleet (1,024 rows for a node
		// holding 16 of them), at each claim of each node.
		if !strings.Contains(text, "flotilla_bucket_leases_pkey") || strings.Contains(text, "Seq Scan on flotilla_bucket_leases") {
			t.Errorf("holding %s, the claim does not read the held leases by their buckets:\n%s", held, text)
		}
		// The held range is tested on the index entries, so that rows of
		// buckets outside it are passed without reading the table.
		if !indexCondBoundsBucket(plan) {
			t.Errorf("holding %s, the claim does not bound the bucket in the index condition:\n%s", held, text)
		}
		// A generic plan keeps the parameters where a custom one has values.
		if !strings.Contains(text, "kind = ANY ($3)") {
			t.Errorf("holding %s, the claim was planned for its values, not once for all:\n%s", held, text)
		}
	}
}

// fillForPlans puts 20,000 finished tasks and 1,000 queued ones over 64
// buckets in the task table, each under a key of its own, and analyzes the
// table after the queued ones or, unless analyze, before them (statistics
// of the finished tasks only).
func fillForPlans(ctx context.Context, t *testing.T, s *Store, analyze bool) {
	t.Helper()
	fill := []string{
		`INSERT INTO flotilla_tasks (kind, key, bucket, status, run_at, max_attempts, created_at, updated_at, finished_at)
		 SELECT 'noop', 'k' || g, g % 64, 'succeeded', now(), 3, now(), now(), now() FROM generate_series(1, 20000) g`,
		`INSERT INTO flotilla_tasks (kind, key, bucket, status, run_at, max_attempts, created_at, updated_at)
		 SELECT 'noop', 'k' || g, g % 64, 'queued', now(), 3, now(), now() FROM generate_series(1, 1000) g`,
		`ANALYZE flotilla_tasks`,
	}
	if !analyze {
		fill = []string{fill[0], fill[2], fill[1]}
	}
	for _, sql := range fill {
		if _, err := s.pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
}

// indexCondBoundsBucket reports whether the plan's scan of the claim index
// has both bounds of the bucket in its index condition.
func indexCondBoundsBucket(plan []string) bool {
	for i, line := range plan {
		if !strings.Contains(line, "Index Scan using flotilla_tasks_claim_idx") || i+1 == len(plan) {
			continue
		}
		cond := plan[i+1]
		if strings.Contains(cond, "Index Cond:") && strings.Contains(cond, "bucket >=") && strings.Contains(cond, "bucket <=") {
			return true
		}
	}
	return false
}

func TestRedact(t *testing.T) {
	t.Parallel()
	tests := []struct{ dsn, want string }{
		{"", ""},
		{"postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"},
		{"postgres://user:secret@host:5432/db?sslmode=disable", "postgres://user@host:5432/db?sslmode=disable"},
		{"postgresql://user:secret@host/db", "postgresql://user@host/db"},
		{"postgres://user:p%40ss@host/db", "postgres://user@host/db"},
		{"postgres://user:p@ss:w/rd@host/db", "postgres://user@host/db"},
		{"postgres://user:secret@h1:5432,h2:5433/db?target_session_attrs=read-write", "postgres://user@h1:5432,h2:5433/db?target_session_attrs=read-write"},
		{"postgres://user:secret@[::1]:5432,[::1]:5433/db?target_session_attrs=read-write", "postgres://user@[::1]:5432,[::1]:5433/db?target_session_attrs=read-write"},
		{"postgres://user@h1,h2:5433/db?password=secret&target_session_attrs=read-write", "postgres://user@h1,h2:5433/db?target_session_attrs=read-write"},
		{"postgres://user@host/db?password=secret&sslmode=disable", "postgres://user@host/db?sslmode=disable"},
		{"postgres://user@host/db?sslmode=disable&pass%77ord=secret", "postgres://user@host/db?sslmode=disable"},
		{"postgres://user:secret@host", "postgres://user@host"},
		{"postgres://host/db", "postgres://host/db"},
		{"host=localhost user=u password=secret dbname=db", "host=localhost user=u dbname=db"},
		{"host=localhost password='sec ret' dbname=db", "host=localhost dbname=db"},
		{`host=localhost password='it\'s secret' dbname=db`, "host=localhost dbname=db"},
		{"host = localhost password = secret  dbname = db", "host=localhost dbname=db"},
		{"host=localhost password='unterminated secret", unparseableDSN},
		{"not a dsn secret", unparseableDSN},
	}
	for _, tt := range tests {
		got := redact(tt.dsn)
		if got != tt.want {
			t.Errorf("redact(%q) = %q, want %q", tt.dsn, got, tt.want)
		}
		if strings.Contains(got, "secret") || strings.Contains(got, "ret") && strings.Contains(tt.dsn, "sec ret") {
			t.Errorf("redact(%q) = %q still holds the password", tt.dsn, got)
		}
	}
}

func TestPasswords(t *testing.T) {
	t.Parallel()
	for dsn, want := range map[string]string{
		"postgres://u:s%40cret@h/db":             "s@cret",
		"postgres://u@h/db?password=pw&x=1":      "pw",
		"host=h password='sec ret'":              "sec ret",
		"postgres://u:p@ss:w/rd@h/db?sslmode=no": "p@ss:w/rd",
	} {
		found := false
		for _, pw := range passwords(dsn) {
			found = found || pw == want
		}
		if !found {
			t.Errorf("passwords(%q) = %q, want it to include %q", dsn, passwords(dsn), want)
		}
	}
}

// TestASlowClaimIsRolledBackByTheDatabase: a claim that cannot finish within
// half its caller's deadline is cancelled by the database itself (a
// statement timeout), so its transaction rolls back and no task is left
// claimed behind a caller that has given up on the answer.
func TestASlowClaimIsRolledBackByTheDatabase(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn := testdb.New(t)
	// One connection, so that the claim below runs on the connection
	// where its statements are already prepared: preparing them would wait
	// for the lock outside the claim's transaction.
	s, err := New(ctx, dsn, WithMaxConns(1))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Migrate(ctx, 8); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ClaimTasks(ctx, store.ClaimRequest{Owner: "a", Kinds: []string{"noop"}, Limit: 1, LeaseTTL: time.Minute,
		Buckets: []store.HeldBucket{{Bucket: 1, Epoch: 0}}}); err != nil {
		t.Fatal(err)
	}
	created, err := s.CreateTasks(ctx, []store.NewTask{{Kind: "noop", Key: "k", Bucket: 1}})
	if err != nil {
		t.Fatal(err)
	}
	leases, err := s.AcquireBuckets(ctx, store.AcquireRequest{Owner: "a", Node: "n", Buckets: bucket.Of(1), TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}

	// Another transaction holds the table, so the claim waits.
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	blocker, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = blocker.Rollback(context.Background()) }()
	if _, err := blocker.Exec(ctx, `LOCK TABLE flotilla_tasks IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}

	claimCtx, claimCancel := context.WithTimeout(ctx, 4*time.Second)
	defer claimCancel()
	_, err = s.ClaimTasks(claimCtx, store.ClaimRequest{Owner: "a", Node: "n", Kinds: []string{"noop"}, Limit: 10,
		LeaseTTL: time.Minute, Buckets: []store.HeldBucket{{Bucket: 1, Epoch: leases[0].Epoch}}})
	if err == nil || !strings.Contains(err.Error(), "statement timeout") {
		t.Fatalf("blocked claim: %v, want the database's statement timeout, before the caller's deadline", err)
	}
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetTask(ctx, created[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != "queued" || got.ClaimSeq != 0 {
		t.Errorf("after the timed-out claim the task is %s with claim_seq %d, want queued and unclaimed", got.Status, got.ClaimSeq)
	}
}

func TestCreatedMeanwhileKnowsBothAnswersOfALostRace(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"duplicate_database", &pgconn.PgError{Code: "42P04"}, true},
		{"unique violation on the name", &pgconn.PgError{Code: "23505", ConstraintName: "pg_database_datname_index"}, true},
		{"wrapped", fmt.Errorf("exec: %w", &pgconn.PgError{Code: "42P04"}), true},
		{"unique violation elsewhere", &pgconn.PgError{Code: "23505", ConstraintName: "other_index"}, false},
		{"insufficient_privilege", &pgconn.PgError{Code: "42501"}, false},
		{"not from the server", errors.New("connection reset"), false},
		{"no error", nil, false},
	} {
		if got := createdMeanwhile(c.err); got != c.want {
			t.Errorf("%s: createdMeanwhile(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// TestAdvanceLooksUpDependentsByID checks the plan of the statement that
// ends tasks where a fan-out made it slow: with a few thousand rows in the
// task table and statistics on them, the dependents of the tasks it ends
// must be locked and updated by primary-key lookups. A join the planner
// sized by guess hashed the whole table instead, on every batch of a
// fan-out's steps, so that a fan-out of 10,000 burned down at a third of
// the plain rate.
func TestAdvanceLooksUpDependentsByID(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := migratedStore(ctx, t)
	queueAndAnalyze(ctx, t, s, 5000, "")
	// As AdvanceActive runs it: in a transaction, on the generic plan.
	plan := explainIn(ctx, t, s, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, advanceSettingSQL)
		return err
	}, advanceSQL, "a", []int64{1}, []int64{1}, []string{"succeeded"}, []string{""}, []string{""},
		[]*string{nil}, []*string{nil}, []int64{0}, []string{"n"}, allowedFrom, allowedTo)
	if text := strings.Join(plan, "\n"); strings.Contains(text, "Seq Scan on flotilla_tasks ") {
		t.Errorf("ending a task scans the task table:\n%s", text)
	}
}

// queueAndAnalyze inserts n queued tasks in bucket 7, each needing
// resources (JSON; "" for nothing), and refreshes the planner's statistics.
func queueAndAnalyze(ctx context.Context, t *testing.T, s *Store, n int, resources string) {
	t.Helper()
	_, err := s.pool.Exec(ctx, `INSERT INTO flotilla_tasks (kind, bucket, status, run_at, max_attempts, created_at, updated_at, resources)
		SELECT 'noop', 7, 'queued', now(), 3, now(), now(), nullif($2, '')::jsonb FROM generate_series(1, $1::int) g`, n, resources)
	if err == nil {
		_, err = s.pool.Exec(ctx, `ANALYZE flotilla_tasks`)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// migratedStore opens a store on a fresh test database with 64 buckets,
// closed when the test ends.
func migratedStore(ctx context.Context, t *testing.T, opts ...Option) *Store {
	t.Helper()
	return migratedFleet(ctx, t, 64, opts...)
}

// migratedFleet is migratedStore with numBuckets buckets.
func migratedFleet(ctx context.Context, t *testing.T, numBuckets int, opts ...Option) *Store {
	t.Helper()
	s, err := New(ctx, testdb.New(t), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if _, err := s.Migrate(ctx, numBuckets); err != nil {
		t.Fatal(err)
	}
	return s
}

// explainIn returns the plan of sql with args, explained in a transaction
// after set has set it up as the statement's own transaction does.
func explainIn(ctx context.Context, t *testing.T, s *Store, set func(pgx.Tx) error, sql string, args ...any) []string {
	t.Helper()
	var plan []string
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := set(tx); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, "EXPLAIN "+sql, args...)
		if err != nil {
			return err
		}
		plan, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return plan
}

// explainPrepared returns the plan a connection makes once for sql and
// keeps: sql prepared under name in a transaction that ran setting first,
// then EXPLAIN EXECUTE with args, the arguments' literals in parentheses.
// The name must be one of its own: a prepared statement outlives its
// transaction, on a connection the pool hands out again.
func explainPrepared(ctx context.Context, t *testing.T, s *Store, setting, name, sql, args string) []string {
	t.Helper()
	return explainIn(ctx, t, s, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, setting); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "PREPARE "+name+" AS "+sql)
		return err
	}, "EXECUTE "+name+args)
}

// planWhileTablesGrow checks a plan the way a connection makes it on a
// young fleet: on tables never analyzed, as add grows them to 0, 50 and
// then 500 more rows, check sees the plan made at each size.
func planWhileTablesGrow(t *testing.T, s *Store, add func(t *testing.T, s *Store, rows int), check func(t *testing.T, s *Store, name string)) {
	t.Helper()
	for i, rows := range []int{0, 50, 500} {
		add(t, s, rows)
		check(t, s, fmt.Sprintf("tiny_%d", i))
	}
}

// planAfterAnalyze checks a plan made on table analyzed after add filled it
// with rows.
func planAfterAnalyze(ctx context.Context, t *testing.T, s *Store, table string, rows int,
	add func(t *testing.T, s *Store, rows int), check func(t *testing.T, s *Store, name string)) {
	t.Helper()
	add(t, s, rows)
	if _, err := s.pool.Exec(ctx, `ANALYZE `+table); err != nil {
		t.Fatal(err)
	}
	check(t, s, "analyzed")
}

// TestARefusedCommandLeavesNothingAndKeepsItsConnection: a stop refused
// by issueSQL (the task is queued, not active) writes nothing, releases the
// task's row lock, and leaves its connection in the pool, not closed. And a
// command whose task row another transaction holds waits for it, and, its
// deadline passed, writes nothing either.
func TestARefusedCommandLeavesNothingAndKeepsItsConnection(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := migratedStore(ctx, t, WithMaxConns(2))
	tasks, err := s.CreateTasks(ctx, []store.NewTask{{Kind: "noop", Key: "k", Bucket: 3}})
	if err != nil {
		t.Fatal(err)
	}
	id := tasks[0].ID
	commands := func() int {
		t.Helper()
		var n int
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM flotilla_commands`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Warm the pool to its two connections, so that a new one shows.
	c1, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c1.Release()
	c2.Release()
	opened := s.pool.Stat().NewConnsCount()

	for range 3 {
		_, err := s.IssueCommand(ctx, store.NewCommand{TaskID: id, Kind: store.CommandStop, IssuedBy: "op"})
		if !errors.Is(err, store.ErrConflict) || !strings.Contains(err.Error(), "queued") {
			t.Fatalf("a stop of a queued task: %v, want a conflict naming its state", err)
		}
	}
	if n := commands(); n != 0 {
		t.Errorf("%d commands written by refused stops", n)
	}
	if got := s.pool.Stat().NewConnsCount(); got != opened {
		t.Errorf("the pool opened %d connections after refused stops: they were closed, not rolled back", got-opened)
	}
	// The row lock went with the rollback: another transaction takes it at once.
	if err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SELECT 1 FROM flotilla_tasks WHERE id = $1 FOR UPDATE NOWAIT`, id)
		return err
	}); err != nil {
		t.Fatalf("the task's row is still locked after a refused stop: %v", err)
	}

	// Another transaction holds the task's row: the command waits, and
	// gives up at its deadline with nothing written.
	locker, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = locker.Rollback(ctx) }()
	if _, err := locker.Exec(ctx, `SELECT 1 FROM flotilla_tasks WHERE id = $1 FOR UPDATE`, id); err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	if _, err := s.IssueCommand(short, store.NewCommand{TaskID: id, Kind: store.CommandPause, IssuedBy: "op"}); err == nil ||
		!strings.Contains(err.Error(), fmt.Sprintf("pause command for task %d", id)) {
		t.Fatalf("a pause while another transaction holds the row: %v, want its deadline's error naming the command", err)
	}
	if err := locker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := commands(); n != 0 {
		t.Errorf("%d commands written by a command that gave up", n)
	}
}

// TestAStopWaitingOnAMoveDecidesOnTheTaskAsTheMoveLeftIt forces the
// interleaving issueSQL's row lock exists for: a stop issued while another
// transaction moves the task waits for it, then decides on the row that
// transaction committed, not on the one its statement started with. A
// completion that commits first leaves nothing to stop: no command, no
// flag. A lease renewal that commits first leaves the task running, and
// the stop is issued on it.
func TestAStopWaitingOnAMoveDecidesOnTheTaskAsTheMoveLeftIt(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := migratedStore(ctx, t, WithMaxConns(4))
	leases, err := s.AcquireBuckets(ctx, store.AcquireRequest{Owner: "a", Node: "n", Buckets: bucket.Of(1), TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	running := func() int64 {
		t.Helper()
		created, err := s.CreateTasks(ctx, []store.NewTask{{Kind: "noop", Key: "k", Bucket: 1}})
		if err != nil {
			t.Fatal(err)
		}
		claimed, err := s.ClaimTasks(ctx, store.ClaimRequest{Owner: "a", Node: "n", Kinds: []string{"noop"}, Limit: 1,
			LeaseTTL: time.Minute, Buckets: []store.HeldBucket{{Bucket: 1, Epoch: leases[0].Epoch}}})
		if err != nil || len(claimed) != 1 || claimed[0].ID != created[0].ID {
			t.Fatalf("claim: %v %v, want task %d", claimed, err, created[0].ID)
		}
		return created[0].ID
	}
	commandsFor := func(id int64) int {
		t.Helper()
		var n int
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM flotilla_commands WHERE task_id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// stopBehind issues a stop while move holds the task's row, and
	// returns what the stop answered once move has committed.
	stopBehind := func(id int64, move string) (store.Command, error) {
		t.Helper()
		mover, err := s.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = mover.Rollback(ctx) }()
		if _, err := mover.Exec(ctx, move, id); err != nil {
			t.Fatal(err)
		}
		type answer struct {
			cmd store.Command
			err error
		}
		answered := make(chan answer, 1)
		go func() {
			cmd, err := s.IssueCommand(ctx, store.NewCommand{TaskID: id, Kind: store.CommandStop, IssuedBy: "op"})
			answered <- answer{cmd, err}
		}()
		deadline := time.Now().Add(patience.Scale(30 * time.Second))
		for {
			var waiting int
			// Read outside mover's transaction, which would keep reading
			// the snapshot of the activity it took first.
			if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%flotilla_commands%'`).
				Scan(&waiting); err != nil {
				t.Fatal(err)
			}
			if waiting > 0 {
				break
			}
			select {
			case a := <-answered:
				t.Fatalf("the stop did not wait for the row another transaction holds: %+v %v", a.cmd, a.err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatal("the stop never waited for the task's row")
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err := mover.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		a := <-answered
		return a.cmd, a.err
	}

	done := running()
	_, err = stopBehind(done, `UPDATE flotilla_tasks SET status = 'succeeded', status_version = status_version + 1,
		owner = NULL, finished_at = statement_timestamp() WHERE id = $1`)
	if !errors.Is(err, store.ErrConflict) || !strings.Contains(err.Error(), "succeeded") {
		t.Errorf("a stop behind a completion: %v, want a conflict naming succeeded", err)
	}
	if n := commandsFor(done); n != 0 {
		t.Errorf("a stop behind a completion wrote %d commands for the finished task", n)
	}
	if got, err := s.GetTask(ctx, done); err != nil || got.StopRequested {
		t.Errorf("a stop behind a completion marked the finished task: %+v %v", got, err)
	}

	renewed := running()
	cmd, err := stopBehind(renewed, `UPDATE flotilla_tasks SET lease_expires_at = lease_expires_at + interval '1 second'
		WHERE id = $1`)
	if err != nil || cmd.TaskStatus != task.Running || cmd.Owner != "a" {
		t.Errorf("a stop behind a lease renewal: %+v %v, want a command on the running task", cmd, err)
	}
	if got, err := s.GetTask(ctx, renewed); err != nil || !got.StopRequested {
		t.Errorf("a stop behind a lease renewal left the task unmarked: %+v %v", got, err)
	}
}

// TestASmallCreateAnnouncesItsDueTasksOnlyOnceCommitted: a small batch is
// inserted and announced in one round trip, the NOTIFY in a transaction of
// its own after the insert's commit. The notification names the buckets of
// the tasks due at once and finds them committed; a batch that fails (a
// unique key taken) announces nothing and leaves its connection usable; a
// delayed task is not announced.
func TestASmallCreateAnnouncesItsDueTasksOnlyOnceCommitted(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := migratedStore(ctx, t, WithMaxConns(2))
	listener, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Release()
	if _, err := listener.Exec(ctx, `LISTEN `+string(store.TopicTasks)); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = listener.Exec(context.Background(), `UNLISTEN *`) }()
	next := func() (payload string, visible int) {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		note, err := listener.Conn().WaitForNotification(wctx)
		if err != nil {
			t.Fatalf("no notification: %v", err)
		}
		if err := listener.QueryRow(ctx, `SELECT count(*) FROM flotilla_tasks`).Scan(&visible); err != nil {
			t.Fatal(err)
		}
		return note.Payload, visible
	}

	if _, err := s.CreateTasks(ctx, []store.NewTask{{Kind: "noop", Key: "a", Bucket: 5, UniqueKey: "once"}}); err != nil {
		t.Fatal(err)
	}
	if payload, visible := next(); payload != "5" || visible != 1 {
		t.Errorf("notification %q with %d tasks visible, want bucket 5 with the task committed", payload, visible)
	}
	_, err = s.CreateTasks(ctx, []store.NewTask{{Kind: "noop", Key: "b", Bucket: 6},
		{Kind: "noop", Key: "a", Bucket: 7, UniqueKey: "once"}})
	if !errors.Is(err, store.ErrDuplicate) {
		t.Fatalf("a batch with a taken unique key: %v, want store.ErrDuplicate", err)
	}
	if _, err := s.CreateTasks(ctx, []store.NewTask{{Kind: "noop", Key: "c", Bucket: 8, Delay: time.Hour},
		{Kind: "noop", Key: "d", Bucket: 9}}); err != nil {
		t.Fatalf("a batch after the failed one, on the same pool: %v", err)
	}
	if payload, visible := next(); payload != "9" || visible != 3 {
		t.Errorf("notification %q with %d tasks visible, want bucket 9 only (not the failed batch's, not the "+
			"delayed task's) with 3 tasks committed", payload, visible)
	}
}

// TestLimitedClaimPlans checks the plan a small limited claim runs on, its
// generic one (limitedPlanMode): beside many finished tasks, with
// statistics that have seen the queued tasks or not, it walks the claim
// index and never scans the task table.
func TestLimitedClaimPlans(t *testing.T) {
	t.Parallel()
	t.Run("analyzed", func(t *testing.T) { testLimitedClaimPlan(t, true) })
	t.Run("not_analyzed", func(t *testing.T) { testLimitedClaimPlan(t, false) })
	// A node's connection makes the generic plan at its first limited
	// claim, perhaps on a new table of a page, never analyzed, and keeps
	// it as the table grows (see advanceSettingSQL).
	t.Run("tiny_never_analyzed", func(t *testing.T) { testLimitedClaimPlan(t, false, 50) })
}

func testLimitedClaimPlan(t *testing.T, analyze bool, tiny ...int) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := migratedStore(ctx, t)
	if len(tiny) > 0 {
		if _, err := s.pool.Exec(ctx, `INSERT INTO flotilla_tasks (kind, key, bucket, status, run_at, max_attempts, created_at, updated_at)
			SELECT 'noop', 'k' || g, g % 64, 'queued', now(), 3, now(), now() FROM generate_series(1, $1::int) g`, tiny[0]); err != nil {
			t.Fatal(err)
		}
	} else {
		fillForPlans(ctx, t, s, analyze)
	}
	leases, err := s.AcquireBuckets(ctx, store.AcquireRequest{Owner: "a", Node: "n", Buckets: bucket.Of(3, 17), TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var held []store.HeldBucket
	for _, l := range leases {
		held = append(held, store.HeldBucket{Bucket: l.Bucket, Epoch: l.Epoch})
	}
	req := store.ClaimRequest{Owner: "a", Node: "n", Buckets: held, Kinds: []string{"noop"}, Limit: 2, LeaseTTL: time.Minute}
	lc := store.LimitedClaim{Kinds: []store.KindRoom{{Kind: "noop", Room: 2, KeyRoom: -1}},
		Keys: []store.KeyRoom{{Kind: "noop", Key: "k3", Room: 1, Used: 1}}, BusyAt: 1}
	q, err := limitedClaimOf(ctx, req, lc)
	if err != nil {
		t.Fatal(err)
	}
	if q.planMode != "force_generic_plan" {
		t.Fatalf("a claim of 2 tasks naming 1 key runs on %s, want its generic plan", q.planMode)
	}
	// EXPLAIN of a statement with parameters plans it for their values;
	// the plan a prepared statement runs on is what EXPLAIN EXECUTE shows,
	// which takes its arguments as literals.
	literals := make([]string, len(q.args))
	for i, arg := range q.args {
		literals[i] = sqlLiteral(t, arg)
	}
	plan := explainIn(ctx, t, s, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, claimLimitedSettingSQL, "0", q.planMode); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "PREPARE limited_claim AS "+claimLimitedSQL)
		return err
	}, "EXECUTE limited_claim("+strings.Join(literals, ", ")+")")
	text := strings.Join(plan, "\n")
	if !strings.Contains(text, "flotilla_tasks_claim_idx") {
		t.Errorf("the small limited claim does not use flotilla_tasks_claim_idx:\n%s", text)
	}
	if strings.Contains(text, "Seq Scan on flotilla_tasks ") {
		t.Errorf("the small limited claim scans the task table:\n%s", text)
	}
	// A generic plan keeps the parameters where a custom one has values.
	if !strings.Contains(text, "kind = ANY ($3)") {
		t.Errorf("the small limited claim was planned for its values, not once for all:\n%s", text)
	}
}

// sqlLiteral writes v, an argument of claimLimitedSQL, as a literal.
func sqlLiteral(t *testing.T, v any) string {
	t.Helper()
	quote := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
	switch v := v.(type) {
	case string:
		return quote(v)
	case int, int32, int64, bool:
		return fmt.Sprint(v)
	case []string:
		quoted := make([]string, len(v))
		for i, s := range v {
			quoted[i] = quote(s)
		}
		return "ARRAY[" + strings.Join(quoted, ", ") + "]::text[]"
	case []int32, []int64:
		return quote(strings.NewReplacer("[", "{", "]", "}", " ", ",").Replace(fmt.Sprint(v)))
	}
	t.Fatalf("no literal for %T", v)
	return ""
}

// TestLimitedClaimRanksOnlyWhenTheFirstOfEachKeyDoNotDecide: when the
// first candidates of keys not named fill a limited claim and nothing else
// could come as early in the round robin (sureDecides), the claim takes
// them and never runs its ranking; otherwise it ranks.
func TestLimitedClaimRanksOnlyWhenTheFirstOfEachKeyDoNotDecide(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, c := range []struct {
		name  string
		lc    store.LimitedClaim
		ranks bool
	}{
		{"decided", store.LimitedClaim{}, false},
		{"resources free", store.LimitedClaim{Free: store.Resources{"gpu": 1}}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := migratedStore(ctx, t)
			var nts []store.NewTask
			for i := range 4 {
				nts = append(nts, store.NewTask{Kind: "noop", Key: fmt.Sprint("k", i), Bucket: 3})
			}
			if _, err := s.CreateTasks(ctx, nts); err != nil {
				t.Fatal(err)
			}
			leases, err := s.AcquireBuckets(ctx, store.AcquireRequest{Owner: "a", Node: "n", Buckets: bucket.Of(3), TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			req := store.ClaimRequest{Owner: "a", Node: "n", Buckets: []store.HeldBucket{{Bucket: 3, Epoch: leases[0].Epoch}},
				Kinds: []string{"noop"}, Limit: 2, LeaseTTL: time.Minute}
			q, err := limitedClaimOf(ctx, req, c.lc)
			if err != nil {
				t.Fatal(err)
			}
			plan := explainIn(ctx, t, s, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, claimLimitedSettingSQL, "0", q.planMode)
				return err
			}, "(ANALYZE, COSTS OFF, TIMING OFF) "+claimLimitedSQL, q.args...)
			text := strings.Join(plan, "\n")
			ranked := false
			for _, line := range plan {
				if strings.Contains(line, "WindowAgg") && !strings.Contains(line, "never executed") {
					ranked = true
				}
			}
			if ranked != c.ranks {
				t.Errorf("the claim ranked its candidates: %v, want %v:\n%s", ranked, c.ranks, text)
			}
			if !strings.Contains(text, "Update on flotilla_tasks") || !strings.Contains(text, "rows=2 loops=1") {
				t.Errorf("the claim did not take 2 tasks:\n%s", text)
			}
		})
	}
}

// A node that declares no capacity writes, at each refresh, why its tasks
// that need resources wait. The statement must read those tasks by their
// index, not walk the whole backlog of its buckets, which holds mostly
// tasks that need nothing.
func TestResourceWaitReasonsReadOnlyTheTasksThatNeedResources(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := migratedStore(ctx, t)
	queueAndAnalyze(ctx, t, s, 5000, "")
	queueAndAnalyze(ctx, t, s, 5, `{"gpu": 1}`)
	plan := explainIn(ctx, t, s, func(pgx.Tx) error { return nil }, setResourceWaitReasonsSQL,
		"a", []int32{7}, []int64{1}, []string{"noop"}, []string{""}, []bool{true}, []bool{true}, []string{"{}"},
		[]string{"resources: none"}, 100)
	text := strings.Join(plan, "\n")
	if strings.Contains(text, "Seq Scan on flotilla_tasks ") || !strings.Contains(text, "flotilla_tasks_resources_waiting_idx") {
		t.Errorf("writing reasons by resources does not read the tasks needing resources by their index:\n%s", text)
	}
}

// TestTheProbeForTasksThatNeedResourcesReadsTheirIndex: before it writes
// why tasks that need resources wait, a node asks whether any does
// (needResourcesSQL), on the generic plan its connection makes once. The
// plan must read the index that holds only those tasks whatever the table
// held when it was made: analyzed with a deep backlog that needs nothing,
// or a page or none never analyzed, that then grows.
func TestTheProbeForTasksThatNeedResourcesReadsTheirIndex(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	check := func(t *testing.T, s *Store, name string) {
		t.Helper()
		plan := explainPrepared(ctx, t, s, needResourcesSettingSQL, name, needResourcesSQL, "('{7, 9}')")
		text := strings.Join(plan, "\n")
		if strings.Contains(text, "Seq Scan") || !strings.Contains(text, "flotilla_tasks_resources_waiting_idx") {
			t.Errorf("the probe for tasks that need resources does not read their index:\n%s", text)
		}
	}
	t.Run("analyzed", func(t *testing.T) {
		s := migratedStore(ctx, t)
		queueAndAnalyze(ctx, t, s, 20000, "")
		queueAndAnalyze(ctx, t, s, 5, `{"gpu": 1}`)
		check(t, s, "analyzed")
	})
	t.Run("never_analyzed", func(t *testing.T) {
		planWhileTablesGrow(t, migratedStore(ctx, t), func(t *testing.T, s *Store, rows int) {
			if _, err := s.pool.Exec(ctx, `INSERT INTO flotilla_tasks (kind, bucket, status, run_at, max_attempts, created_at, updated_at, resources)
				SELECT 'noop', 7, 'queued', now(), 3, now(), now(), CASE WHEN g % 10 = 0 THEN '{"gpu": 1}'::jsonb END
				FROM generate_series(1, $1::int) g`, rows); err != nil {
				t.Fatal(err)
			}
		}, check)
	})
}

// The reason writer never waits for a row another transaction has locked
// (a claim or an outcome write in flight): it writes the other rows, leaves
// that one to its next send, and so never holds up the lock's holder
// either. Forced here with a locking read held open on one of two rows.
func TestWaitReasonsPassOverALockedRow(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := migratedStore(ctx, t)
	created, err := s.CreateTasks(ctx, []store.NewTask{
		{Kind: "noop", Key: "a", Bucket: 7, Resources: store.Resources{"gpu": 1}},
		{Kind: "noop", Key: "b", Bucket: 7, Resources: store.Resources{"gpu": 1}},
	})
	if err != nil {
		t.Fatal(err)
	}
	leases, err := s.AcquireBuckets(ctx, store.AcquireRequest{Owner: "o", Node: "n", Buckets: bucket.Of(7), TTL: time.Minute})
	if err != nil || !leases[0].Held {
		t.Fatalf("acquire: %v %+v", err, leases)
	}
	held := []store.HeldBucket{{Bucket: 7, Epoch: leases[0].Epoch}}
	locked, free := created[0].ID, created[1].ID
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT id FROM flotilla_tasks WHERE id = $1 FOR UPDATE`, locked); err != nil {
		t.Fatal(err)
	}

	reasons := []store.WaitReason{{Kind: "noop", AllKeys: true, ByResources: true, Reason: "resources: none free"}}
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	n, err := s.SetWaitReasons(wctx, "o", held, reasons)
	wcancel()
	if err != nil || n != 1 {
		t.Fatalf("SetWaitReasons beside a locked row: %d rows, %v; want 1 row, at once", n, err)
	}
	reasonOf := func(id int64) string {
		t.Helper()
		got, err := s.GetTask(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return got.WaitReason
	}
	if got := reasonOf(free); got != reasons[0].Reason {
		t.Errorf("the free row's reason is %q, want %q", got, reasons[0].Reason)
	}
	if got := reasonOf(locked); got != "" {
		t.Errorf("the locked row got the reason %q under another transaction's lock", got)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := s.SetWaitReasons(ctx, "o", held, reasons); err != nil || n != 1 {
		t.Fatalf("SetWaitReasons once the lock is gone: %d rows, %v; want 1", n, err)
	}
	if got := reasonOf(locked); got != reasons[0].Reason {
		t.Errorf("once unlocked, the row's reason is %q, want %q", got, reasons[0].Reason)
	}
}

// TestAnOutcomeWritesPlanStaysRightAsTheTableGrows: a node's connections
// prepare the statements of an outcome write on their first use, often on
// a table of a page or two, never analyzed, and under the generic plan the
// write asks for that plan is kept for the connection's life (until an
// ANALYZE, which a server without autovacuum never runs). A lock planned
// then as a scan of the table held a node to 240 tasks a second once the
// table held a million rows. Under the write's settings, whatever the
// table held when they were planned, the lock and the advance read the
// task table by its indexes.
func TestAnOutcomeWritesPlanStaysRightAsTheTableGrows(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := migratedStore(ctx, t)
	settings := func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, advanceSettingSQL)
		return err
	}
	for _, rows := range []int{0, 50, 500} {
		if rows > 0 {
			if _, err := s.pool.Exec(ctx, `INSERT INTO flotilla_tasks (kind, bucket, status, run_at, max_attempts, created_at, updated_at)
				SELECT 'noop', 7, 'queued', now(), 3, now(), now() FROM generate_series(1, $1::int) g`, rows); err != nil {
				t.Fatal(err)
			}
		}
		lock := explainIn(ctx, t, s, settings, lockTasksSQL, []int64{1, 2})
		advance := explainIn(ctx, t, s, settings, advanceSQL, "a", []int64{1}, []int64{1}, []string{"succeeded"}, []string{""},
			[]string{""}, []*string{nil}, []*string{nil}, []int64{0}, []string{"n"}, allowedFrom, allowedTo)
		for name, plan := range map[string][]string{"lock": lock, "advance": advance} {
			if text := strings.Join(plan, "\n"); strings.Contains(text, "Seq Scan on flotilla_tasks") {
				t.Errorf("the %s of an outcome write, planned on a table of %d rows never analyzed, scans the task table:\n%s",
					name, rows, text)
			}
		}
	}
}

// TestMigrationEightListsThePipelinesOfAnOlderSchema: a database at
// schema 7 found a pipeline's tasks by an index on the task table; the
// migration to 8 lists them in flotilla_pipeline_steps, so that a pipeline
// created before it still shows every step after it.
func TestMigrationEightListsThePipelinesOfAnOlderSchema(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := New(ctx, testdb.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	all, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, createMigrationsTableSQL); err != nil {
		t.Fatal(err)
	}
	for _, m := range all[:7] {
		if _, err := s.pool.Exec(ctx, m.sql); err != nil {
			t.Fatalf("migration %s: %v", m.name, err)
		}
		if _, err := s.pool.Exec(ctx, recordMigrationSQL, m.version); err != nil {
			t.Fatal(err)
		}
	}
	// A pipeline of two steps as schema 7 stored it: its row and its tasks.
	_, err = s.pool.Exec(ctx, `
		WITH p AS (INSERT INTO flotilla_pipelines (name, key, bucket, created_at) VALUES ('old', 'k', 3, now()) RETURNING id)
		INSERT INTO flotilla_tasks (kind, key, bucket, status, run_at, max_attempts, created_at, updated_at, pipeline_id, step, deps_left)
		SELECT 'noop', 'k', 3, st, now(), 3, now(), now(), p.id, name, deps
		FROM p, (VALUES ('extract', 'queued', 0), ('load', 'pending', 1)) AS v(name, st, deps)`)
	if err != nil {
		t.Fatal(err)
	}
	if meta, err := s.Migrate(ctx, 64); err != nil || meta.SchemaVersion != SchemaVersion {
		t.Fatalf("Migrate from 7: %+v, %v; want schema version %d", meta, err, SchemaVersion)
	}
	p, err := s.GetPipeline(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, st := range p.Steps {
		names = append(names, st.Name)
	}
	if got := strings.Join(names, " "); got != "extract load" {
		t.Errorf("steps of a pipeline created at schema 7, read at 8: %q, want extract load", got)
	}
}

// TestTheCommandsPlanStaysOnThePrimaryKey: a command runs on the generic
// plan its connection made at its first command, perhaps on a table of a
// page or none, never analyzed, and kept as the table grows. Under the
// command's setting that plan reads the task by its primary key.
func TestTheCommandsPlanStaysOnThePrimaryKey(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := migratedStore(ctx, t)
	for i, rows := range []int{0, 50, 500} {
		if rows > 0 {
			if _, err := s.pool.Exec(ctx, `INSERT INTO flotilla_tasks (kind, bucket, status, run_at, max_attempts, created_at, updated_at)
				SELECT 'noop', 7, 'running', now(), 3, now(), now() FROM generate_series(1, $1::int) g`, rows); err != nil {
				t.Fatal(err)
			}
		}
		plan := explainPrepared(ctx, t, s, genericPlanSQL, fmt.Sprintf("issue_%d", i), issueSQL, "(1, 'stop', 'r', 'me', 0)")
		text := strings.Join(plan, "\n")
		if strings.Contains(text, "Seq Scan on flotilla_tasks") {
			t.Errorf("a command, planned on a table of %d rows never analyzed, scans the task table:\n%s", rows, text)
		}
		// A generic plan keeps the parameters where a custom one has values.
		if !strings.Contains(text, "id = $1") {
			t.Errorf("a command on a table of %d rows was planned for its values, not once for all:\n%s", rows, text)
		}
	}
}

// TestPendingCommandsStartFromTheCommands: every node reads its pending
// commands at each command poll and at each command notification. The
// read must start from the unacknowledged commands, which are few, and
// look each one's task up by its primary key: started from the active
// tasks' index instead, it walked every running task of the fleet (and,
// until a vacuum, the entries every finished one left there) at each poll
// of each node, a cost that grew with both. The read runs on its generic
// plan, made once per connection, so the plan must be right whatever the
// tables held when it was made: a fleet busier than when it was last
// analyzed, and tables of a page or none, never analyzed, that then grow.
func TestPendingCommandsStartFromTheCommands(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	check := func(t *testing.T, s *Store, name string) {
		t.Helper()
		plan := explainPrepared(ctx, t, s, genericPlanSQL, name, pendingCommandsSQL, "('node-1')")
		text := strings.Join(plan, "\n")
		if !strings.Contains(text, "Index Scan using flotilla_tasks_pkey") {
			t.Errorf("pending commands do not look their tasks up by id:\n%s", text)
		}
		if !strings.Contains(text, "flotilla_commands_pending_idx") {
			t.Errorf("pending commands are not read from their index:\n%s", text)
		}
		for _, bad := range []string{"flotilla_tasks_active_idx", "Seq Scan", "Hash"} {
			if strings.Contains(text, bad) {
				t.Errorf("reading pending commands walks the tasks or the commands (%s):\n%s", bad, text)
			}
		}
	}
	t.Run("busier_than_analyzed", func(t *testing.T) {
		s := migratedStore(ctx, t)
		// Statistics taken while nothing ran (20,000 finished tasks), then
		// 5,000 tasks running under other owners and one command pending.
		for _, sql := range []string{
			`INSERT INTO flotilla_tasks (kind, key, bucket, status, run_at, max_attempts, created_at, updated_at, finished_at)
			 SELECT 'noop', 'k' || g, g % 64, 'succeeded', now(), 3, now(), now(), now() FROM generate_series(1, 20000) g`,
			`ANALYZE`,
			`INSERT INTO flotilla_tasks (kind, key, bucket, status, run_at, max_attempts, created_at, updated_at, owner, lease_expires_at)
			 SELECT 'noop', 'k' || g, g % 64, 'running', now(), 3, now(), now(), 'node-' || (g % 50), now() + interval '1 minute'
			 FROM generate_series(1, 5000) g`,
			`INSERT INTO flotilla_commands (task_id, kind, reason, issued_by, issued_at, owner)
			 SELECT max(id), 'stop', '', 'me', now(), 'node-7' FROM flotilla_tasks`,
		} {
			if _, err := s.pool.Exec(ctx, sql); err != nil {
				t.Fatalf("%s: %v", sql, err)
			}
		}
		check(t, s, "busy")
	})
	t.Run("never_analyzed", func(t *testing.T) {
		planWhileTablesGrow(t, migratedStore(ctx, t), func(t *testing.T, s *Store, rows int) {
			if rows == 0 {
				return
			}
			for _, sql := range []string{
				`INSERT INTO flotilla_tasks (kind, bucket, status, run_at, max_attempts, created_at, updated_at, owner)
				 SELECT 'noop', 7, 'running', now(), 3, now(), now(), 'node-1' FROM generate_series(1, $1::int) g`,
				`INSERT INTO flotilla_commands (task_id, kind, reason, issued_by, issued_at, owner, acked_at)
				 SELECT id, 'stop', '', 'me', now(), 'node-1', now() FROM flotilla_tasks ORDER BY id DESC LIMIT $1::int`,
			} {
				if _, err := s.pool.Exec(ctx, sql, rows); err != nil {
					t.Fatalf("%s: %v", sql, err)
				}
			}
		}, check)
	})
}

// TestAnOutcomeWriteLooksForCommandsOnlyWhenOneIsPending: the outcome write
// acknowledges the pending commands of the tasks it ends (ackLeftSQL).
// With no command pending, as is usual, it must not look each task up
// among the commands; with one pending, it must (the contract's command
// cases check what it then acknowledges).
func TestAnOutcomeWriteLooksForCommandsOnlyWhenOneIsPending(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := migratedStore(ctx, t)
	leases, err := s.AcquireBuckets(ctx, store.AcquireRequest{Owner: "a", Node: "n", Buckets: bucket.Of(1), TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	const tasks = 20
	nts := make([]store.NewTask, tasks)
	for i := range nts {
		nts[i] = store.NewTask{Kind: "noop", Key: "k", Bucket: 1}
	}
	if _, err := s.CreateTasks(ctx, nts); err != nil {
		t.Fatal(err)
	}
	claimed, err := s.ClaimTasks(ctx, store.ClaimRequest{Owner: "a", Node: "n", Kinds: []string{"noop"}, Limit: tasks,
		LeaseTTL: time.Minute, Buckets: []store.HeldBucket{{Bucket: 1, Epoch: leases[0].Epoch}}})
	if err != nil || len(claimed) != tasks {
		t.Fatalf("claimed %d tasks (%v), want %d", len(claimed), err, tasks)
	}
	// The lookup of each task moved among the pending commands: its plan
	// line, and whether it ran, under EXPLAIN ANALYZE of the write as
	// AdvanceActive sends it, rolled back.
	lookup := func() (line string) {
		t.Helper()
		n := len(claimed)
		ids, seqs, delays := make([]int64, n), make([]int64, n), make([]int64, n)
		wants, texts, nodes := make([]string, n), make([]string, n), make([]string, n)
		jsons := make([]*string, n)
		for i, c := range claimed {
			ids[i], seqs[i], wants[i], nodes[i] = c.ID, c.ClaimSeq, string(task.Succeeded), "n"
		}
		tx, err := s.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, advanceSettingSQL); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, lockTasksSQL, ids); err != nil {
			t.Fatal(err)
		}
		rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) "+advanceSQL,
			"a", ids, seqs, wants, texts, texts, jsons, jsons, delays, nodes, allowedFrom, allowedTo)
		if err != nil {
			t.Fatal(err)
		}
		plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range plan {
			if strings.Contains(l, "on flotilla_commands cmd") && !strings.Contains(l, "Update on") {
				return l
			}
		}
		t.Fatalf("no lookup of the pending commands in the outcome write's plan:\n%s", strings.Join(plan, "\n"))
		return ""
	}
	if line := lookup(); !strings.Contains(line, "never executed") {
		t.Errorf("with no command pending, the outcome write of %d tasks still looked each up among the commands:\n%s", tasks, line)
	}
	if _, err := s.IssueCommand(ctx, store.NewCommand{TaskID: claimed[tasks-1].ID, Kind: store.CommandStop, IssuedBy: "op"}); err != nil {
		t.Fatal(err)
	}
	if line := lookup(); !strings.Contains(line, fmt.Sprintf("loops=%d)", tasks)) {
		t.Errorf("with a stop pending, the outcome write did not look each of its %d tasks up among the commands:\n%s", tasks, line)
	}
}

// TestTheScheduleLoopsReadsStayOnTheDueIndex: every node's schedule loop
// reads the next tick and the due schedules of its buckets every few
// seconds, on the generic plans its connection makes once. The plans must
// read the due index whatever the schedule table held when they were made:
// many schedules analyzed, or a page or none never analyzed, that then grows.
func TestTheScheduleLoopsReadsStayOnTheDueIndex(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	addSchedules := func(t *testing.T, s *Store, n int) {
		t.Helper()
		if _, err := s.pool.Exec(ctx, `INSERT INTO flotilla_schedules (name, spec, kind, bucket, next_fire_at, created_at, updated_at)
			SELECT 's' || g || '-' || $1::int, '@every 1m', 'noop', g % 64, now() + g * interval '1 second', now(), now()
			FROM generate_series(1, $1::int) g`, n); err != nil {
			t.Fatal(err)
		}
	}
	check := func(t *testing.T, s *Store, name string) {
		t.Helper()
		for i, read := range []struct{ sql, args string }{
			{nextScheduleFireSQL, "('{3, 17}')"},
			{dueSchedulesSQL, "('{3, 17}', 500)"},
		} {
			plan := explainPrepared(ctx, t, s, scheduleReadSettingSQL, fmt.Sprintf("%s_%d", name, i), read.sql, read.args)
			text := strings.Join(plan, "\n")
			if strings.Contains(text, "Seq Scan") || !strings.Contains(text, "flotilla_schedules_due_idx") {
				t.Errorf("a read of the schedule loop does not use the due index:\n%s\n%s", read.sql, text)
			}
		}
	}
	t.Run("analyzed", func(t *testing.T) {
		planAfterAnalyze(ctx, t, migratedStore(ctx, t), "flotilla_schedules", 10000, addSchedules, check)
	})
	t.Run("never_analyzed", func(t *testing.T) {
		planWhileTablesGrow(t, migratedStore(ctx, t), addSchedules, check)
	})
}

// TestALeaseRenewalReadsOnlyItsBuckets: every node renews its bucket leases
// at each heartbeat (acquireSQL, on the lease pool). In a fleet of 1,024
// buckets, a node holding 16 must read those 16 leases by their key, never
// the whole lease table, or the renewals' cost grows with the fleet.
func TestALeaseRenewalReadsOnlyItsBuckets(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := migratedFleet(ctx, t, 1024)
	held, err := bucket.ParseSet("16-31", 1024)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.AcquireBuckets(ctx, store.AcquireRequest{Owner: "a", Node: "n", Buckets: held, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	// As AcquireBuckets runs it: on the lease pool, under its setting, on
	// a custom plan; as a node that takes every free bucket asks, and as a
	// balancing node, which names what it may take.
	for _, take := range []any{nil, bucketArray(held)} {
		var plan []string
		err = pgx.BeginFunc(ctx, s.leases, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, acquireSettingSQL); err != nil {
				return err
			}
			rows, err := tx.Query(ctx, "EXPLAIN "+acquireSQL, bucketArray(held), "a", "n", time.Minute.Microseconds(), take, nil)
			if err != nil {
				return err
			}
			plan, err = pgx.CollectRows(rows, pgx.RowTo[string])
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if text := strings.Join(plan, "\n"); strings.Contains(text, "Seq Scan") {
			t.Errorf("renewing 16 leases of 1,024 (take %v) reads the lease table whole:\n%s", take, text)
		}
	}
}

// TestConnectionsRunWithoutJIT: the store's connections, of both pools,
// never compile a statement (see New).
func TestConnectionsRunWithoutJIT(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := migratedStore(ctx, t)
	for name, pool := range map[string]*pgxpool.Pool{"main": s.pool, "lease": s.leases} {
		var jit string
		if err := pool.QueryRow(ctx, `SHOW jit`).Scan(&jit); err != nil {
			t.Fatal(err)
		}
		if jit != "off" {
			t.Errorf("the %s pool's connections run with jit %s, want off", name, jit)
		}
	}
}

// TestTheExpiredTasksReadProbesEachHeldBucket: every node looks for expired
// task leases in the buckets it holds (expiredSQL) at each acquisition and
// every ReconcileInterval. In a fleet of 1,024 buckets a node holding 16
// must read the active-rows index of those 16, one probe per bucket, never
// the whole index: that holds every running task of the fleet (and, until
// a vacuum, an entry for each that has finished since), so reading it whole
// made each node's pass cost what the whole fleet runs. The plan is checked
// on analyzed tables and on tables of 0, 50 and 500 rows never analyzed.
func TestTheExpiredTasksReadProbesEachHeldBucket(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	addRunning := func(t *testing.T, s *Store, n int) {
		t.Helper()
		if _, err := s.pool.Exec(ctx, `INSERT INTO flotilla_tasks
			(kind, bucket, status, run_at, max_attempts, created_at, updated_at, owner, node, epoch, lease_expires_at, claim_seq, attempt)
			SELECT 'noop', g % 1024, 'running', now(), 3, now(), now(), 'o' || (g % 64), 'n', 1, now() + interval '1 minute', 1, 1
			FROM generate_series(1, $1::int) g`, n); err != nil {
			t.Fatal(err)
		}
	}
	var buckets, epochs []string
	for b := 16; b < 32; b++ {
		buckets = append(buckets, strconv.Itoa(b))
		epochs = append(epochs, "1")
	}
	args := "('{" + strings.Join(buckets, ",") + "}', '{" + strings.Join(epochs, ",") + "}', 100)"
	check := func(t *testing.T, s *Store, name string) {
		t.Helper()
		text := strings.Join(explainPrepared(ctx, t, s, expiredSettingSQL, name, expiredSQL, args), "\n")
		if strings.Contains(text, "Seq Scan on flotilla_tasks") || !strings.Contains(text, "flotilla_tasks_active_idx") ||
			!strings.Contains(text, "Index Cond: (bucket = h.bucket)") {
			t.Errorf("the read of expired tasks does not probe the active-rows index of each held bucket:\n%s", text)
		}
	}
	t.Run("analyzed", func(t *testing.T) {
		planAfterAnalyze(ctx, t, migratedFleet(ctx, t, 1024), "flotilla_tasks", 20000, addRunning, check)
	})
	t.Run("never_analyzed", func(t *testing.T) {
		planWhileTablesGrow(t, migratedFleet(ctx, t, 1024), addRunning, check)
	})
}

func TestWhereNamesEveryHostOfAMultiHostDSN(t *testing.T) {
	t.Parallel()
	tests := []struct{ dsn, want string }{
		{"postgres://u:secret@h1:5432/db?sslmode=disable", "h1:5432/db"},
		{"postgres://u:secret@h1:5432,h2:5433/db?sslmode=disable&target_session_attrs=read-write", "h1:5432,h2:5433/db"},
		{"postgres://u:secret@h1:5432,h2:5433/db?sslmode=prefer", "h1:5432,h2:5433/db"},
		{"postgres://u@[::1]:5432,[::1]:5433/db?sslmode=disable", "[::1]:5432,[::1]:5433/db"},
	}
	for _, tt := range tests {
		cfg, err := pgxpool.ParseConfig(tt.dsn)
		if err != nil {
			t.Fatalf("ParseConfig(%q): %v", tt.dsn, err)
		}
		if got := where(cfg); got != tt.want {
			t.Errorf("where(%q) = %q, want %q", tt.dsn, got, tt.want)
		}
	}
}

// TestAPruneReadsPipelineRowsByID: a batch locks the rows of its
// candidates' pipelines and checks which are gone by their ids: with many
// pipelines in the table, neither is a scan or a hash of the pipelines
// table.
func TestAPruneReadsPipelineRowsByID(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := migratedStore(ctx, t)
	for _, sql := range []string{
		`INSERT INTO flotilla_pipelines (id, name, key, bucket, created_at)
		 SELECT g, 'p', 'p-' || g, g % 64, now() FROM generate_series(1, 20000) g`,
		`INSERT INTO flotilla_tasks (kind, key, bucket, status, run_at, max_attempts, created_at, updated_at, finished_at,
		                            pipeline_id, step, deps_left)
		 SELECT 'noop', 'p-' || g, g % 64, 'succeeded', now(), 3, now(), now(), now() - interval '30 days', g, 's', 0
		 FROM generate_series(1, 20000) g`,
		`INSERT INTO flotilla_pipeline_steps (pipeline_id, task_id) SELECT pipeline_id, id FROM flotilla_tasks`,
		`ANALYZE`,
	} {
		if _, err := s.pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	day := (24 * time.Hour).Milliseconds()
	plan := explainIn(ctx, t, s, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, pruneSettingSQL)
		return err
	}, pruneSQL, 7, "a", int64(1), []string{""}, []string{"succeeded"}, []int64{day},
		[]string{"succeeded"}, []int64{day}, 1000)
	text := strings.Join(plan, "\n")
	for _, bad := range []string{"Seq Scan on flotilla_pipelines ", "Hash Join", "Hash Anti Join", "Hash Semi Join"} {
		if strings.Contains(text, bad) {
			t.Errorf("the prune's plan has a %s:\n%s", strings.TrimSpace(bad), text)
		}
	}
}
