package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/task"
)

// A second Ctrl-C forces the exit, but not at the cost of a task left
// running for a stopped node: every handler is cancelled, those that return
// within a moment are released (back to queued, the attempt not counted)
// and their buckets released; a handler that does not return is named, and
// only its bucket is left to lapse.
func TestASecondSignalReleasesWhatItsHandlersLeave(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	f := newFleet(t)
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	p := f.worker("run", "--node-id", "leaver", "--concurrency", "16", "--poll-interval", "200ms",
		"--bucket-lease-ttl", "1m", "--stop-grace", "1m", "--allow-exec", sh)
	all := bucket.All(fleetBuckets)
	f.waitUntilHeld("leaver", all, startWithin)

	// A handler that ignores its cancellation: a shell that ignores
	// SIGTERM. Its loop of short sleeps ends by itself once the shell dies
	// with the node (the exec kind's parent-death signal).
	stuckBucket := bucket.Of(0)
	stuck := f.submit("--kind", "exec", "--key", keyIn(t, f.policy, stuckBucket, "stuck"), "--max-attempts", "1",
		"--payload", fmt.Sprintf(`{"argv":[%q,"-c","trap '' TERM; while :; do sleep 1; done"]}`, sh))
	rest := all.Minus(stuckBucket)
	// Handlers that return once cancelled: at once (sleep), or a moment
	// later (a shell that takes 200ms to end on SIGTERM), which a node
	// that did not wait for them at all would miss.
	var released []int64
	for i := range 4 {
		released = append(released, f.submit("--kind", "sleep", "--key", keyIn(t, f.policy, rest, fmt.Sprintf("sleeper-%d", i)),
			"--max-attempts", "1", "--payload", `{"duration":"1h"}`))
		released = append(released, f.submit("--kind", "exec", "--key", keyIn(t, f.policy, rest, fmt.Sprintf("slow-%d", i)),
			"--max-attempts", "1",
			"--payload", fmt.Sprintf(`{"argv":[%q,"-c","trap 'sleep 0.2; exit 0' TERM; while :; do sleep 1; done"]}`, sh)))
	}
	for _, id := range append([]int64{stuck}, released...) {
		f.waitForTask(id, "running", func(tk *task.Task) bool { return tk.Status == task.Running })
	}

	signal := func() {
		t.Helper()
		if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatalf("SIGINT: %v", err)
		}
	}
	signal()
	eventually(t, time.Minute, "the node says it shuts down", func() bool {
		return strings.Contains(p.output(), "press Ctrl-C again to force")
	})
	signal()
	p.wait(time.Minute)

	for _, id := range released {
		r := f.mustGet(id)
		if r.Task.Status != task.Queued || r.Task.Attempt != 0 {
			t.Errorf("task %d after the forced exit: %s, attempt %d; want queued, the attempt not counted: %s",
				id, r.Task.Status, r.Task.Attempt, describeTask(r))
		}
	}
	if r := f.mustGet(stuck); r.Task.Status != task.Running {
		t.Errorf("the task whose handler never returned is %s, want running until its lease lapses", r.Task.Status)
	}
	for _, b := range f.mustBuckets() {
		switch {
		case b.Bucket == 0 && b.Holder != "leaver":
			t.Errorf("bucket 0, whose handler still ran, is held by %q; want its lease left to lapse", b.Holder)
		case b.Bucket != 0 && b.Holder != "":
			t.Errorf("bucket %d is still held by %q after the forced exit", b.Bucket, b.Holder)
		}
	}
	out := p.output()
	for _, want := range []string{"forced exit: handlers still running", strconv.FormatInt(stuck, 10)} {
		if !strings.Contains(out, want) {
			t.Errorf("the node's log does not say %q of what it left", want)
		}
	}
}

// Read commands open the file read-only: a file this user may read but not
// write (another user's, or a backup), in a directory this user may not
// write, can be listed. A write there says which directory it needs.
func TestReadCommandsReadAFileThisUserMayOnlyRead(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	f := newSQLiteFleet(t)
	id := f.submit("--kind", "noop", "--key", "k", "--allow-unowned")
	path := strings.TrimPrefix(f.dsn, "sqlite:")
	dir := filepath.Dir(path)
	// At rest first: no process has the file open, and its -wal and -shm
	// are gone with the last one that had.
	f.client.Close()

	// As root the test runs the commands as nobody, whom the permissions
	// bind; otherwise as itself.
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		cred = &syscall.Credential{Uid: 65534, Gid: 65534}
	}
	bin := filepath.Join(t.TempDir(), "worker")
	copyFile(t, workerBinary, bin, 0o755) // a file another user may run
	for _, d := range []string{filepath.Dir(filepath.Dir(bin)), filepath.Dir(bin), filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(path, 0o444); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o555); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Chmod(dir, 0o755) }) // so that the test's directory can be removed
	as := func(args ...string) cliResult {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), oneShotTimeout)
		defer cancel()
		cmd := binaryCommand(ctx, bin, f.dsn, args...)
		cmd.SysProcAttr.Credential = cred
		cmd.Dir = os.TempDir()
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		r := cliResult{stdout: stdout.String(), stderr: stderr.String()}
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			r.code = exitErr.ExitCode()
		} else if err != nil {
			t.Fatalf("worker %s: %v", strings.Join(args, " "), err)
		}
		return r
	}
	for _, args := range [][]string{{"list"}, {"get", strconv.FormatInt(id, 10)}, {"buckets"}, {"nodes"}, {"schedule", "list"}, {"limit", "list"}} {
		r := as(args...)
		if r.code != 0 {
			t.Errorf("worker %s on a file this user may only read: exit %d; stderr: %s", strings.Join(args, " "), r.code, r.stderr)
		}
	}
	if r := as("list"); !strings.Contains(r.stdout, "noop") {
		t.Errorf("worker list on a file this user may only read does not show the task:\n%s", r.stdout)
	}
	r := as("migrate", "--dsn", "sqlite:"+filepath.Join(dir, "new.db"))
	if r.code == 0 || !strings.Contains(r.stderr, "the directory "+dir+" is not writable") {
		t.Errorf("worker migrate of a new file in a directory this user may not write: exit %d, stderr %q; "+
			"want it to say the directory is not writable", r.code, r.stderr)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("the read commands left %d files beside the database, want none", len(entries)-1)
	}

	// While a process writes it: what the writer committed to its WAL is
	// read too.
	if cred == nil { // the writer is this user too, and needs to write
		for p, mode := range map[string]os.FileMode{dir: 0o755, path: 0o644} {
			if err := os.Chmod(p, mode); err != nil {
				t.Fatal(err)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), queryTimeout)
	defer cancel()
	live, err := flotilla.Connect(ctx, f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	fresh, err := live.Submit(ctx, flotilla.TaskRequest{Kind: "fresh", Key: "k"}, flotilla.AllowUnowned(), flotilla.AllowUnknownKind())
	if err != nil {
		t.Fatal(err)
	}
	if r := as("get", strconv.FormatInt(fresh.ID, 10)); r.code != 0 || !strings.Contains(r.stdout, "fresh") {
		t.Errorf("worker get of a task a live process wrote, on a file this user may only read: exit %d\n%s%s",
			r.code, r.stdout, r.stderr)
	}
}
