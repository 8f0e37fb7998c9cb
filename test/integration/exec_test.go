package integration

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/kinds"
	"github.com/flotilla-dev/flotilla/task"
)

// TestStoppingAnExecTaskLeavesNoProcess runs an exec task whose shell
// ignores SIGTERM and has a child of its own, stops it from another process,
// and checks that nothing of the task's process group survives: the node
// sends SIGTERM to the group, then SIGKILL after the stop grace.
func TestStoppingAnExecTaskLeavesNoProcess(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	f := newFleet(t)
	f.worker("run", "--node-id", "runner", "--allow-exec", "sh", "--stop-grace", "1s")
	f.waitUntilHeld("runner", mustSet(t, "0-63"), startWithin)

	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pgid")
	script := fmt.Sprintf(`echo $$ > %s; trap "" TERM; sleep 300 & wait`, pidFile)
	payload, _ := json.Marshal(map[string]any{"argv": []string{"sh", "-c", script}})
	id := f.submit("--kind", "exec", "--key", "exec-1", "--payload", string(payload), "--max-attempts", "1")
	f.waitForTask(id, "running", func(tk *task.Task) bool { return tk.Status == task.Running })

	var pgid int
	eventually(t, 30*time.Second, "the child wrote its process group id", func() bool {
		raw, err := os.ReadFile(pidFile)
		if err != nil {
			return false
		}
		pgid, err = strconv.Atoi(strings.TrimSpace(string(raw)))
		return err == nil && pgid > 0
	})
	eventually(t, 30*time.Second, "the child's own child runs", func() bool { return len(groupMembers(pgid)) >= 2 })

	_, stderr, code := f.cli("stop", fmt.Sprint(id), "--wait")
	if code != 0 {
		t.Fatalf("worker stop --wait exited %d: %s", code, stderr)
	}
	eventually(t, 30*time.Second, fmt.Sprintf("no live process left in group %d", pgid), func() bool {
		return len(groupMembers(pgid)) == 0
	})
	if got := f.mustGet(id).Task.Status; got != task.Stopped {
		t.Errorf("exec task is %s, want stopped", got)
	}
}

// TestExecIsRefusedWithoutAnAllowList: a node started without --allow-exec
// does not run the exec kind, so an exec task for its buckets is refused at
// submit (exit 3, naming the kinds it runs); forced in with
// --allow-unknown-kind, it waits, and nothing runs.
func TestExecIsRefusedWithoutAnAllowList(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	f := newFleet(t)
	f.worker("run", "--node-id", "plain")
	f.waitUntilHeld("plain", mustSet(t, "0-63"), startWithin)
	marker := filepath.Join(t.TempDir(), "ran")
	payload, _ := json.Marshal(map[string]any{"argv": []string{"touch", marker}})
	_, stderr, code := f.cli("submit", "--kind", "exec", "--key", "exec-2", "--payload", string(payload), "--max-attempts", "1")
	if code != 3 || !strings.Contains(stderr, `does not run kind "exec"`) {
		t.Errorf("exec on a node without --allow-exec: exit %d, want 3 naming the kind; stderr: %s", code, stderr)
	}
	if n, _ := f.node("plain"); slices.Contains(n.Kinds, "exec") {
		t.Errorf("node plain advertises the exec kind without --allow-exec: %v", n.Kinds)
	}
	id := f.submit("--kind", "exec", "--key", "exec-2", "--payload", string(payload), "--max-attempts", "1", "--allow-unknown-kind")
	if r := f.mustGet(id); r.Task.Status != task.Queued || !strings.Contains(r.Waiting, `does not run kind "exec"`) {
		t.Errorf("a forced exec task: %s, waiting %q; want queued, waiting for a node that runs exec", describeTask(r), r.Waiting)
	}
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused command ran: %v", err)
	}
}

// TestExecChildCannotReadTheNodeDSN starts `worker run --allow-exec
// /bin/cat` with its DSN, password included, in FLOTILLA_DSN, and submits
// `cat /proc/<node pid>/environ`. The node and the child run as one uid
// without CAP_SYS_PTRACE (nobody, where the tests run as root, since root
// reads any process): only the node's being non-dumpable keeps the child
// out, and the task fails on cat's Permission denied.
func TestExecChildCannotReadTheNodeDSN(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	f := newFleet(t)
	dsn, secret := withPassword(t, f.dsn)
	cat, err := exec.LookPath("cat")
	if err != nil {
		t.Fatal(err)
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		cred = &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}
	}
	p := startWorkerAs(t, dsn, cred, "run", "--node-id", "hardened", "--allow-exec", cat)
	f.waitUntilHeld("hardened", mustSet(t, "0-63"), startWithin)

	environ := fmt.Sprintf("/proc/%d/environ", p.cmd.Process.Pid)
	payload, _ := json.Marshal(kinds.ExecPayload{Argv: []string{cat, environ}})
	id := f.submit("--kind", "exec", "--key", "exec-environ", "--payload", string(payload), "--max-attempts", "1")
	r := f.waitForTask(id, "finished", func(tk *task.Task) bool { return tk.Status.Terminal() })
	if strings.Contains(string(r.Task.Result), secret) || strings.Contains(r.Task.Error, secret) {
		t.Fatalf("the child read the node's DSN from %s: %s", environ, describeTask(r))
	}
	if r.Task.Status != task.Failed || !strings.Contains(r.Task.Error, "Permission denied") {
		t.Errorf("cat %s: %s, want it failed on Permission denied", environ, describeTask(r))
	}
	if strings.Contains(p.output(), secret) {
		t.Errorf("the node's log shows the password")
	}
}

// TestExecUserRunsTheChildAsThatUser runs `worker run --exec-user nobody`:
// as root the child runs as nobody; otherwise the node refuses to start.
func TestExecUserRunsTheChildAsThatUser(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	f := newFleet(t)
	args := []string{"run", "--node-id", "switcher", "--allow-exec", "id", "--exec-user", "nobody"}
	if os.Geteuid() != 0 {
		_, stderr, code := f.cli(args...)
		if code != 2 || !strings.Contains(stderr, "--exec-user nobody") || !strings.Contains(stderr, "root") {
			t.Fatalf("worker %s as uid %d: exit %d, want 2 saying it needs root; stderr: %s", strings.Join(args, " "), os.Geteuid(), code, stderr)
		}
		return
	}
	f.worker(args...)
	f.waitUntilHeld("switcher", mustSet(t, "0-63"), startWithin)
	payload, _ := json.Marshal(kinds.ExecPayload{Argv: []string{"id", "-u"}, Dir: "/"})
	id := f.submit("--kind", "exec", "--key", "exec-user", "--payload", string(payload), "--max-attempts", "1")
	r := f.waitForTask(id, "finished", func(tk *task.Task) bool { return tk.Status.Terminal() })
	var res kinds.ExecResult
	if r.Task.Status != task.Succeeded || json.Unmarshal(r.Task.Result, &res) != nil || res.Stdout != "65534\n" {
		t.Errorf("id -u under --exec-user nobody: %s, result %s; want it to print 65534", describeTask(r), r.Task.Result)
	}
}

// withPassword returns dsn with a password, and the password: the one dsn
// has, or a random one, which a server that trusts the client ignores.
func withPassword(t *testing.T, dsn string) (string, string) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil || u.Scheme == "" {
		if i := strings.Index(dsn, "password="); i >= 0 {
			return dsn, strings.Fields(dsn[i+len("password="):])[0]
		}
		secret := rand.Text()
		return dsn + " password=" + secret, secret
	}
	if pw, ok := u.User.Password(); ok {
		return dsn, pw
	}
	secret := rand.Text()
	u.User = url.UserPassword(u.User.Username(), secret)
	return u.String(), secret
}

// startWorkerAs is startWorker with the worker run under cred (nil: this
// process's). The binary is copied where any user may run it: the build
// directory is private.
func startWorkerAs(t *testing.T, dsn string, cred *syscall.Credential, args ...string) *proc {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "worker")
	copyFile(t, workerBinary, bin, 0o755)
	logPath := filepath.Join(t.TempDir(), "worker.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close() // the child has its own descriptor
	cmd := binaryCommand(context.Background(), bin, dsn, args...)
	cmd.Dir = dir
	cmd.SysProcAttr.Credential = cred
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("start worker %s: %v", strings.Join(args, " "), err)
	}
	p := &proc{t: t, name: strings.Join(args, " "), cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait() // the exit status is read from cmd.ProcessState
		close(p.done)
	}()
	t.Cleanup(p.cleanup)
	return p
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_EXCL, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}

// groupMembers lists the live processes (not zombies) of a process group,
// from /proc.
func groupMembers(pgid int) []int {
	entries, _ := os.ReadDir("/proc")
	var live []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces, so split
		// after its closing parenthesis.
		rest := string(raw[strings.LastIndexByte(string(raw), ')')+1:])
		fields := strings.Fields(rest)
		if len(fields) < 3 || fields[0] == "Z" {
			continue
		}
		if g, _ := strconv.Atoi(fields[2]); g == pgid {
			live = append(live, pid)
		}
	}
	return live
}
