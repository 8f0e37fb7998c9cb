package integration

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "modernc.org/sqlite" // the connection that checks the write lock

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// The scenarios of this file run worker processes on one SQLite file,
// whatever store the run asks for: the fleet on one machine, broken with
// kill -9, SIGSTOP and SIGTERM while it works. Each checks its outcome from
// the audit trail: every task finished, none succeeded twice, and nothing
// written by a process after its buckets changed hands. (The scenarios with
// a TCP proxy or a server restart are PostgreSQL's alone.)

// newSQLiteFleet is a fleet on an SQLite file of the test's own.
func newSQLiteFleet(t *testing.T) *fleet {
	t.Helper()
	return newFleetOn(t, newSQLiteDatabase(t))
}

// successes counts the moves of a task to succeeded in its audit trail.
func successes(events []task.Event) int {
	n := 0
	for _, e := range events {
		if e.To == task.Succeeded {
			n++
		}
	}
	return n
}

// TestSQLiteIsTheDefaultStore: `worker run` and `worker submit` with no
// --dsn, no --dsn-file and no $FLOTILLA_DSN share flotilla.db in their
// working directory; run logs the file's absolute path.
func TestSQLiteIsTheDefaultStore(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "flotilla.db")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var log syncBuffer
	run := workerCommand(ctx, "", "run", "--node-id", "solo")
	run.Dir, run.Stdout, run.Stderr = dir, &log, &log
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = killGroup(run.Process.Pid)
		_ = run.Wait()
		if t.Failed() {
			t.Logf("output of worker run:\n%s", log.String())
		}
	})
	eventually(t, startWithin, "worker run logs the default file's absolute path", func() bool {
		return strings.Contains(log.String(), path) && strings.Contains(log.String(), "node started")
	})

	submit := workerCommand(ctx, "", "submit", "--kind", "noop", "--key", "k")
	submit.Dir = dir
	var stdout, stderr bytes.Buffer
	submit.Stdout, submit.Stderr = &stdout, &stderr
	if err := submit.Run(); err != nil {
		t.Fatalf("worker submit: %v; stderr: %s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "using the SQLite file "+path) {
		t.Errorf("worker submit did not say which file it uses: %q", stderr.String())
	}
	id := parseID(t, stdout.String())
	f := newFleetOn(t, "sqlite:"+path)
	f.waitForTask(id, "succeeded", succeeded)
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
}

// syncBuffer is a bytes.Buffer that a process's output and the test use
// at once.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestSQLiteKill9UnderLoad: three processes on one file, two of them for
// the same buckets; the holder of 0-31 is killed with SIGKILL while it runs
// tasks. The standby takes its buckets under a higher epoch and rescues
// what it left running; every task ends succeeded, once.
func TestSQLiteKill9UnderLoad(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	takeFleetSlot(t)
	f := newSQLiteFleet(t)
	low, high := mustSet(t, "0-31"), mustSet(t, "32-63")
	// Leases long enough that the slow statements of race-enabled
	// binaries on a loaded machine do not lose them by themselves.
	flags := []string{"--bucket-lease-ttl", leaseTTL(4 * time.Second).String(), "--task-lease-ttl", leaseTTL(6 * time.Second).String(), "--poll-interval", "200ms"}
	holder := f.worker(append([]string{"run", "--buckets", "0-31", "--node-id", "holder", "--no-balance"}, flags...)...)
	f.worker(append([]string{"run", "--buckets", "32-63", "--node-id", "other"}, flags...)...)
	before := epochs(f.waitUntilHeld("holder", low, startWithin), low)
	f.waitUntilHeld("other", high, startWithin)
	f.worker(append([]string{"run", "--buckets", "0-31", "--node-id", "standby", "--no-balance"}, flags...)...)
	f.waitUntilStandingBy("standby", low)

	var ids []int64
	for i := range 40 {
		ids = append(ids, f.submit("--kind", "sleep", "--key", fmt.Sprintf("order-%d", i), "--payload", `{"duration":"500ms"}`))
	}
	eventually(t, taskWithin, "the holder runs some of the tasks", func() bool {
		running, err := f.list(store.TaskFilter{Statuses: []task.Status{task.Running}})
		if err != nil {
			return false
		}
		for _, tk := range running {
			if tk.Node == "holder" {
				return true
			}
		}
		return false
	})
	holder.kill9()
	after := f.waitUntilHeld("standby", low, failoverWithin)
	for b, e := range epochs(after, low) {
		if e <= before[b] {
			t.Errorf("bucket %d: epoch %d after the takeover, want it above %d", b, e, before[b])
		}
	}
	for _, id := range ids {
		r := f.waitForTask(id, "succeeded", succeeded)
		if n := successes(r.Events); n != 1 {
			t.Errorf("task %d succeeded %d times in its trail, want once: %s", id, n, describeTask(r))
		}
	}
}

// TestSQLiteFrozenHolderIsFenced: a holder stopped with SIGSTOP past its
// leases (as in a long pause) loses its buckets to the standby, which
// rescues the task it was running and runs it again. When the holder wakes,
// its attempt's late completion is refused: the trail shows one success, by
// the standby, and nothing from the holder after the takeover.
func TestSQLiteFrozenHolderIsFenced(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	f := newSQLiteFleet(t)
	low := mustSet(t, "0-31")
	// Leases long enough that the slow statements of race-enabled
	// binaries on a loaded machine do not lose them by themselves.
	flags := []string{"--bucket-lease-ttl", leaseTTL(4 * time.Second).String(), "--task-lease-ttl", leaseTTL(6 * time.Second).String(), "--poll-interval", "200ms"}
	holder := f.worker(append([]string{"run", "--buckets", "0-31", "--node-id", "holder", "--no-balance"}, flags...)...)
	before := epochs(f.waitUntilHeld("holder", low, startWithin), low)
	f.worker(append([]string{"run", "--buckets", "0-31", "--node-id", "standby", "--no-balance"}, flags...)...)
	f.waitUntilStandingBy("standby", low)

	key := keyIn(t, f.policy, low, "frozen")
	// Long enough to outlast the freeze's tries: each stops the holder,
	// and lets it go on when it holds the write lock, so on a loaded
	// machine a task of 2 s finished, and its outcome was written, before
	// the freeze took hold.
	id := f.submit("--kind", "sleep", "--key", key, "--payload", `{"duration":"10s"}`)
	f.waitForTask(id, "running on holder", func(tk *task.Task) bool {
		return tk.Status == task.Running && tk.Node == "holder"
	})

	freezeOutsideTheWriteLock(t, f, holder)
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			_ = syscall.Kill(holder.cmd.Process.Pid, syscall.SIGCONT)
		}
	}
	defer thaw()
	after := f.waitUntilHeld("standby", low, failoverWithin)
	b := f.policy.Of(key)
	if after[b].Epoch <= before[b] {
		t.Fatalf("bucket %d: epoch %d after the takeover, want it above %d", b, after[b].Epoch, before[b])
	}
	done := f.waitForTask(id, "succeeded on the standby", func(tk *task.Task) bool {
		return tk.Status == task.Succeeded
	})
	if done.Task.Node != "standby" {
		t.Fatalf("task %d succeeded on %q, want the standby: %s", id, done.Task.Node, describeTask(done))
	}

	thaw()
	thawedAt := time.Now()
	// The holder has run again once it heartbeats; by then its handler's
	// sleep, long over, has returned and its completion has been tried.
	eventually(t, taskWithin, "the woken holder runs again", func() bool {
		n, ok := f.node("holder")
		return ok && n.HeartbeatAt.After(thawedAt.Add(-time.Second)) || holder.exited()
	})
	// It finds its leases past their local deadline (or lost) and drops
	// its attempt: nothing is written for it, or the write is fenced.
	eventually(t, taskWithin, "the woken holder lets its attempt go", func() bool {
		out := holder.output()
		return strings.Contains(out, "deadline passed") || strings.Contains(out, "lease lost") || strings.Contains(out, "leases lost") ||
			strings.Contains(out, "fenced") || holder.exited()
	})
	final := f.mustGet(id)
	if final.Task.Status != task.Succeeded || successes(final.Events) != 1 {
		t.Fatalf("after the holder woke, task %d: %s; want one success, the standby's", id, describeTask(final))
	}
	for _, e := range final.Events {
		if e.Node == "holder" && e.Epoch != before[b] {
			t.Errorf("an event by the holder under epoch %d, not its own %d: %+v", e.Epoch, before[b], e)
		}
	}
	if bs := f.mustBuckets(); !allHeldBy(bs, low, "standby") {
		t.Errorf("after the holder woke, holders are %s; want the standby's", describeHolders(bs))
	}
}

// freezeOutsideTheWriteLock stops p with SIGSTOP at a moment it does not
// hold the file's write lock. A process frozen inside a write transaction
// stops every writer of the file until it resumes, as an operator's open
// transaction would (see store/sqlite's doc): the fleet cannot fail over
// then, by design, and the scenario is about the failover. So: stop it,
// and if another connection cannot take the write lock at once, let it run
// a moment and try again.
func freezeOutsideTheWriteLock(t *testing.T, f *fleet, p *proc) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+strings.TrimPrefix(f.dsn, "sqlite:")+"?_pragma=busy_timeout(200)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	pid := p.cmd.Process.Pid
	ok := poll(startWithin, func() bool {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatalf("SIGSTOP: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), queryTimeout)
		defer cancel()
		conn, err := db.Conn(ctx)
		if err == nil {
			defer conn.Close()
			if _, err = conn.ExecContext(ctx, `BEGIN IMMEDIATE`); err == nil {
				_, err = conn.ExecContext(ctx, `ROLLBACK`)
			}
		}
		if err == nil {
			return true
		}
		_ = syscall.Kill(pid, syscall.SIGCONT)
		return false
	})
	if !ok {
		t.Fatalf("could not freeze %s outside a write transaction within %v", p.name, startWithin)
	}
}

// TestSQLiteSigtermUnderLoad: a holder stopped with SIGTERM while it runs
// tasks finishes or hands back what it runs, releases its buckets, exits 0,
// and the standby runs the rest; every task succeeds once.
func TestSQLiteSigtermUnderLoad(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	takeFleetSlot(t)
	f := newSQLiteFleet(t)
	low := mustSet(t, "0-31")
	holder := f.worker("run", "--buckets", "0-31", "--node-id", "holder", "--concurrency", "4", "--poll-interval", "200ms",
		"--no-balance")
	f.waitUntilHeld("holder", low, startWithin)
	f.worker("run", "--buckets", "0-31", "--node-id", "standby", "--poll-interval", "200ms", "--no-balance")
	f.waitUntilStandingBy("standby", low)

	var ids []int64
	for i := range 30 {
		key := keyIn(t, f.policy, low, fmt.Sprintf("term-%d-", i))
		ids = append(ids, f.submit("--kind", "sleep", "--key", key, "--payload", `{"duration":"300ms"}`))
	}
	f.waitForTask(ids[0], "running or done", func(tk *task.Task) bool { return tk.Status != task.Queued })
	holder.term()
	if code := holder.wait(time.Minute); code != 0 {
		t.Errorf("holder exited %d after SIGTERM, want 0", code)
	}
	f.waitUntilHeld("standby", low, 10*time.Second)
	for _, id := range ids {
		r := f.waitForTask(id, "succeeded", succeeded)
		if n := successes(r.Events); n != 1 {
			t.Errorf("task %d succeeded %d times in its trail, want once: %s", id, n, describeTask(r))
		}
	}
}
