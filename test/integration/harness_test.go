// Package integration runs the worker binary as an operator would: several
// `worker run` processes on one PostgreSQL database, driven and inspected
// through the command line and the flotilla client (DESIGN §11). Every test
// gets a database of its own (testdb.New) and skips under -short.
//
// The fault scenarios (fault_test.go, pgrestart_test.go, soak_test.go) run
// the test worker of ./testworker instead, whose probe kind keeps a ledger
// of every execution, and break the fleet with kill -9, SIGSTOP, a proxy
// between a node and PostgreSQL, a PostgreSQL restart and SIGTERM; see
// rig_test.go, verify_test.go and docs/reliability.md.
package integration

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/internal/patience"
	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/internal/testenv"
)

// workerBinary is the worker that TestMain built for this run, and
// testWorkerBinary the test worker (./testworker): a node with the stock
// kinds and the probe, which the fault scenarios run. Both are in
// workerDir.
var workerDir, workerBinary, testWorkerBinary string

func TestMain(m *testing.M) {
	flag.Parse() // testing.Short needs the flags before m.Run parses them
	if !testing.Short() {
		// The SQLite pass (TestCLIOnSQLite) is given the binaries of the
		// run that started it.
		workerDir = os.Getenv(workerDirEnv)
		if workerDir == "" {
			var err error
			if workerDir, err = buildWorker(); err != nil {
				fmt.Fprintln(os.Stderr, "integration:", err)
				os.Exit(1)
			}
		}
		workerBinary = filepath.Join(workerDir, "worker")
		testWorkerBinary = filepath.Join(workerDir, "testworker")
	}
	testdb.VerifyNoLeaks(m)
}

// needsIntegration skips the test under -short, which runs unit tests only.
func needsIntegration(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: runs worker processes against PostgreSQL; skipped by -short")
	}
}

const (
	// buildDirPrefix names the temporary directories the worker is built in.
	buildDirPrefix = "flotilla-integration-worker-"
	// staleBuildAge is the age past which a build directory left by an
	// earlier run is removed: well past any run's -timeout here (the
	// Makefile gives 20 minutes), so no run still uses it.
	staleBuildAge = 2 * time.Hour
)

// buildWorker builds ./cmd/worker and ./test/integration/testworker once
// for the whole run, with the race detector when the tests have it, so
// that the processes under test are checked for races too. It returns the
// directory that holds both.
//
// testdb.VerifyNoLeaks ends the process with os.Exit, so nothing can remove
// the build directory after the tests; each run removes instead what runs
// before it left behind, once it is old enough that no run can still be
// using it.
func buildWorker() (string, error) {
	removeStaleBuilds()
	dir, err := os.MkdirTemp("", buildDirPrefix)
	if err != nil {
		return "", fmt.Errorf("temporary directory for the worker binaries: %w", err)
	}
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	if testenv.RaceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "github.com/flotilla-dev/flotilla/cmd/worker",
		"github.com/flotilla-dev/flotilla/test/integration/testworker")
	out, err := exec.Command("go", args...).CombinedOutput()
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return dir, nil
}

func removeStaleBuilds() {
	entries, err := os.ReadDir(os.TempDir())
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), buildDirPrefix) {
			continue
		}
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > staleBuildAge {
			_ = os.RemoveAll(filepath.Join(os.TempDir(), e.Name()))
		}
	}
}

// raceReport starts every report of the race detector.
const raceReport = "WARNING: DATA RACE"

// workerCommand prepares the worker binary with args. The DSN goes through
// FLOTILLA_DSN, so that the argument lists stay exactly what a test checks;
// dsn "" runs the command without a database. The process gets a group of
// its own so that it can be killed whole.
func workerCommand(ctx context.Context, dsn string, args ...string) *exec.Cmd {
	return binaryCommand(ctx, workerBinary, dsn, args...)
}

// binaryCommand is workerCommand for another of the binaries built.
func binaryCommand(ctx context.Context, bin, dsn string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, bin, args...)
	env := make([]string, 0, len(os.Environ())+2)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FLOTILLA_DSN=") && !strings.HasPrefix(kv, "GORACE=") {
			env = append(env, kv)
		}
	}
	if dsn != "" {
		env = append(env, "FLOTILLA_DSN="+dsn)
	}
	// A race-enabled binary sleeps a second at exit by default, which
	// would make each one-shot command take a second.
	env = append(env, strings.TrimSpace("GORACE="+os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	cmd.Env = env
	cmd.SysProcAttr = processAttributes()
	cmd.Cancel = func() error { return killGroup(cmd.Process.Pid) }
	return cmd
}

// killGroup sends SIGKILL to the process group led by pid.
func killGroup(pid int) error {
	err := syscall.Kill(-pid, syscall.SIGKILL)
	if errors.Is(err, syscall.ESRCH) {
		return os.ErrProcessDone
	}
	return err
}

// proc is a long-running `worker run` process.
type proc struct {
	t       *testing.T
	name    string
	cmd     *exec.Cmd
	logPath string // stdout and stderr

	done chan struct{} // closed once the process has exited and been waited for
}

const (
	// exitWait bounds the wait for a killed process to be reaped.
	exitWait = 10 * time.Second
	// oneShotTimeout bounds a one-shot command; none should come near it.
	oneShotTimeout = time.Minute
)

// startWorker starts `worker args...` on dsn. The process is killed (SIGKILL
// to its group) and reaped when the test ends, its output is shown if the
// test failed, and a race report in it fails the test.
func startWorker(t *testing.T, dsn string, args ...string) *proc {
	t.Helper()
	return startBinary(t, workerBinary, dsn, args...)
}

// startBinary is startWorker for another of the binaries built.
func startBinary(t *testing.T, bin, dsn string, args ...string) *proc {
	t.Helper()
	return startBinaryWithEnv(t, bin, dsn, nil, args...)
}

// startBinaryWithEnv is startBinary with more of the environment (k=v):
// not t.Setenv, which would keep the test from running in parallel.
func startBinaryWithEnv(t *testing.T, bin, dsn string, env []string, args ...string) *proc {
	t.Helper()
	// The directory is removed after the process is reaped: cleanups run
	// last-registered first.
	logPath := filepath.Join(t.TempDir(), "worker.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatalf("worker log: %v", err)
	}
	defer logFile.Close() // the child has its own descriptor
	cmd := binaryCommand(context.Background(), bin, dsn, args...)
	cmd.Env = append(cmd.Env, env...)
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

func (p *proc) cleanup() {
	if err := killGroup(p.cmd.Process.Pid); err != nil && !errors.Is(err, os.ErrProcessDone) {
		p.t.Errorf("kill worker %s: %v", p.name, err)
	}
	select {
	case <-p.done:
	case <-time.After(patience.Scale(exitWait)):
		p.t.Errorf("worker %s (pid %d) was not reaped within %v of SIGKILL", p.name, p.cmd.Process.Pid, patience.Scale(exitWait))
	}
	out := p.output()
	if strings.Contains(out, raceReport) {
		p.t.Errorf("worker %s reported a data race", p.name)
	}
	if p.t.Failed() {
		p.t.Logf("output of worker %s:\n%s", p.name, out)
	}
}

// output returns what the process has written so far.
func (p *proc) output() string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(log unreadable: %v)", err)
	}
	return string(b)
}

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// term asks the process to shut down gracefully, as an operator's
// `kill PID` or a service manager would.
func (p *proc) term() {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		p.t.Fatalf("SIGTERM worker %s: %v", p.name, err)
	}
}

// kill9 kills the process with SIGKILL, as `kill -9` would, and returns
// once it is gone.
func (p *proc) kill9() {
	p.t.Helper()
	if err := killGroup(p.cmd.Process.Pid); err != nil {
		p.t.Fatalf("kill -9 worker %s: %v", p.name, err)
	}
	p.wait(exitWait)
}

// wait waits for the process to exit and returns its exit status, -1 when a
// signal ended it. The timeout is stretched for the machine.
func (p *proc) wait(timeout time.Duration) int {
	p.t.Helper()
	timeout = patience.Scale(timeout)
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		p.t.Fatalf("worker %s did not exit within %v", p.name, timeout)
		return 0
	}
}

// cliResult is what a one-shot command printed and its exit status.
type cliResult struct {
	stdout, stderr string
	code           int
}

// runWorker runs a one-shot `worker args...` to its end. It does not touch
// a testing.T, so goroutines may call it.
func runWorker(dsn string, args ...string) (cliResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), oneShotTimeout)
	defer cancel()
	cmd := workerCommand(ctx, dsn, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = exitWait
	err := cmd.Run()
	r := cliResult{stdout: stdout.String(), stderr: stderr.String()}
	var exitErr *exec.ExitError
	switch {
	case ctx.Err() != nil:
		return r, fmt.Errorf("worker %s did not finish within %v; stderr:\n%s",
			strings.Join(args, " "), oneShotTimeout, r.stderr)
	case err == nil:
	case errors.As(err, &exitErr) && exitErr.Exited():
		r.code = exitErr.ExitCode()
	default:
		return r, fmt.Errorf("worker %s: %w; stderr:\n%s", strings.Join(args, " "), err, r.stderr)
	}
	if strings.Contains(r.stderr, raceReport) {
		return r, fmt.Errorf("worker %s reported a data race:\n%s", strings.Join(args, " "), r.stderr)
	}
	return r, nil
}

// runCLI runs a one-shot `worker args...` on dsn and returns its output and
// exit status.
func runCLI(t *testing.T, dsn string, args ...string) (stdout, stderr string, exitCode int) {
	t.Helper()
	r, err := runWorker(dsn, args...)
	if err != nil {
		t.Fatal(err)
	}
	return r.stdout, r.stderr, r.code
}

// pollInterval is how often a condition is looked at again; small enough
// for the measured hand-overs to be read to a few tens of milliseconds.
const pollInterval = 25 * time.Millisecond

// poll calls cond until it holds or within has passed, stretched for the
// machine (patience.Scale), and reports whether it held.
func poll(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(patience.Scale(within))
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pollInterval)
	}
}

// eventually fails the test unless cond holds within the given time,
// stretched for the machine.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	began := time.Now()
	if !poll(within, cond) {
		t.Fatalf("gave up after %v (%v stretched for the machine's load) waiting until %s",
			time.Since(began).Round(time.Millisecond), within, what)
	}
}

// fleetSlots is how many tests run a fleet under load at once (the fault
// scenarios of newRig, and the other tests that keep several nodes or
// many processes busy). The tests run in parallel, most of them waiting on
// their processes; the busy ones, all together, would starve a 2-core
// machine until its nodes' statements missed their deadlines (a renewal
// gets a sixth of the lease TTL). Alone on a quiet machine, each of them
// keeps a core busy for a third to a whole of its time.
var fleetSlots = make(chan struct{}, 3)

// takeFleetSlot waits for one of the fleetSlots, held until the test ends.
func takeFleetSlot(t *testing.T) {
	t.Helper()
	asked := time.Now()
	fleetSlots <- struct{}{}
	t.Cleanup(func() { <-fleetSlots })
	t.Logf("waited %v for a fleet slot; the load stretches deadlines %.1f times", time.Since(asked).Round(time.Millisecond), patience.Factor())
}

// leaseTTL is a bucket (or task) lease TTL for a test's nodes: base on a
// quiet machine, stretched with the machine's load (patience.Factor), at
// most maxLeaseStretch times. A node renews its bucket leases every TTL/3
// and gives each renewal TTL/6; at a TTL of a few seconds, a loaded machine
// can take longer than that, and a node whose first renewal fails at start
// exits. What the tests assert of a failover is in units of the TTL, so a
// longer one changes only how long they take; and every failover waits out
// a TTL, hence the bound.
func leaseTTL(base time.Duration) time.Duration {
	stretch := min(patience.Factor(), maxLeaseStretch)
	return time.Duration(float64(base) * stretch).Round(100 * time.Millisecond)
}

// maxLeaseStretch bounds how much leaseTTL stretches a TTL: enough for a
// renewal to outlast the slow statements of a 2-core machine that runs the
// whole suite beside another build.
const maxLeaseStretch = 3

// inParallel runs fn(i) for i in [0, n) on at most workers goroutines.
func inParallel(n, workers int, fn func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range workers {
		wg.Go(func() {
			for i := range next {
				fn(i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}
