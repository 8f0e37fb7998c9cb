package main

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/postgres"
)

func TestLimitSetListRemove(t *testing.T) {
	dsn := viewFleet(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--kind", "fetch", "--per", "key", "--concurrency", "2", "api"}, "limit api set: kind fetch, concurrency 2 per key"},
		{[]string{"--kind", "send", "--per", "key", "--rate", "100/m", "--burst", "5", "mail"}, "limit mail set: kind send, rate 100/1m0s burst 5 per key"},
		{[]string{"--kind", "train", "--per", "fleet", "--concurrency", "4", "train"}, "limit train set: kind train, concurrency 4 per fleet"},
	} {
		stdout, stderr, code := runWorker(t, append([]string{"limit", "set", "--dsn", dsn}, c.args...)...)
		if code != exitOK || strings.TrimSpace(stdout) != c.want {
			t.Fatalf("limit set %v: exit %d, %q, want %q; stderr: %s", c.args, code, stdout, c.want, stderr)
		}
	}
	// A holder's share of the fleet-wide limit shows in the list.
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
	// Node live runs three fetch tasks: two of key tenant-7, at its
	// limit of 2, and one of key solo.
	if _, err := s.CreateTasks(ctx, []store.NewTask{{Kind: "fetch", Key: "a", LimitKey: "tenant-7", Bucket: 0},
		{Kind: "fetch", Key: "b", LimitKey: "tenant-7", Bucket: 0}, {Kind: "fetch", Key: "solo", Bucket: 0}}); err != nil {
		t.Fatal(err)
	}
	leases, err := s.AcquireBuckets(ctx, store.AcquireRequest{Owner: "live/1", Node: "live", Buckets: bucket.Of(0), TTL: time.Hour})
	if err != nil || len(leases) != 1 || !leases[0].Held {
		t.Fatalf("taking bucket 0: %+v, %v", leases, err)
	}
	if got, err := s.ClaimTasks(ctx, store.ClaimRequest{Owner: "live/1", Node: "live", Kinds: []string{"fetch"}, Limit: 10,
		LeaseTTL: time.Hour, Buckets: []store.HeldBucket{{Bucket: 0, Epoch: leases[0].Epoch}}}); err != nil || len(got) != 3 {
		t.Fatalf("claimed %d: %v", len(got), err)
	}
	stdout, stderr, code := runWorker(t, "limit", "list", "--dsn", dsn)
	if code != exitOK {
		t.Fatal(stderr)
	}
	for _, want := range []string{"api", "concurrency 2 per key", "rate 100/1m0s burst 5 per key", "live 1 of demand 1",
		"live 3 running over 2 keys (1 at its limit)"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("limit list does not say %q:\n%s", want, stdout)
		}
	}
	stdout, _, _ = runWorker(t, "limit", "list", "--dsn", dsn, "--json")
	var listed []limitJSON
	if err := json.Unmarshal([]byte(stdout), &listed); err != nil {
		t.Fatalf("%v: %s", err, stdout)
	}
	if len(listed) != 3 || listed[1].Name != "mail" || listed[1].Period != "1m0s" || listed[1].Burst != 5 ||
		listed[2].Name != "train" || len(listed[2].Shares) != 1 || listed[2].Shares[0].Node != "live" || !listed[2].Shares[0].Alive ||
		len(listed[0].Holders) != 1 || listed[0].Holders[0] != (holderJSON{Node: "live", Running: 3, Keys: 2, KeysAtLimit: 1}) {
		t.Errorf("limit list --json: %s", stdout)
	}
	// A replacement keeps the name and changes the rule.
	if _, stderr, code := runWorker(t, "limit", "set", "--dsn", dsn, "--kind", "fetch", "--per", "fleet", "--concurrency", "3", "api"); code != exitOK {
		t.Fatal(stderr)
	}
	if stdout, _, _ := runWorker(t, "limit", "list", "--dsn", dsn); !strings.Contains(stdout, "concurrency 3 per fleet") {
		t.Errorf("the replaced limit is not listed:\n%s", stdout)
	}
	if stdout, stderr, code := runWorker(t, "limit", "rm", "--dsn", dsn, "api"); code != exitOK || !strings.Contains(stdout, "limit api removed") {
		t.Fatalf("limit rm: exit %d, %q; stderr: %s", code, stdout, stderr)
	}
	if _, stderr, code := runWorker(t, "limit", "rm", "--dsn", dsn, "api"); code != exitNotFound {
		t.Errorf("limit rm twice: exit %d, want %d; stderr: %s", code, exitNotFound, stderr)
	}
}

func TestGetSaysWhichLimitATaskWaitsFor(t *testing.T) {
	withoutDSNEnv(t)
	dsn := testdb.New(t)
	if _, stderr, code := runWorker(t, "migrate", "--dsn", dsn); code != exitOK {
		t.Fatal(stderr)
	}
	stdout, stderr, code := runWorker(t, "submit", "--dsn", dsn, "--kind", "fetch", "--key", "order-1", "--limit-key", "tenant-7",
		"--resources", "gpu=1,mem=8", "--allow-unowned", "--allow-unknown-kind")
	if code != exitOK {
		t.Fatal(stderr)
	}
	id, err := strconv.ParseInt(strings.TrimSpace(stdout), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := postgres.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tk, err := s.GetTask(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	policy, _ := bucket.NewPolicy(bucket.DefaultCount)
	if tk.Bucket != policy.Of("tenant-7") {
		t.Errorf("the task is in bucket %d, want the limit key's %d", tk.Bucket, policy.Of("tenant-7"))
	}
	// The bucket's holder says why the task waits.
	leases, err := s.AcquireBuckets(ctx, store.AcquireRequest{Owner: "w/1", Node: "w", Buckets: bucket.Of(tk.Bucket), TTL: time.Hour})
	if err != nil || len(leases) != 1 {
		t.Fatalf("acquire: %v %v", leases, err)
	}
	reason := "concurrency limit api: tenant-7 at 2/2"
	if n, err := s.SetWaitReasons(ctx, "w/1", []store.HeldBucket{{Bucket: tk.Bucket, Epoch: leases[0].Epoch}},
		[]store.WaitReason{{Kind: "fetch", LimitKey: "tenant-7", Reason: reason}}); err != nil || n != 1 {
		t.Fatalf("SetWaitReasons: %d, %v", n, err)
	}
	stdout, _, _ = runWorker(t, "get", "--dsn", dsn, strconv.FormatInt(id, 10))
	for _, want := range []string{"waiting", reason, "limit key", "tenant-7", "resources", "gpu=1,mem=8"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("get does not say %q:\n%s", want, stdout)
		}
	}
	stdout, _, _ = runWorker(t, "get", "--dsn", dsn, "--json", strconv.FormatInt(id, 10))
	var got taskJSON
	if err := json.Unmarshal([]byte(stdout), &got); err != nil {
		t.Fatal(err)
	}
	if got.LimitKey != "tenant-7" || got.Resources["mem"] != 8 || got.WaitReason != reason || !strings.Contains(got.Waiting, reason) {
		t.Errorf("get --json: %s", stdout)
	}
}
