package integration

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/flotilla-dev/flotilla/internal/testdb"
)

func TestWorkersStartingTogetherOnAFreshServerAllStart(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	// The fleet's database does not exist yet: every process below finds
	// it missing, creates it and migrates it, all at once.
	dsn := testdb.Missing(t)
	a := startWorker(t, dsn, "run", "--buckets", "0-31", "--node-id", "a")
	b := startWorker(t, dsn, "run", "--buckets", "32-63", "--node-id", "b")
	const migrations = 4
	var (
		wg      sync.WaitGroup
		results = make([]cliResult, migrations)
		errs    = make([]error, migrations)
	)
	for i := range migrations {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = runWorker(dsn, "migrate")
		}()
	}
	wg.Wait()
	for i := range migrations {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if r := results[i]; r.code != 0 || !strings.Contains(r.stdout, fmt.Sprintf("%d buckets", fleetBuckets)) {
			t.Errorf("worker migrate %d exited %d: %s%s", i, r.code, r.stdout, r.stderr)
		}
	}
	f := newFleetOn(t, dsn)
	f.waitUntilHeld("a", mustSet(t, "0-31"), startWithin)
	f.waitUntilHeld("b", mustSet(t, "32-63"), startWithin)
	for _, p := range []*proc{a, b} {
		if p.exited() {
			t.Errorf("worker %s exited with status %d", p.name, p.cmd.ProcessState.ExitCode())
		}
	}
}

func TestKeylessSubmitsThroughTheCLI(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	f := newFleet(t)

	_, stderr, code := f.cli("submit", "--kind", "noop")
	if code != exitRefused || !strings.Contains(stderr, "--allow-unowned") {
		t.Errorf("a keyless submit with no node exited %d, want %d naming --allow-unowned; stderr:\n%s",
			code, exitRefused, stderr)
	}

	low := mustSet(t, "0-31")
	f.worker("run", "--buckets", "0-31", "--node-id", "a")
	f.waitUntilHeld("a", low, startWithin)
	for range 10 {
		id := f.submit("--kind", "noop")
		if r := f.mustGet(id); !low.Contains(r.Task.Bucket) {
			t.Errorf("keyless task %d went to bucket %d, which no live node holds", id, r.Task.Bucket)
		}
	}
}

func TestSubmitRefusesATimeoutOfLessThanAMillisecond(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	f := newFleet(t)
	_, stderr, code := f.cli("submit", "--kind", "noop", "--key", "k", "--timeout", "500us", "--allow-unowned")
	if code != exitInvalid || !strings.Contains(stderr, "500µs") || !strings.Contains(stderr, "whole number of milliseconds") {
		t.Errorf("submit --timeout 500us exited %d, want %d naming 500µs and what is valid; stderr:\n%s",
			code, exitInvalid, stderr)
	}
}
