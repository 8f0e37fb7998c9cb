package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/postgres"
)

// TestBucketsMoveAndUnpin: move pins buckets to a live node that declares
// them, and buckets shows the pin as the target; a node that does not
// declare them, or is not live, is refused with exit 3; bad BUCKETS are
// exit 2; unpin removes the pins. nodes shows each node's share.
func TestBucketsMoveAndUnpin(t *testing.T) {
	dsn := viewFleet(t)
	ctx := context.Background()
	s, err := postgres.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.RegisterNode(ctx, store.NodeInfo{ID: "other", Incarnation: "other/1", Buckets: bucket.All(32),
		Kinds: []string{"noop"}, Balance: true}, time.Hour); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"0-3", "--to", "recent"}, exitRefused, "not a live node"},
		{[]string{"0-3", "--to", "nobody"}, exitRefused, "not a live node"},
		{[]string{"30-33", "--to", "other"}, exitRefused, "does not declare them"},
		{[]string{"3-1", "--to", "other"}, exitInvalid, "BUCKETS"},
		{[]string{"64", "--to", "other"}, exitInvalid, "64"},
		{[]string{"0-3"}, exitInvalid, "--to"},
		{[]string{"--to", "other"}, exitInvalid, "one BUCKETS argument"},
	} {
		_, stderr, code := runWorker(t, append([]string{"buckets", "move", "--dsn", dsn}, c.args...)...)
		if code != c.code || !strings.Contains(stderr, c.says) {
			t.Errorf("buckets move %v: exit %d, %q; want exit %d saying %q", c.args, code, stderr, c.code, c.says)
		}
	}

	stdout, stderr, code := runWorker(t, "buckets", "move", "--dsn", dsn, "0-3", "--to", "other")
	if code != exitOK || !strings.Contains(stdout, "pinned to other") {
		t.Fatalf("buckets move 0-3 --to other: exit %d, %s %s", code, stdout, stderr)
	}
	stdout, _, _ = runWorker(t, "buckets", "--dsn", dsn, "--json")
	var bs []bucketJSON
	if err := json.Unmarshal([]byte(stdout), &bs); err != nil {
		t.Fatal(err)
	}
	for _, b := range bs[:4] {
		if b.Pin != "other" || b.Target != "other" || b.Holder != "live" {
			t.Errorf("bucket %d after the move: pin %q, target %q, holder %q; want pinned and targeted to other, "+
				"still held by live until it hands it over", b.Bucket, b.Pin, b.Target, b.Holder)
		}
	}
	stdout, _, _ = runWorker(t, "buckets", "--dsn", dsn)
	if !strings.Contains(stdout, "other (pinned)") {
		t.Errorf("buckets does not show the pin:\n%s", stdout)
	}

	stdout, _, _ = runWorker(t, "nodes", "--dsn", dsn, "--json")
	var ns []nodeJSON
	if err := json.Unmarshal([]byte(stdout), &ns); err != nil {
		t.Fatal(err)
	}
	shares := map[string]int{}
	for _, n := range ns {
		shares[n.ID] = n.Share
	}
	// live does not balance (registered as an older node would): it keeps
	// 4-9, which it holds; other, which does, gets its pins and the rest of
	// 0-31.
	if shares["live"] != 6 || shares["other"] != 26 || shares["recent"] != 0 {
		t.Errorf("shares %v, want live 6, other 26, recent 0", shares)
	}

	if _, stderr, code := runWorker(t, "buckets", "unpin", "--dsn", dsn, "0-3"); code != exitOK {
		t.Fatalf("buckets unpin: exit %d, %s", code, stderr)
	}
	stdout, _, _ = runWorker(t, "buckets", "--dsn", dsn, "--json")
	bs = nil
	if err := json.Unmarshal([]byte(stdout), &bs); err != nil {
		t.Fatal(err)
	}
	if bs[0].Pin != "" || bs[0].Target != "live" {
		t.Errorf("bucket 0 after unpin: pin %q, target %q; want no pin, and its holder live again", bs[0].Pin, bs[0].Target)
	}
}
