package node

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/clock"
	"github.com/flotilla-dev/flotilla/store/memory"
)

func TestNewRefusesABadConfigNamingTheField(t *testing.T) {
	all := func(c Config) Config { c.AllBuckets = true; return c }
	cases := []struct {
		name string
		cfg  Config
		want []string
	}{
		{"heartbeat not below the TTL", all(Config{BucketLeaseTTL: 3 * time.Second, BucketLeaseHeartbeat: 3 * time.Second}),
			[]string{"BucketLeaseHeartbeat 3s", "BucketLeaseTTL 3s"}},
		{"negative concurrency", all(Config{Concurrency: -1}), []string{"Concurrency", "-1"}},
		{"negative task lease", all(Config{TaskLeaseTTL: -time.Second}), []string{"TaskLeaseTTL", "-1s"}},
		{"negative poll interval", all(Config{PollInterval: -time.Second}), []string{"PollInterval", "-1s"}},
		{"negative shutdown timeout", all(Config{ShutdownTimeout: -time.Second}), []string{"ShutdownTimeout", "-1s"}},
		{"TTL inside its own margin", all(Config{BucketLeaseTTL: 200 * time.Millisecond}), []string{"BucketLeaseTTL 200ms"}},
		{"backoff cap below base", all(Config{BackoffBase: time.Minute, BackoffMax: time.Second}),
			[]string{"BackoffMax 1s", "BackoffBase 1m0s"}},
		{"no buckets", Config{}, []string{"Buckets is empty", "AllBuckets"}},
		{"both buckets and all", Config{AllBuckets: true, Buckets: bucket.Of(1, 2)}, []string{"AllBuckets", `"1-2"`}},
		{"a node id with a space", all(Config{NodeID: "my node"}), []string{"NodeID", `"my node"`}},
	}
	s := memory.New()
	defer s.Close()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(s, c.cfg)
			if err == nil {
				t.Fatal("New accepted it")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not mention %s", err, w)
				}
			}
		})
	}
}

func TestNewFillsInTheDefaults(t *testing.T) {
	s := memory.New()
	defer s.Close()
	n, err := New(s, Config{AllBuckets: true})
	if err != nil {
		t.Fatal(err)
	}
	c := n.cfg
	if c.Concurrency != DefaultConcurrency || c.BucketLeaseTTL != DefaultBucketLeaseTTL ||
		c.BucketLeaseHeartbeat != DefaultBucketLeaseTTL/3 || c.TaskLeaseTTL != DefaultTaskLeaseTTL ||
		c.ShutdownTimeout != DefaultShutdownTimeout || c.PollInterval != DefaultPollInterval ||
		c.BackoffBase != DefaultBackoffBase || c.BackoffMax != DefaultBackoffMax {
		t.Errorf("defaults not applied: %+v", c)
	}
	if _, ok := c.Clock.(clock.Real); !ok || c.Logger == nil || c.Executor == nil {
		t.Errorf("clock %T, logger %v, executor %T", c.Clock, c.Logger, c.Executor)
	}
	if !regexp.MustCompile(`^.+-\d+-[0-9a-f]{4}$`).MatchString(n.ID()) {
		t.Errorf("default node id %q is not <hostname>-<pid>-<4 hex>", n.ID())
	}
	if !strings.HasPrefix(n.Incarnation(), n.ID()+"/") || len(n.Incarnation()) <= len(n.ID())+1 {
		t.Errorf("incarnation %q is not the node id and a nonce", n.Incarnation())
	}
	other, _ := New(s, Config{AllBuckets: true, NodeID: n.ID()})
	if other.Incarnation() == n.Incarnation() {
		t.Error("two nodes with one id share an incarnation")
	}
}
