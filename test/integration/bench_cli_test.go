package integration

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/flotilla-dev/flotilla/internal/testdb"
)

// TestBenchCLI runs `worker bench` with a small backlog: it reports what it
// measured, as JSON with --json, leaves every task finished, and refuses bad
// flags with exit status 2 and a fleet in use with 3. No timing is asserted.
func TestBenchCLI(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	dsn := testdb.New(t)

	stdout, stderr, code := runCLI(t, dsn, "bench", "--jobs", "500", "--latency-jobs", "50", "--json")
	if code != 0 {
		t.Fatalf("worker bench --json exited %d; stderr:\n%s", code, stderr)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(stdout), &got); err != nil {
		t.Fatalf("worker bench --json printed %q: %v", stdout, err)
	}
	for _, field := range []string{"jobs", "insert_jobs_per_second", "jobs_per_second", "p50_ms", "p99_ms"} {
		v, ok := got[field].(float64)
		if !ok || v <= 0 {
			t.Errorf("worker bench --json: %s = %v, want a positive number; output:\n%s", field, got[field], stdout)
		}
	}
	if got["jobs"] != float64(500) || got["latency_jobs"] != float64(50) {
		t.Errorf("worker bench --json: jobs %v, latency_jobs %v; want 500 and 50", got["jobs"], got["latency_jobs"])
	}

	// The fleet can be measured again: every task it made has finished.
	stdout, stderr, code = runCLI(t, dsn, "bench", "--jobs", "200", "--latency-jobs", "20")
	if code != 0 {
		t.Fatalf("worker bench exited %d; stderr:\n%s", code, stderr)
	}
	for _, want := range []string{"insert", "burn-down", "jobs/s", "p50", "p99"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("worker bench printed no %q:\n%s", want, stdout)
		}
	}
	if strings.Contains(stderr, "\r") {
		t.Errorf("worker bench drew a progress bar on a pipe:\n%q", stderr)
	}

	// A task waiting in the fleet would be run with the benchmark's.
	if _, stderr, code := runCLI(t, dsn, "submit", "--kind", "noop", "--allow-unowned"); code != 0 {
		t.Fatalf("worker submit exited %d: %s", code, stderr)
	}
	_, stderr, code = runCLI(t, dsn, "bench", "--jobs", "10")
	if code != exitRefused || !strings.Contains(stderr, "unfinished") {
		t.Errorf("worker bench on a fleet with a queued task exited %d, want %d; stderr:\n%s", code, exitRefused, stderr)
	}
}

// TestBenchCLIBadFlags checks that bad values are refused before anything
// connects, naming the value and what is valid.
func TestBenchCLIBadFlags(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	const unreachable = "postgres://postgres@127.0.0.1:1/none"
	for _, tc := range []struct {
		args     []string
		mentions []string
	}{
		{[]string{"--jobs", "0"}, []string{"--jobs 0", "at least 1"}},
		{[]string{"--jobs", "-4"}, []string{"--jobs -4", "at least 1"}},
		{[]string{"--concurrency", "-1"}, []string{"--concurrency -1", "at least 1"}},
		{[]string{"--rate", "0"}, []string{"--rate 0", "at least 1"}},
		{[]string{"--jobs", "many"}, []string{"many"}},
	} {
		args := append([]string{"bench", "--dsn", unreachable}, tc.args...)
		stdout, stderr, code := runCLI(t, "", args...)
		checkOneLineRefusal(t, "worker "+strings.Join(args, " "), stdout, stderr, code, exitInvalid, tc.mentions...)
	}
}
