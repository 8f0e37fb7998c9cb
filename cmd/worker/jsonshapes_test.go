package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/postgres"
)

// shapeFleet is viewFleet with something in every read command's output:
// a waiting task with a limit key, resources and a wait reason; a
// cancelled task with its trail; a schedule; limits of every form, one with
// a holder's share and a running task; a pipeline whose second step waits for the first. It
// returns the fleet's DSN and the arguments that run each read command on
// it.
func shapeFleet(t *testing.T) (string, map[string][][]string) {
	t.Helper()
	dsn := viewFleet(t)
	submit := func(args ...string) string {
		t.Helper()
		stdout, stderr, code := runWorker(t, append([]string{"submit", "--dsn", dsn, "--allow-unowned", "--allow-unknown-kind"}, args...)...)
		if code != exitOK {
			t.Fatalf("submit %v: exit %d: %s", args, code, stderr)
		}
		return strings.TrimSpace(stdout)
	}
	waiting := submit("--kind", "fetch", "--key", "order-1", "--limit-key", "tenant-7", "--resources", "gpu=1,mem=8",
		"--payload", `{"order":1}`, "--unique-key", "order-1-fetch", "--timeout", "1500ms")
	// A time with no fraction, which RFC 3339 with nanoseconds would print
	// shorter than the others.
	later := submit("--kind", "noop", "--key", "order-4", "--run-at", "2099-01-02T03:04:05Z")
	cancelled := submit("--kind", "noop", "--key", "order-2")
	file := filepath.Join(t.TempDir(), "nightly.json")
	if err := os.WriteFile(file, []byte(`{"name": "nightly", "tasks": [{"name": "extract", "kind": "noop"},
		{"name": "load", "kind": "noop", "depends_on": ["extract"], "on": "any"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"stop", cancelled},
		{"schedule", "add", "--every", "1h", "--kind", "noop", "--payload", `{"report":"daily"}`, "hourly"},
		{"limit", "set", "--kind", "fetch", "--per", "key", "--concurrency", "2", "api"},
		{"limit", "set", "--kind", "send", "--per", "key", "--rate", "100/m", "--burst", "5", "mail"},
		{"limit", "set", "--kind", "train", "--per", "fleet", "--concurrency", "4", "train"},
		{"pipeline", "submit", "--allow-unowned", file},
	} {
		if _, stderr, code := runWorker(t, append(args, "--dsn", dsn)...); code != exitOK {
			t.Fatalf("worker %v: exit %d: %s", args, code, stderr)
		}
	}

	ctx := context.Background()
	s, err := postgres.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.TakeShare(ctx, store.ShareRequest{Limit: "train", Owner: "live/1", Node: "live", Running: 1,
		MaxDemand: 10, Buckets: bucket.All(10).Slice(), TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	// The waiting task's holder says why it does not start it.
	id, _ := strconv.ParseInt(waiting, 10, 64)
	tk, err := s.GetTask(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	epoch := int64(0)
	leases, err := s.ListBuckets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l := leases[tk.Bucket]; l.Holder == "live/1" {
		epoch = l.Epoch
	} else {
		got, err := s.AcquireBuckets(ctx, store.AcquireRequest{Owner: "live/1", Node: "live", Buckets: bucket.Of(tk.Bucket), TTL: time.Hour})
		if err != nil || len(got) != 1 {
			t.Fatalf("acquire bucket %d: %v %v", tk.Bucket, got, err)
		}
		epoch = got[0].Epoch
	}
	// A running task of the fleet-limited kind gives limit list a holder.
	train := submit("--kind", "train", "--key", "order-3", "--limit-key", "tenant-7")
	got, err := s.ClaimTasks(ctx, store.ClaimRequest{Owner: "live/1", Node: "live",
		Buckets: []store.HeldBucket{{Bucket: tk.Bucket, Epoch: epoch}}, Kinds: []string{"train"}, Limit: 1,
		LeaseTTL: time.Hour})
	if err != nil || len(got) != 1 {
		t.Fatalf("claim the train task: %v %v", got, err)
	}
	// Its handler saved how far it got.
	if err := s.SaveProgress(ctx, "live/1", got[0].Ref(), []byte(`{"epoch":2}`)); err != nil {
		t.Fatal(err)
	}
	p, err := s.GetPipeline(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	step := strconv.FormatInt(p.Steps[0].Task.ID, 10)
	if n, err := s.SetWaitReasons(ctx, "live/1", []store.HeldBucket{{Bucket: tk.Bucket, Epoch: epoch}},
		[]store.WaitReason{{Kind: "fetch", LimitKey: "tenant-7", Reason: "concurrency limit api: tenant-7 at 2/2"}}); err != nil || n != 1 {
		t.Fatalf("SetWaitReasons: %d, %v", n, err)
	}

	return dsn, map[string][][]string{
		"get":           {{"get", waiting}, {"get", cancelled}, {"get", train}, {"get", step}, {"get", later}},
		"list":          {{"list"}},
		"buckets":       {{"buckets"}},
		"nodes":         {{"nodes", "--all"}},
		"bucket-of":     {{"bucket-of", "order-1"}},
		"schedule list": {{"schedule", "list"}},
		"limit list":    {{"limit", "list"}},
		"pipeline get":  {{"pipeline", "get", "1"}},
	}
}

// TestJSONOutputMatchesItsDocumentedShape runs every read command with
// --json on a real fleet and holds its output to the shape docs/cli.md
// documents: every required field present with its type, optional fields
// with theirs when present, and no field the shape does not name. Every
// documented field shows up at least once, but for the few a fleet
// without running nodes cannot produce.
func TestJSONOutputMatchesItsDocumentedShape(t *testing.T) {
	dsn, runs := shapeFleet(t)
	// Fields only a finished or running step has.
	notProduced := map[string]bool{"pipeline get.tasks.error": true, "pipeline get.tasks.result": true}
	if len(runs) != len(jsonShapes) {
		t.Errorf("the test runs %d read commands, the shapes document %d", len(runs), len(jsonShapes))
	}
	for _, shape := range jsonShapes {
		argss, ok := runs[shape.Command]
		if !ok {
			t.Errorf("%s: documented, not run", shape.Command)
			continue
		}
		seen := map[string]bool{}
		for _, args := range argss {
			stdout, stderr, code := runWorker(t, append(args, "--json", "--dsn", dsn)...)
			if code != exitOK {
				t.Fatalf("worker %v --json: exit %d: %s", args, code, stderr)
			}
			dec := json.NewDecoder(bytes.NewReader([]byte(stdout)))
			dec.UseNumber()
			var v any
			if err := dec.Decode(&v); err != nil {
				t.Fatalf("worker %v --json printed no JSON: %v\n%s", args, err, stdout)
			}
			for _, p := range shape.check(v) {
				t.Errorf("worker %s --json: %s", strings.Join(args, " "), p)
			}
			markSeen(seen, shape.Command, v)
		}
		for _, path := range fieldPaths(shape.Command, shape.Fields) {
			if !seen[path] && !notProduced[path] {
				t.Errorf("%s: the output never had %s", shape.Command, path)
			}
		}
	}
}

// markSeen records the path of every field v has, objects within arrays
// included: "get.events.seq".
func markSeen(seen map[string]bool, prefix string, v any) {
	switch v := v.(type) {
	case []any:
		for _, item := range v {
			if _, ok := item.(map[string]any); ok {
				markSeen(seen, prefix, item)
			}
		}
	case map[string]any:
		for name, value := range v {
			seen[prefix+"."+name] = true
			markSeen(seen, prefix+"."+name, value)
		}
	}
}

// fieldPaths lists the paths of the documented fields, nested ones
// included.
func fieldPaths(prefix string, fields []jsonField) []string {
	var paths []string
	for _, f := range fields {
		paths = append(paths, prefix+"."+f.Name)
		paths = append(paths, fieldPaths(prefix+"."+f.Name, f.Fields)...)
	}
	return paths
}

// schedule list, pause and resume tell a script the attempts a schedule's
// tasks get (the default, 3, when none was given, not the 0 stored for
// it) and the node that fires it.
func TestScheduleJSONSaysTheAttemptsAndTheHolder(t *testing.T) {
	dsn := viewFleet(t) // node live holds buckets 0-9
	policy, err := bucket.NewPolicy(bucket.DefaultCount)
	if err != nil {
		t.Fatal(err)
	}
	key := ""
	for n := 0; key == ""; n++ {
		if k := "nightly-" + strconv.Itoa(n); policy.Of(k) < 10 {
			key = k
		}
	}
	if _, stderr, code := runWorker(t, "schedule", "add", "--every", "1h", "--kind", "noop", "--key", key, "nightly",
		"--dsn", dsn); code != exitOK {
		t.Fatal(stderr)
	}
	for _, args := range [][]string{{"schedule", "list"}, {"schedule", "pause", "nightly"}, {"schedule", "resume", "nightly"}} {
		stdout, stderr, code := runWorker(t, append(args, "--json", "--dsn", dsn)...)
		if code != exitOK {
			t.Fatalf("worker %v: exit %d: %s", args, code, stderr)
		}
		var sc scheduleJSON
		if args[1] == "list" {
			var all []scheduleJSON
			if err := json.Unmarshal([]byte(stdout), &all); err != nil || len(all) != 1 {
				t.Fatalf("worker %v printed %s (%v)", args, stdout, err)
			}
			sc = all[0]
		} else if err := json.Unmarshal([]byte(stdout), &sc); err != nil {
			t.Fatalf("worker %v printed %s (%v)", args, stdout, err)
		}
		if sc.MaxAttempts != store.DefaultMaxAttempts || sc.Holder != "live" {
			t.Errorf("worker %s --json: max_attempts %d, holder %q; want %d and live",
				strings.Join(args, " "), sc.MaxAttempts, sc.Holder, store.DefaultMaxAttempts)
		}
	}
}
