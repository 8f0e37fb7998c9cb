package kinds

import (
	"context"
	"encoding/json"
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
	"unicode/utf8"

	"github.com/flotilla-dev/flotilla/internal/patience"
	"github.com/flotilla-dev/flotilla/task"
)

// execPatience bounds every wait in these tests: generous, since a loaded
// machine under -race is slow now and then, yet a hang fails the test
// instead of the whole run.
const execPatience = 30 * time.Second

type execBundle struct {
	runner  *execRunner
	started chan int // the process group of every child started
}

func setupExec(t *testing.T, cfg ExecConfig) *execBundle {
	t.Helper()
	b := &execBundle{runner: newExecRunner(cfg), started: make(chan int, 16)}
	b.runner.started = func(pgid int) { b.started <- pgid }
	return b
}

func execTask(t *testing.T, p ExecPayload) *task.Task {
	t.Helper()
	payload, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return &task.Task{ID: 42, Kind: "exec", Attempt: 2, ClaimSeq: 7, Epoch: 3, Payload: payload}
}

// run runs one task to its end, and fails the test should it outlast
// execPatience.
func (b *execBundle) run(t *testing.T, tk *task.Task) error {
	t.Helper()
	ctx, cancel := context.WithTimeoutCause(context.Background(), execPatience, errors.New("test patience ran out"))
	defer cancel()
	return b.runner.run(ctx, tk)
}

func execResult(t *testing.T, tk *task.Task) ExecResult {
	t.Helper()
	var res ExecResult
	if err := json.Unmarshal(tk.Result, &res); err != nil {
		t.Fatalf("result %s does not decode: %v", tk.Result, err)
	}
	return res
}

func (b *execBundle) assertNothingStarted(t *testing.T) {
	t.Helper()
	select {
	case pgid := <-b.started:
		t.Errorf("a child (process group %d) was started", pgid)
	default:
	}
}

func TestExecRefusesWhenNothingIsAllowed(t *testing.T) {
	b := setupExec(t, ExecConfig{})
	tk := execTask(t, ExecPayload{Argv: []string{"true"}})
	err := b.run(t, tk)
	if !errors.Is(err, ErrNotAllowed) || !errors.Is(err, task.ErrNoRetry) {
		t.Fatalf("err = %v, want ErrNotAllowed, not worth retrying", err)
	}
	for _, want := range []string{"exec is not allowed on this node", "kinds.ExecConfig.Allowed"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("err %q does not say %q", err, want)
		}
	}
	b.assertNothingStarted(t)
	if tk.Result != nil {
		t.Errorf("result %s, want none", tk.Result)
	}
}

func TestExecRefusesAnExecutableNotAllowed(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "marker")
	b := setupExec(t, ExecConfig{Allowed: []string{"true"}})
	for _, argv0 := range []string{"sh", "/bin/sh", "/no/such/program"} {
		t.Run(argv0, func(t *testing.T) {
			err := b.run(t, execTask(t, ExecPayload{Argv: []string{argv0, "-c", "touch " + marker}}))
			var refusal *NotAllowedError
			if !errors.As(err, &refusal) || !errors.Is(err, ErrNotAllowed) {
				t.Fatalf("err = %v, want a *NotAllowedError", err)
			}
			for _, want := range []string{"exec is not allowed on this node", strconv.Quote(argv0), "[true]", "kinds.ExecConfig.Allowed"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("err %q does not say %q", err, want)
				}
			}
			b.assertNothingStarted(t)
			if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the refused command ran: stat %s: %v", marker, err)
			}
		})
	}
}

func TestExecAllowListMatching(t *testing.T) {
	// dir/program is an executable, dir/alias a link to it, and linkdir a link to
	// dir: a linked directory is the same place, a linked file is another
	// name (multi-call binaries act on the name they are run as).
	dir := t.TempDir()
	program := filepath.Join(dir, "program")
	if err := os.WriteFile(program, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(program, filepath.Join(dir, "alias")); err != nil {
		t.Fatal(err)
	}
	linkdir := filepath.Join(t.TempDir(), "linkdir")
	if err := os.Symlink(dir, linkdir); err != nil {
		t.Fatal(err)
	}
	shPath, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh in PATH")
	}

	tests := []struct {
		allowed string
		argv0   string
		workDir string
		allow   bool
	}{
		{allowed: "sh", argv0: "sh", allow: true},
		{allowed: "sh", argv0: shPath, allow: true},
		{allowed: shPath, argv0: "sh", allow: true},
		{allowed: program, argv0: program, allow: true},
		{allowed: program, argv0: filepath.Join(linkdir, "program"), allow: true},
		{allowed: program, argv0: "./program", workDir: dir, allow: true},
		{allowed: program, argv0: filepath.Join(dir, "alias"), allow: false},
		{allowed: "sh", argv0: "true", allow: false},
		{allowed: "sh", argv0: "", allow: false},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s allows %s", tt.allowed, tt.argv0), func(t *testing.T) {
			b := setupExec(t, ExecConfig{Allowed: []string{tt.allowed}})
			argv := []string{tt.argv0}
			if tt.argv0 == "sh" || tt.argv0 == shPath {
				argv = append(argv, "-c", "exit 0")
			}
			err := b.run(t, execTask(t, ExecPayload{Argv: argv, Dir: tt.workDir}))
			if tt.allow && err != nil {
				t.Errorf("refused or failed: %v", err)
			}
			if !tt.allow && err == nil {
				t.Error("ran, want a refusal")
			}
		})
	}
}

func TestExecRefusesABadPayload(t *testing.T) {
	b := setupExec(t, ExecConfig{Allowed: []string{"true"}})
	tests := []struct {
		payload string
		want    string
	}{
		{payload: `{}`, want: `"argv"`},
		{payload: `{"argv":[]}`, want: `"argv"`},
		{payload: `{"argv":"true"}`, want: "does not decode"},
		{payload: `{"argv":["true"],"env":{"A=B":"c"}}`, want: `"A=B" is not a valid environment variable name`},
		{payload: `{"argv":["true"],"env":{"":"c"}}`, want: `"" is not a valid environment variable name`},
	}
	for _, tt := range tests {
		t.Run(tt.payload, func(t *testing.T) {
			err := b.run(t, &task.Task{Kind: "exec", Payload: json.RawMessage(tt.payload)})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want it to say %s", err, tt.want)
			}
			b.assertNothingStarted(t)
		})
	}
}

func TestExecExitCodeDecides(t *testing.T) {
	b := setupExec(t, ExecConfig{Allowed: []string{"sh", "true"}})

	tk := execTask(t, ExecPayload{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}})
	err := b.run(t, tk)
	if err == nil || !strings.Contains(err.Error(), "exit status 3: err") {
		t.Errorf("err = %v, want it to say %q", err, "exit status 3: err")
	}
	res := execResult(t, tk)
	if res.ExitCode != 3 || res.Stdout != "out\n" || res.Stderr != "err\n" || res.Signal != "" || res.Duration == "" {
		t.Errorf("result %+v, want exit code 3 and both tails", res)
	}

	tk = execTask(t, ExecPayload{Argv: []string{"true"}})
	if err := b.run(t, tk); err != nil {
		t.Fatalf("true failed: %v", err)
	}
	if res := execResult(t, tk); res.ExitCode != 0 {
		t.Errorf("result %+v, want exit code 0", res)
	}
}

func TestExecRunsInTheWorkingDirectory(t *testing.T) {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b := setupExec(t, ExecConfig{Allowed: []string{"sh"}})
	tk := execTask(t, ExecPayload{Argv: []string{"sh", "-c", "pwd -P"}, Dir: dir})
	if err := b.run(t, tk); err != nil {
		t.Fatal(err)
	}
	if got := execResult(t, tk).Stdout; got != dir+"\n" {
		t.Errorf("pwd printed %q, want %q", got, dir)
	}
}

func TestExecEnvironment(t *testing.T) {
	t.Setenv("FLOTILLA_DSN", "postgres://secret@x/y")
	t.Setenv("NODE_ONLY", "the node's")
	b := setupExec(t, ExecConfig{Allowed: []string{"sh"}, AllowedEnv: []string{"GREETING", "NODE_ONLY"}})
	tk := execTask(t, ExecPayload{
		Argv: []string{"sh", "-c", `echo "id=$FLOTILLA_TASK_ID attempt=$FLOTILLA_ATTEMPT seq=$FLOTILLA_CLAIM_SEQ epoch=$FLOTILLA_EPOCH greeting=$GREETING dsn=${FLOTILLA_DSN-unset} node_only=${NODE_ONLY-unset} path=${PATH:+set}"`},
		// An allowed name reaches the child only when the payload sets it:
		// allowing a name does not pass the node's own value on.
		Env: map[string]string{"GREETING": "hello"},
	})
	if err := b.run(t, tk); err != nil {
		t.Fatal(err)
	}
	const want = "id=42 attempt=2 seq=7 epoch=3 greeting=hello dsn=unset node_only=unset path=set\n"
	if got := execResult(t, tk).Stdout; got != want {
		t.Errorf("the child saw\n%q\nwant\n%q", got, want)
	}
}

func TestExecCrashIsAFailedAttempt(t *testing.T) {
	b := setupExec(t, ExecConfig{Allowed: []string{"sh"}})
	tk := execTask(t, ExecPayload{Argv: []string{"sh", "-c", "echo dying >&2; kill -SEGV $$"}})
	err := b.run(t, tk)
	if err == nil || !strings.Contains(err.Error(), "SIGSEGV") {
		t.Fatalf("err = %v, want it to name SIGSEGV", err)
	}
	if res := execResult(t, tk); res.Signal != "SIGSEGV" || res.ExitCode != -1 || res.Stderr != "dying\n" {
		t.Errorf("result %+v, want signal SIGSEGV, exit code -1 and the stderr tail", res)
	}
}

func TestExecStopKillsTheWholeGroup(t *testing.T) {
	// The child and its grandchild ignore SIGTERM: only the SIGKILL after
	// the grace period ends them.
	b := setupExec(t, ExecConfig{Allowed: []string{"sh"}, Grace: 200 * time.Millisecond})
	tk := execTask(t, ExecPayload{Argv: []string{"sh", "-c", `trap "" TERM; sleep 300 & wait`}})
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	done := make(chan error, 1)
	go func() { done <- b.runner.run(ctx, tk) }()

	pgid := b.waitStarted(t)
	waitFor(t, "the shell and its sleep to run", func() bool { return len(livingMembers(t, pgid)) >= 2 })
	stopAndWait(t, cancel, done, "the handler did not return after its context was cancelled")
	waitFor(t, fmt.Sprintf("process group %d to be gone", pgid), func() bool { return groupGone(t, pgid) })
	if res := execResult(t, tk); res.Signal != "SIGKILL" {
		t.Errorf("result %+v, want the shell killed by SIGKILL", res)
	}
}

func TestExecStopEndsAWellBehavedChildBeforeTheGrace(t *testing.T) {
	// A grace far beyond the test's patience: only SIGTERM can end it in
	// time.
	b := setupExec(t, ExecConfig{Allowed: []string{"sleep"}, Grace: time.Hour})
	tk := execTask(t, ExecPayload{Argv: []string{"sleep", "300"}})
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	done := make(chan error, 1)
	go func() { done <- b.runner.run(ctx, tk) }()

	pgid := b.waitStarted(t)
	stopAndWait(t, cancel, done, "sleep did not end on SIGTERM")
	waitFor(t, fmt.Sprintf("process group %d to be gone", pgid), func() bool { return groupGone(t, pgid) })
	if res := execResult(t, tk); res.Signal != "SIGTERM" {
		t.Errorf("result %+v, want sleep ended by SIGTERM", res)
	}
}

func TestExecLeavesNoBackgroundProcess(t *testing.T) {
	// The shell succeeds at once, leaving a sleep that holds its stdout:
	// the attempt neither waits for it nor lets it outlive the attempt.
	b := setupExec(t, ExecConfig{Allowed: []string{"sh"}})
	tk := execTask(t, ExecPayload{Argv: []string{"sh", "-c", "sleep 300 & echo left"}})
	if err := b.run(t, tk); err != nil {
		t.Fatal(err)
	}
	pgid := b.waitStarted(t)
	waitFor(t, fmt.Sprintf("process group %d to be gone", pgid), func() bool { return groupGone(t, pgid) })
	if got := execResult(t, tk).Stdout; got != "left\n" {
		t.Errorf("stdout %q", got)
	}
}

func TestExecKeepsTheEndOfALargeOutput(t *testing.T) {
	const tailBytes = 1000
	b := setupExec(t, ExecConfig{Allowed: []string{"sh"}, TailBytes: tailBytes})
	tk := execTask(t, ExecPayload{Argv: []string{"sh", "-c", `head -c 1048576 /dev/zero | tr '\0' a; echo END`}})
	if err := b.run(t, tk); err != nil {
		t.Fatal(err)
	}
	out := execResult(t, tk).Stdout
	if len(out) > tailBytes || !strings.HasSuffix(out, "aaaEND\n") {
		t.Errorf("stdout tail is %d bytes ending %q, want at most %d ending with END", len(out), out[max(0, len(out)-10):], tailBytes)
	}
}

func TestExecDoesNotStartWhenAlreadyStopped(t *testing.T) {
	b := setupExec(t, ExecConfig{Allowed: []string{"true"}})
	ctx, cancel := context.WithCancelCause(context.Background())
	stop := errors.New("stopped by operator")
	cancel(stop)
	if err := b.runner.run(ctx, execTask(t, ExecPayload{Argv: []string{"true"}})); !errors.Is(err, stop) {
		t.Errorf("err = %v, want the stop cause", err)
	}
	b.assertNothingStarted(t)
}

func TestTailBuffer(t *testing.T) {
	tests := []struct {
		name   string
		limit  int
		writes []string
		want   string
	}{
		{name: "short", limit: 8, writes: []string{"ab", "cd"}, want: "abcd"},
		{name: "one long write", limit: 4, writes: []string{"abcdefgh"}, want: "efgh"},
		{name: "many small writes", limit: 4, writes: []string{"ab", "cd", "ef", "g", "h", "ij"}, want: "ghij"},
		{name: "long after short", limit: 4, writes: []string{"ab", "cdefgh"}, want: "efgh"},
		{name: "cut through a rune", limit: 5, writes: []string{"ééé"}, want: "éé"},
		{name: "invalid bytes", limit: 8, writes: []string{"a\xffb"}, want: "a\uFFFDb"},
		{name: "NUL", limit: 8, writes: []string{"a\x00b\x00"}, want: "a\uFFFDb\uFFFD"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &tailBuffer{limit: tt.limit}
			for _, w := range tt.writes {
				if n, err := b.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("Write(%q) = %d, %v", w, n, err)
				}
			}
			if got := b.String(); got != tt.want {
				t.Errorf("String() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestTailBufferStaysBounded(t *testing.T) {
	const limit = 64
	b := &tailBuffer{limit: limit}
	var all strings.Builder
	for i := range 10000 {
		w := strings.Repeat(strconv.Itoa(i%10), i%(limit+7))
		_, _ = b.Write([]byte(w))
		all.WriteString(w)
		if cap(b.buf) > 4*limit {
			t.Fatalf("after %d writes the buffer holds %d bytes, limit %d", i+1, cap(b.buf), limit)
		}
	}
	whole := all.String()
	if got, want := b.String(), whole[len(whole)-limit:]; got != want || !utf8.ValidString(got) {
		t.Errorf("tail %q, want %q", got, want)
	}
}

func (b *execBundle) waitStarted(t *testing.T) int {
	t.Helper()
	select {
	case pgid := <-b.started:
		return pgid
	case <-time.After(patience.Scale(execPatience)):
		t.Fatal("no child started")
		return 0
	}
}

// waitFor polls cond until it holds, and fails the test after execPatience.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience.Scale(execPatience))
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// groupGone says whether no process of the group is alive. An empty group
// answers ESRCH; killed members that init has not yet reaped (zombies, which
// run nothing) still count as members for kill(2), so /proc settles those.
func groupGone(t *testing.T, pgid int) bool {
	t.Helper()
	if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	return len(livingMembers(t, pgid)) == 0
}

// livingMembers lists the processes of a group that are not zombies, from
// /proc/PID/stat: "pid (comm) state ppid pgrp ...".
func livingMembers(t *testing.T, pgid int) []int {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	var living []int
	for _, path := range stats {
		data, err := os.ReadFile(path)
		if err != nil {
			continue // the process ended while we looked
		}
		s := string(data)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) < 3 || fields[2] != strconv.Itoa(pgid) || fields[0] == "Z" || fields[0] == "X" {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(path)))
		living = append(living, pid)
	}
	return living
}

// stopAndWait cancels a running attempt with a stop cause and waits for its
// handler to return that cause, failing with late if it does not return.
func stopAndWait(t *testing.T, cancel context.CancelCauseFunc, done <-chan error, late string) {
	t.Helper()
	stop := errors.New("stopped by operator")
	cancel(stop)
	select {
	case err := <-done:
		if !errors.Is(err, stop) {
			t.Errorf("err = %v, want the stop cause", err)
		}
	case <-time.After(patience.Scale(execPatience)):
		t.Fatal(late)
	}
}

// TestExecKeepsMoreOfAFailedChildsOutput: a child that fails keeps the last
// FailureTailBytes of each stream, one that succeeds the last TailBytes; a
// binary stream is cut until the result fits task.MaxResultBytes.
func TestExecKeepsMoreOfAFailedChildsOutput(t *testing.T) {
	b := setupExec(t, ExecConfig{Allowed: []string{"sh"}})
	const script = `head -c 200000 /dev/zero | tr '\0' o; echo OUT-END; head -c 200000 /dev/zero | tr '\0' e >&2; echo ERR-END >&2; exit %d`
	failed := execTask(t, ExecPayload{Argv: []string{"sh", "-c", fmt.Sprintf(script, 3)}})
	if err := b.run(t, failed); err == nil || !strings.HasSuffix(err.Error(), "eeeERR-END") || !strings.Contains(err.Error(), "exit status 3: ") {
		t.Fatalf("err = %v, want exit status 3 with the last line of stderr", err)
	}
	res := execResult(t, failed)
	if len(res.Stdout) != DefaultExecFailureTailBytes || !strings.HasSuffix(res.Stdout, "ooOUT-END\n") ||
		len(res.Stderr) != DefaultExecFailureTailBytes || !strings.HasSuffix(res.Stderr, "eeERR-END\n") || res.ExitCode != 3 {
		t.Errorf("a failed child kept %d bytes of stdout and %d of stderr (exit %d), want the last %d of each",
			len(res.Stdout), len(res.Stderr), res.ExitCode, DefaultExecFailureTailBytes)
	}
	ok := execTask(t, ExecPayload{Argv: []string{"sh", "-c", fmt.Sprintf(script, 0)}})
	if err := b.run(t, ok); err != nil {
		t.Fatal(err)
	}
	if res := execResult(t, ok); len(res.Stdout) != DefaultExecTailBytes || len(res.Stderr) != DefaultExecTailBytes {
		t.Errorf("a child that succeeded kept %d and %d bytes, want %d of each", len(res.Stdout), len(res.Stderr), DefaultExecTailBytes)
	}
	binary := execTask(t, ExecPayload{Argv: []string{"sh", "-c", `head -c 300000 /dev/zero | tr '\0' '\1'; head -c 300000 /dev/zero | tr '\0' '\2' >&2; exit 1`}})
	if err := b.run(t, binary); err == nil {
		t.Fatal("a child that exits 1 succeeded")
	}
	res = execResult(t, binary)
	if len(binary.Result) > task.MaxResultBytes || len(res.Stdout) == 0 || len(res.Stdout) >= DefaultExecFailureTailBytes {
		t.Errorf("binary output: a result of %d bytes with %d bytes of stdout, want it cut to fit %d",
			len(binary.Result), len(res.Stdout), task.MaxResultBytes)
	}
}
