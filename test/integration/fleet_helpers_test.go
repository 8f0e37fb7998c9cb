package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/patience"
	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/postgres"
	"github.com/flotilla-dev/flotilla/task"
)

const (
	// fleetBuckets is the bucket count of every fleet here: the default.
	fleetBuckets = bucket.DefaultCount

	// Deadlines for outcomes against real PostgreSQL on a loaded machine.
	// They bound a failing test's run time; a passing test waits only as
	// long as the fleet needs.
	startWithin = 30 * time.Second // a started worker holds its buckets
	taskWithin  = 30 * time.Second // a submitted task reaches the state awaited
)

// queryTimeout bounds each read of the fleet's state, so that one stuck
// query cannot outlast the deadline of the wait it is part of; stretched
// for the machine's load when the tests start.
var queryTimeout = patience.Scale(5 * time.Second)

// fleet is one test's database, migrated by `worker migrate`, with a client
// to read its state.
type fleet struct {
	t      *testing.T
	dsn    string
	client *flotilla.Client
	policy bucket.Policy
}

// newFleet is a fleet on a database of the test's own: PostgreSQL, or an
// SQLite file in the test's temporary directory when the run asks for the
// SQLite store (see testStore).
func newFleet(t *testing.T) *fleet {
	t.Helper()
	return newFleetOn(t, newDatabase(t))
}

// testStoreEnv picks the store of the tests that run on either: unset or
// "postgres" for PostgreSQL, "sqlite" for SQLite. TestCLIOnSQLite runs the
// CLI tests a second time with it set to sqlite.
const testStoreEnv = "FLOTILLA_TEST_STORE"

// onSQLite reports whether this run puts fleets on SQLite.
func onSQLite(t *testing.T) bool {
	t.Helper()
	switch v := os.Getenv(testStoreEnv); v {
	case "", "postgres":
		return false
	case "sqlite":
		return true
	default:
		t.Fatalf("%s=%q: give postgres or sqlite", testStoreEnv, v)
		return false
	}
}

// newDatabase returns the DSN of a new, empty database for one test, on the
// store the run asks for.
func newDatabase(t *testing.T) string {
	t.Helper()
	if onSQLite(t) {
		return newSQLiteDatabase(t)
	}
	return testdb.New(t)
}

// newSQLiteDatabase returns the DSN of a new SQLite file in the test's
// temporary directory, removed after the test's processes are reaped.
func newSQLiteDatabase(t *testing.T) string {
	t.Helper()
	return "sqlite:" + filepath.Join(t.TempDir(), "fleet.db")
}

// needsPostgres fails a test that only makes sense on PostgreSQL when the
// run asks for SQLite, so that a second pass never runs it by mistake.
func needsPostgres(t *testing.T) {
	t.Helper()
	if onSQLite(t) {
		t.Fatalf("this test needs PostgreSQL; run it without %s=sqlite", testStoreEnv)
	}
}

// newFleetOn is newFleet on a database of the test's, reached through dsn.
func newFleetOn(t *testing.T, dsn string) *fleet {
	t.Helper()
	stdout, stderr, code := runCLI(t, dsn, "migrate")
	if code != 0 {
		t.Fatalf("worker migrate exited %d: %s", code, stderr)
	}
	if want := fmt.Sprintf("%d buckets", fleetBuckets); !strings.Contains(stdout, want) {
		t.Fatalf("worker migrate printed %q, want it to mention %q", stdout, want)
	}
	ctx, cancel := context.WithTimeout(t.Context(), queryTimeout)
	defer cancel()
	client, err := flotilla.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect a client: %v", err)
	}
	t.Cleanup(client.Close) // before the database is dropped
	return &fleet{t: t, dsn: dsn, client: client, policy: client.Policy()}
}

// worker starts `worker args...` on the fleet's database.
func (f *fleet) worker(args ...string) *proc {
	f.t.Helper()
	return startWorker(f.t, f.dsn, args...)
}

// cli runs a one-shot `worker args...` on the fleet's database.
func (f *fleet) cli(args ...string) (stdout, stderr string, exitCode int) {
	f.t.Helper()
	return runCLI(f.t, f.dsn, args...)
}

// submit runs `worker submit args...`, which must succeed, and returns the
// id it printed.
func (f *fleet) submit(args ...string) int64 {
	f.t.Helper()
	stdout, stderr, code := f.cli(append([]string{"submit"}, args...)...)
	if code != 0 {
		f.t.Fatalf("worker submit %s exited %d: %s", strings.Join(args, " "), code, stderr)
	}
	return parseID(f.t, stdout)
}

func parseID(t *testing.T, stdout string) int64 {
	t.Helper()
	id, err := strconv.ParseInt(strings.TrimSpace(stdout), 10, 64)
	if err != nil || id <= 0 {
		t.Fatalf("worker submit printed %q, want a task id", stdout)
	}
	return id
}

func (f *fleet) buckets() ([]flotilla.BucketReport, error) {
	ctx, cancel := context.WithTimeout(f.t.Context(), queryTimeout)
	defer cancel()
	return f.client.Buckets(ctx)
}

func (f *fleet) mustBuckets() []flotilla.BucketReport {
	f.t.Helper()
	bs, err := f.buckets()
	if err != nil {
		f.t.Fatalf("read the buckets: %v", err)
	}
	return bs
}

func (f *fleet) nodes() []store.NodeInfo {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.t.Context(), queryTimeout)
	defer cancel()
	ns, err := f.client.Nodes(ctx)
	if err != nil {
		f.t.Fatalf("read the nodes: %v", err)
	}
	return ns
}

func (f *fleet) node(id string) (store.NodeInfo, bool) {
	f.t.Helper()
	for _, n := range f.nodes() {
		if n.ID == id {
			return n, true
		}
	}
	return store.NodeInfo{}, false
}

func (f *fleet) get(id int64) (*flotilla.TaskReport, error) {
	ctx, cancel := context.WithTimeout(f.t.Context(), queryTimeout)
	defer cancel()
	return f.client.Report(ctx, id)
}

func (f *fleet) mustGet(id int64) *flotilla.TaskReport {
	f.t.Helper()
	r, err := f.get(id)
	if err != nil {
		f.t.Fatalf("get task %d: %v", id, err)
	}
	return r
}

func (f *fleet) list(filter store.TaskFilter) ([]*task.Task, error) {
	ctx, cancel := context.WithTimeout(f.t.Context(), queryTimeout)
	defer cancel()
	return f.client.List(ctx, filter)
}

// waitUntilHeld waits until node holds every bucket of set, and returns the
// buckets as they were then.
func (f *fleet) waitUntilHeld(node string, set bucket.Set, within time.Duration) []flotilla.BucketReport {
	f.t.Helper()
	var (
		last    []flotilla.BucketReport
		lastErr error
	)
	held := poll(within, func() bool {
		last, lastErr = f.buckets()
		return lastErr == nil && allHeldBy(last, set, node)
	})
	if !held {
		f.t.Fatalf("after %v, buckets %s are not all held by %s: %s (last error: %v)",
			within, set, node, describeHolders(last), lastErr)
	}
	return last
}

// waitUntilStandingBy waits until node is registered, alive, and listed as
// standing by for every bucket of set.
func (f *fleet) waitUntilStandingBy(node string, set bucket.Set) {
	f.t.Helper()
	var last []flotilla.BucketReport
	ok := poll(startWithin, func() bool {
		bs, err := f.buckets()
		if err != nil {
			return false
		}
		last = bs
		for _, b := range bs {
			if set.Contains(b.Bucket) && !slices.Contains(b.Standby, node) {
				return false
			}
		}
		return true
	})
	if !ok {
		f.t.Fatalf("after %v, %s is not standing by for every bucket of %s: %s",
			startWithin, node, set, describeStandby(last))
	}
}

// waitUntilListeningForReleases waits until count sessions on the fleet's
// database listen for bucket releases: the sessions that a node opens when
// it starts, after its first lease tick, and through which a standby hears
// at once that a holder has released its buckets.
//
// On SQLite there is nothing to count: a node reads the outbox from the
// moment it listens, and a release announced before that reaches it at its
// next heartbeat instead, which the callers' bounds allow for.
func (f *fleet) waitUntilListeningForReleases(count int) {
	f.t.Helper()
	pg, ok := f.client.Store().(*postgres.Store)
	if !ok {
		return
	}
	// A listening session's last statement is its LISTEN, and the
	// bucket topic is the last one a node listens to.
	const listenersSQL = `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query = $1`
	listen := "LISTEN " + pgx.Identifier{string(store.TopicBuckets)}.Sanitize()
	var listening int
	eventually(f.t, startWithin, fmt.Sprintf("%d sessions listen for bucket releases", count), func() bool {
		ctx, cancel := context.WithTimeout(f.t.Context(), queryTimeout)
		defer cancel()
		err := pg.Pool().QueryRow(ctx, listenersSQL, listen).Scan(&listening)
		return err == nil && listening >= count
	})
}

// waitForTask waits until the task satisfies cond, and returns it then.
func (f *fleet) waitForTask(id int64, what string, cond func(*task.Task) bool) *flotilla.TaskReport {
	f.t.Helper()
	var (
		last    *flotilla.TaskReport
		lastErr error
	)
	ok := poll(taskWithin, func() bool {
		last, lastErr = f.get(id)
		return lastErr == nil && cond(last.Task)
	})
	if !ok {
		f.t.Fatalf("after %v, task %d is not %s: %s (last error: %v)", taskWithin, id, what, describeTask(last), lastErr)
	}
	return last
}

func succeeded(t *task.Task) bool { return t.Status == task.Succeeded }

// epochs maps each bucket of set to its epoch.
func epochs(bs []flotilla.BucketReport, set bucket.Set) map[int]int64 {
	out := map[int]int64{}
	for _, b := range bs {
		if set.Contains(b.Bucket) {
			out[b.Bucket] = b.Epoch
		}
	}
	return out
}

func allHeldBy(bs []flotilla.BucketReport, set bucket.Set, node string) bool {
	seen := 0
	for _, b := range bs {
		if !set.Contains(b.Bucket) {
			continue
		}
		if b.Holder != node {
			return false
		}
		seen++
	}
	return seen == set.Len()
}

// describeHolders summarises who holds what: "0-31 a; 32-63 (nobody)".
func describeHolders(bs []flotilla.BucketReport) string {
	if len(bs) == 0 {
		return "(no buckets read)"
	}
	byHolder := map[string][]int{}
	for _, b := range bs {
		holder := b.Holder
		if holder == "" {
			holder = "(nobody)"
		}
		byHolder[holder] = append(byHolder[holder], b.Bucket)
	}
	return describeGroups(byHolder)
}

// describeStandby summarises who stands by where: "0-31 b; 32-63 (nobody)".
func describeStandby(bs []flotilla.BucketReport) string {
	if len(bs) == 0 {
		return "(no buckets read)"
	}
	byStandby := map[string][]int{}
	for _, b := range bs {
		standby := strings.Join(b.Standby, ",")
		if standby == "" {
			standby = "(nobody)"
		}
		byStandby[standby] = append(byStandby[standby], b.Bucket)
	}
	return describeGroups(byStandby)
}

func describeGroups(groups map[string][]int) string {
	parts := make([]string, 0, len(groups))
	for name, bs := range groups {
		parts = append(parts, bucket.Of(bs...).String()+" "+name)
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}

func describeTask(r *flotilla.TaskReport) string {
	if r == nil {
		return "(not read)"
	}
	t := r.Task
	s := fmt.Sprintf("status %s, attempt %d of %d, node %q, epoch %d", t.Status, t.Attempt, t.MaxAttempts, t.Node, t.Epoch)
	if t.Error != "" {
		s += fmt.Sprintf(", error %q", t.Error)
	}
	if r.Waiting != "" {
		s += fmt.Sprintf(", waiting: %s", r.Waiting)
	}
	return s
}

// mustSet parses a bucket set of the fleet.
func mustSet(t *testing.T, spec string) bucket.Set {
	t.Helper()
	s, err := bucket.ParseSet(spec, fleetBuckets)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// keyIn returns the first key "<prefix>-<n>" that hashes into set.
func keyIn(t *testing.T, policy bucket.Policy, set bucket.Set, prefix string) string {
	t.Helper()
	for n := range 100_000 {
		key := fmt.Sprintf("%s-%d", prefix, n)
		if set.Contains(policy.Of(key)) {
			return key
		}
	}
	t.Fatalf("no key %s-<n> hashes into buckets %s", prefix, set)
	return ""
}

// decodeJSON decodes a command's JSON output, failing the test if it is not.
func decodeJSON(t *testing.T, what, stdout string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(stdout), v); err != nil {
		t.Fatalf("%s printed invalid JSON (%v):\n%s", what, err, stdout)
	}
}
