package integration

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// Exit statuses of the worker command (DESIGN §9).
const (
	exitInvalid  = 2
	exitRefused  = 3
	exitNotFound = 4
)

// TestBadBucketsExitTwo checks invariant 4: a bad --buckets is refused with
// exit status 2 and one line naming the bad token, before any lease is
// taken; a malformed one before the database is even contacted.
func TestBadBucketsExitTwo(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	// Nothing listens on port 1: a command that connected before checking
	// its flags would fail there with status 1, not 2.
	const unreachable = "postgres://postgres@127.0.0.1:1/none"
	malformed := []struct {
		name, spec string
		mentions   []string // in the message: the bad token, or what is wrong with it
	}{
		{"explicitly empty", "", []string{"empty"}},
		{"not a number", "a", []string{`"a"`}},
		{"empty element", "1,,2", []string{`"1,,2"`, "empty"}},
		{"reversed range", "5-3", []string{`"5-3"`}},
		{"overlap", "1-5,3", []string{`"3"`, `"1-5"`}},
		{"duplicate", "2,2", []string{`"2"`}},
		{"negative", "-1", []string{`"-1"`}},
	}
	for _, tc := range malformed {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, code := runCLI(t, "", "run", "--buckets", tc.spec, "--dsn", unreachable)
			checkOneLineRefusal(t, fmt.Sprintf("worker run --buckets %q", tc.spec), stdout, stderr, code, exitInvalid, tc.mentions...)
		})
	}

	t.Run("out of range", func(t *testing.T) {
		f := newFleet(t)
		stdout, stderr, code := f.cli("run", "--buckets", "60-70")
		// 64 is the first bucket the fleet lacks; 0-63 are the ones it has.
		checkOneLineRefusal(t, "worker run --buckets 60-70", stdout, stderr, code, exitInvalid, `"60-70"`, "64", "0-63")
		checkNoLeaseNoNode(t, f)
	})

	t.Run("another bucket count", func(t *testing.T) {
		f := newFleet(t)
		stdout, stderr, code := f.cli("run", "--num-buckets", "32")
		checkOneLineRefusal(t, "worker run --num-buckets 32", stdout, stderr, code, exitInvalid, "64", "32")
		checkNoLeaseNoNode(t, f)
	})
}

// checkOneLineRefusal checks that a command exited with want, printed
// nothing on stdout and exactly one line on stderr, which mentions each of
// mentions.
func checkOneLineRefusal(t *testing.T, command, stdout, stderr string, code, want int, mentions ...string) {
	t.Helper()
	if code != want {
		t.Errorf("%s exited %d, want %d; stderr:\n%s", command, code, want, stderr)
	}
	if stdout != "" {
		t.Errorf("%s printed on stdout: %q", command, stdout)
	}
	if lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n"); len(lines) != 1 || lines[0] == "" {
		t.Errorf("%s printed %d lines on stderr, want one:\n%s", command, len(lines), stderr)
	}
	for _, m := range mentions {
		if !strings.Contains(stderr, m) {
			t.Errorf("%s: the message does not mention %s:\n%s", command, m, stderr)
		}
	}
}

func checkNoLeaseNoNode(t *testing.T, f *fleet) {
	t.Helper()
	if bs := f.mustBuckets(); !allHeldBy(bs, bucket.All(fleetBuckets), "") {
		t.Errorf("a refused node left leases behind: %s", describeHolders(bs))
	}
	if ns := f.nodes(); len(ns) != 0 {
		t.Errorf("a refused node left itself registered: %+v", ns)
	}
}

// TestSubmitRefusals checks that `worker submit` refuses a task that would
// wait unserved (invariants 7 and 11) unless told to accept it, and the
// exit statuses and JSON of `submit` and `get` (DESIGN §9).
func TestSubmitRefusals(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	f := newFleet(t)
	low, high := mustSet(t, "0-31"), mustSet(t, "32-63")
	f.worker("run", "--buckets", "0-31", "--node-id", "a")
	f.waitUntilHeld("a", low, startWithin)

	ownKey, foreignKey := keyIn(t, f.policy, low, "own"), keyIn(t, f.policy, high, "foreign")
	foreignBucket := f.policy.Of(foreignKey)

	_, stderr, code := f.cli("submit", "--kind", "noop", "--key", foreignKey)
	if code != exitRefused || !strings.Contains(stderr, fmt.Sprintf("bucket %d", foreignBucket)) {
		t.Errorf("submit to unheld bucket %d exited %d, want %d naming the bucket; stderr:\n%s",
			foreignBucket, code, exitRefused, stderr)
	}
	unowned := f.submit("--kind", "noop", "--key", foreignKey, "--allow-unowned")
	r := f.mustGet(unowned)
	if r.Task.Status != task.Queued || !strings.Contains(r.Waiting, fmt.Sprint(foreignBucket)) {
		t.Errorf("task %d submitted with --allow-unowned: %s; want queued, waiting for bucket %d",
			unowned, describeTask(r), foreignBucket)
	}

	_, stderr, code = f.cli("submit", "--kind", "nosuch", "--key", ownKey)
	if code != exitRefused || !strings.Contains(stderr, `"nosuch"`) {
		t.Errorf("submit of a kind nobody runs exited %d, want %d naming the kind; stderr:\n%s", code, exitRefused, stderr)
	}
	unknown := f.submit("--kind", "nosuch", "--key", ownKey, "--allow-unknown-kind")
	if r := f.mustGet(unknown); r.Task.Status != task.Queued || !strings.Contains(r.Waiting, "nosuch") {
		t.Errorf("task %d submitted with --allow-unknown-kind: %s; want queued, waiting for a node that runs nosuch",
			unknown, describeTask(r))
	}

	_, stderr, code = f.cli("submit", "--kind", "noop", "--key", ownKey, "--payload", "{bad")
	if code != exitInvalid || !strings.Contains(stderr, "JSON") {
		t.Errorf("submit with --payload '{bad' exited %d, want %d saying the JSON is invalid; stderr:\n%s",
			code, exitInvalid, stderr)
	}
	_, stderr, code = f.cli("get", "999999")
	if code != exitNotFound || !strings.Contains(stderr, "999999") {
		t.Errorf("get 999999 exited %d, want %d naming the id; stderr:\n%s", code, exitNotFound, stderr)
	}
	// Only the two tasks accepted on request exist: the refusals wrote nothing.
	if ts, err := f.list(store.TaskFilter{}); err != nil || len(ts) != 2 {
		t.Errorf("the fleet holds %d tasks (error %v), want only the 2 accepted", len(ts), err)
	}

	ran := f.submit("--kind", "noop", "--key", ownKey)
	f.waitForTask(ran, "succeeded", succeeded)
	ranBucket := f.policy.Of(ownKey)
	epoch := epochs(f.mustBuckets(), low)[ranBucket]
	// The flag after the positional id must work (DESIGN §9).
	stdout, stderr, code := f.cli("get", fmt.Sprint(ran), "--json")
	if code != 0 {
		t.Fatalf("get %d --json exited %d: %s", ran, code, stderr)
	}
	checkTaskJSON(t, stdout, taskJSONWant{id: ran, kind: "noop", key: ownKey, bucket: ranBucket,
		status: task.Succeeded, node: "a", epoch: epoch})

	// Nothing serves the tasks accepted on request, so they still wait.
	for _, id := range []int64{unowned, unknown} {
		if r := f.mustGet(id); r.Task.Status != task.Queued || r.Task.Attempt != 0 {
			t.Errorf("task %d: %s; want it still queued, never attempted", id, describeTask(r))
		}
	}
}

type taskJSONWant struct {
	id     int64
	kind   string
	key    string
	bucket int
	status task.Status
	node   string
	epoch  int64
}

// checkTaskJSON checks `worker get --json` of a task that has succeeded in
// its first attempt: every documented field, its value, and times in RFC
// 3339 UTC.
func checkTaskJSON(t *testing.T, stdout string, want taskJSONWant) {
	t.Helper()
	var fields map[string]json.RawMessage
	decodeJSON(t, "worker get --json", stdout, &fields)
	for _, name := range []string{"id", "kind", "key", "bucket", "status", "attempt", "max_attempts", "priority",
		"node", "epoch", "payload", "result", "error", "schedule", "scheduled_for", "created_at", "started_at",
		"finished_at", "events"} {
		if _, ok := fields[name]; !ok {
			t.Errorf("worker get --json has no %q field:\n%s", name, stdout)
		}
	}

	var got struct {
		ID           int64           `json:"id"`
		Kind         string          `json:"kind"`
		Key          string          `json:"key"`
		Bucket       int             `json:"bucket"`
		Status       task.Status     `json:"status"`
		Attempt      int             `json:"attempt"`
		MaxAttempts  int             `json:"max_attempts"`
		Priority     int             `json:"priority"`
		Node         string          `json:"node"`
		Epoch        int64           `json:"epoch"`
		Payload      json.RawMessage `json:"payload"`
		Result       json.RawMessage `json:"result"`
		Error        string          `json:"error"`
		Schedule     string          `json:"schedule"`
		ScheduledFor *string         `json:"scheduled_for"`
		CreatedAt    string          `json:"created_at"`
		StartedAt    string          `json:"started_at"`
		FinishedAt   string          `json:"finished_at"`
		Events       []struct {
			Seq     int64       `json:"seq"`
			From    task.Status `json:"from"`
			To      task.Status `json:"to"`
			At      string      `json:"at"`
			Node    string      `json:"node"`
			Epoch   int64       `json:"epoch"`
			Attempt int         `json:"attempt"`
			Reason  string      `json:"reason"`
			Error   string      `json:"error"`
		} `json:"events"`
	}
	decodeJSON(t, "worker get --json", stdout, &got)
	if got.ID != want.id || got.Kind != want.kind || got.Key != want.key || got.Bucket != want.bucket ||
		got.Status != want.status || got.Node != want.node || got.Epoch != want.epoch {
		t.Errorf("worker get --json: id %d, kind %q, key %q, bucket %d, status %s, node %q, epoch %d; "+
			"want %d, %q, %q, %d, %s, %q, %d", got.ID, got.Kind, got.Key, got.Bucket, got.Status, got.Node,
			got.Epoch, want.id, want.kind, want.key, want.bucket, want.status, want.node, want.epoch)
	}
	if got.Attempt != 1 || got.MaxAttempts != store.DefaultMaxAttempts || got.Priority != 0 {
		t.Errorf("worker get --json: attempt %d of %d, priority %d; want 1 of %d, priority 0",
			got.Attempt, got.MaxAttempts, got.Priority, store.DefaultMaxAttempts)
	}
	if string(got.Payload) != "null" || string(got.Result) != "null" || got.Error != "" ||
		got.Schedule != "" || got.ScheduledFor != nil {
		t.Errorf("worker get --json: payload %s, result %s, error %q, schedule %q, scheduled_for %v; "+
			"want null, null, empty, empty, null", got.Payload, got.Result, got.Error, got.Schedule, got.ScheduledFor)
	}
	created := rfc3339UTC(t, "created_at", got.CreatedAt)
	started := rfc3339UTC(t, "started_at", got.StartedAt)
	finished := rfc3339UTC(t, "finished_at", got.FinishedAt)
	if started.Before(created) || finished.Before(started) {
		t.Errorf("worker get --json: created %v, started %v, finished %v are out of order", created, started, finished)
	}

	// The trail: created, claimed by the node, finished; numbered from 1.
	if len(got.Events) < 3 {
		t.Fatalf("worker get --json has %d events, want at least created, claimed and succeeded:\n%s", len(got.Events), stdout)
	}
	for i, e := range got.Events {
		if e.Seq != int64(i+1) {
			t.Errorf("event %d has seq %d, want %d", i, e.Seq, i+1)
		}
		rfc3339UTC(t, fmt.Sprintf("events[%d].at", i), e.At)
		if e.To == task.Running && (e.Node != want.node || e.Epoch != want.epoch || e.Attempt != 1) {
			t.Errorf("claim event %d: node %q, epoch %d, attempt %d; want %q, %d, 1", e.Seq, e.Node, e.Epoch, e.Attempt,
				want.node, want.epoch)
		}
	}
	first, last := got.Events[0], got.Events[len(got.Events)-1]
	if first.From != "" || first.To != task.Queued {
		t.Errorf("first event goes from %q to %q, want from nothing to queued", first.From, first.To)
	}
	if last.To != want.status {
		t.Errorf("last event goes to %q, want %q", last.To, want.status)
	}
}

// rfc3339UTC parses a time printed in JSON, which must be RFC 3339 in UTC.
func rfc3339UTC(t *testing.T, field, s string) time.Time {
	t.Helper()
	at, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || !strings.HasSuffix(s, "Z") {
		t.Errorf("%s = %q, want an RFC 3339 time in UTC", field, s)
	}
	return at
}

// TestWorkerCLIFlagsAfterPositional checks that a flag written after a
// positional argument is applied, and an unknown one refused, never ignored
// (DESIGN §9). `worker get ID --json` is checked in TestSubmitRefusals.
func TestWorkerCLIFlagsAfterPositional(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	f := newFleet(t)
	// No --buckets: the node declares every bucket.
	f.worker("run", "--node-id", "everything")
	f.waitUntilHeld("everything", bucket.All(fleetBuckets), startWithin)

	type bucketOf struct {
		Key    string `json:"key"`
		Bucket int    `json:"bucket"`
		Holder string `json:"holder"`
	}
	for _, tc := range []struct {
		name, dsn, holder string
	}{
		{"without a database", "", ""},
		{"with the fleet", f.dsn, "everything"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, code := runCLI(t, tc.dsn, "bucket-of", "k-1", "--json")
			if code != 0 {
				t.Fatalf("bucket-of k-1 --json exited %d: %s", code, stderr)
			}
			var got bucketOf
			decodeJSON(t, "bucket-of k-1 --json", stdout, &got)
			if want := (bucketOf{Key: "k-1", Bucket: f.policy.Of("k-1"), Holder: tc.holder}); got != want {
				t.Errorf("bucket-of k-1 --json = %+v, want %+v", got, want)
			}
		})
	}

	for _, args := range [][]string{
		{"get", "1", "--bogus"},
		{"bucket-of", "k-1", "--bogus"},
	} {
		stdout, stderr, code := f.cli(args...)
		checkOneLineRefusal(t, "worker "+strings.Join(args, " "), stdout, stderr, code, exitInvalid, "--bogus")
	}

	t.Run("before the positional", func(t *testing.T) {
		// A flag error found by the command's own parser is invalid input
		// too: exit 2 with one line on stderr, not a page of help.
		for _, c := range []struct {
			args []string
			want string // what the message must name
		}{
			{[]string{"get", "--bogus", "1"}, "bogus"},
			{[]string{"run", "--concurrency", "abc"}, "abc"},
			{[]string{"run", "--bucket-lease-ttl", "2"}, "2"},
			{[]string{"nosuchcommand"}, "nosuchcommand"},
		} {
			stdout, stderr, code := runCLI(t, f.dsn, c.args...)
			checkOneLineRefusal(t, "worker "+strings.Join(c.args, " "), stdout, stderr, code, exitInvalid, c.want)
		}
	})
}
