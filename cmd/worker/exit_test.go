package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flotilla-dev/flotilla/commands"
	"github.com/flotilla-dev/flotilla/store"
)

// sqliteFleet is a migrated SQLite fleet of 8 buckets in a file of its own,
// with tasks 1 and 3 queued, 3 holding unique key "u", and task 2 cancelled,
// all under key "k".
func sqliteFleet(t *testing.T) string {
	t.Helper()
	withoutDSNEnv(t)
	dsn := "sqlite:" + filepath.Join(t.TempDir(), "fleet.db")
	for _, args := range [][]string{
		{"migrate", "--num-buckets", "8"},
		{"submit", "--kind", "noop", "--key", "k", "--allow-unowned"},
		{"submit", "--kind", "noop", "--key", "k", "--allow-unowned"},
		{"stop", "2"},
		{"submit", "--kind", "noop", "--key", "k", "--unique-key", "u", "--allow-unowned"},
	} {
		if _, stderr, code := runWorker(t, append(args, "--dsn", dsn)...); code != exitOK {
			t.Fatalf("worker %v: exit %d: %s", args, code, stderr)
		}
	}
	return dsn
}

// TestEveryExitStatusRowThroughRun drives run with real arguments for every
// row of exitTable, on SQLite and PostgreSQL, and checks the status it ends
// with, and that every row (and statuses 0 and 1) has a case.
func TestEveryExitStatusRowThroughRun(t *testing.T) {
	lite := sqliteFleet(t)
	pg := viewFleet(t) // node "live" is alive and holds buckets 0-9
	unmigrated := "sqlite:" + filepath.Join(t.TempDir(), "empty.db")
	unreachable := "postgres://postgres@127.0.0.1:1/flotilla?sslmode=disable&connect_timeout=5"

	cases := []struct {
		why  string // the error of the row the case reaches
		args []string
		want int
	}{
		{"nothing went wrong", []string{"get", "1", "--dsn", lite}, exitOK},
		{"a task stopped twice is done", []string{"stop", "2", "--dsn", lite}, exitOK},
		{"the database unreachable", []string{"list", "--dsn", unreachable}, exitRuntime},

		{"errInvalidInput: a flag value refused before connecting", []string{"list", "--status", "nonsense", "--dsn", lite}, exitInvalid},
		{"errInvalidInput: an unknown command", []string{"nonsense"}, exitInvalid},
		{"errInvalidInput: an unknown flag", []string{"list", "--nonsense"}, exitInvalid},
		{"store.ErrInvalid: a connection string the library refuses", []string{"list", "--dsn", "sqlite:"}, exitInvalid},
		{"store.ErrBucketCount: another bucket count than the fleet's", []string{"migrate", "--num-buckets", "16", "--dsn", lite}, exitInvalid},
		{"schedule.ErrInvalidSpec: a cron expression that does not parse",
			[]string{"schedule", "add", "--cron", "61 * * * *", "--kind", "noop", "nightly", "--dsn", lite}, exitInvalid},

		{"errRefused: a schedule that exists", []string{"schedule", "add", "--every", "1h", "--kind", "noop", "hourly", "--dsn", lite}, exitOK},
		{"errRefused: a schedule that exists", []string{"schedule", "add", "--every", "1h", "--kind", "noop", "hourly", "--dsn", lite}, exitRefused},
		{"flotilla.ErrRefused: a bucket no live node holds", []string{"submit", "--kind", "noop", "--key", "k", "--dsn", lite}, exitRefused},
		{"store.ErrDuplicate: a unique key held", []string{"submit", "--kind", "noop", "--key", "k", "--unique-key", "u", "--allow-unowned", "--dsn", lite}, exitRefused},
		{"store.ErrSchema: no schema", []string{"list", "--dsn", unmigrated}, exitRefused},
		{"commands.ErrWrongState: resuming a queued task", []string{"resume", "1", "--dsn", lite}, exitRefused},
		{"store.ErrNodeAlive: a node id in use", []string{"run", "--node-id", "live", "--buckets", "0-9", "--dsn", pg}, exitRefused},

		{"errNotFound: get of a task that does not exist", []string{"get", "99", "--dsn", lite}, exitNotFound},
		{"store.ErrNotFound: stop of a task that does not exist", []string{"stop", "99", "--dsn", lite}, exitNotFound},
		{"store.ErrNotFound: a schedule that does not exist", []string{"schedule", "rm", "nightly", "--dsn", lite}, exitNotFound},

		{"commands.ErrTooLate: resuming a cancelled task", []string{"resume", "2", "--dsn", lite}, exitTooLate},
	}
	seen := map[int]bool{}
	for _, c := range cases {
		_, stderr, code := runWorker(t, c.args...)
		if code != c.want {
			t.Errorf("%s: worker %s: exit %d, want %d; stderr: %s", c.why, strings.Join(c.args, " "), code, c.want, stderr)
		}
		seen[c.want] = true
	}
	for _, s := range exitStatuses {
		if !seen[s.status] {
			t.Errorf("no case ends with status %d (%s)", s.status, s.meaning)
		}
	}
}

// TestExitTableDecidesByTheOutermostError checks the table's order: every
// error it names gives its row's status however it is wrapped, and a mark a
// command puts around a library error decides over the error it wraps.
func TestExitTableDecidesByTheOutermostError(t *testing.T) {
	for _, row := range exitTable {
		for _, e := range row.errs {
			if got := exitStatus(fmt.Errorf("task 7: %w", e)); got != row.status {
				t.Errorf("%v: status %d, want %d", e, got, row.status)
			}
		}
	}
	for _, c := range []struct {
		err  error
		want int
	}{
		{invalid(fmt.Errorf("--payload @f: %w", store.ErrNotFound)), exitInvalid},
		{refused(fmt.Errorf("%w; give --replace to replace it", store.ErrInvalid)), exitRefused},
		{fmt.Errorf("stop task 3: %w", notFound(commands.ErrTooLate)), exitNotFound},
		{errors.Join(errors.New("closing"), commands.ErrTooLate), exitTooLate},
		{&store.BucketCountError{}, exitInvalid},
		{errors.New("connection reset"), exitRuntime},
		{nil, exitOK},
	} {
		if got := exitStatus(c.err); got != c.want {
			t.Errorf("%v: status %d, want %d", c.err, got, c.want)
		}
	}
}
