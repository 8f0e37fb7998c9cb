package node

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/clock"
	"github.com/flotilla-dev/flotilla/store"
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
		{"a node id with a control character", all(Config{NodeID: "a\x07b"}), []string{"NodeID", `"a\ab"`, "control character"}},
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

// A declared limit or capacity that no store could keep is refused by New,
// before Start writes anything, with the entry's field and the bad value.
func TestNewRefusesABadLimitOrCapacityNamingTheField(t *testing.T) {
	api := store.Limit{Name: "api", Kind: "fetch", Per: store.PerKey, Concurrency: 2}
	// The bad limit comes second, so the error must point at its index.
	limits := func(bad store.Limit) Config {
		return Config{AllBuckets: true, Limits: []store.Limit{api, bad}}
	}
	capacity := func(r store.Resources) Config { return Config{AllBuckets: true, Capacity: r} }
	cases := []struct {
		name string
		cfg  Config
		want []string
	}{
		{"per key with neither a concurrency nor a rate", limits(store.Limit{Name: "idle", Kind: "fetch", Per: store.PerKey}),
			[]string{"Limits[1]", `limit "idle"`, "exactly one of a concurrency and a rate"}},
		{"a negative concurrency", limits(store.Limit{Name: "neg", Kind: "fetch", Per: store.PerKey, Concurrency: -2}),
			[]string{"Limits[1]", "limit concurrency -2"}},
		{"a concurrency above the maximum", limits(store.Limit{Name: "big", Kind: "fetch", Per: store.PerKey,
			Concurrency: store.MaxLimitConcurrency + 1}), []string{"Limits[1]", "limit concurrency 1000001"}},
		{"a negative rate", limits(store.Limit{Name: "neg", Kind: "send", Per: store.PerKey, Rate: -1, Period: time.Second}),
			[]string{"Limits[1]", "limit rate -1"}},
		{"a rate limit per fleet", limits(store.Limit{Name: "mail", Kind: "send", Per: store.PerFleet, Rate: 5, Period: time.Second}),
			[]string{"Limits[1]", `limit scope "fleet"`, "cannot carry a rate"}},
		{"a rate without a period", limits(store.Limit{Name: "mail", Kind: "send", Per: store.PerKey, Rate: 5}),
			[]string{"Limits[1]", "limit period 0s"}},
		{"a burst without a rate", limits(store.Limit{Name: "wide", Kind: "send", Per: store.PerFleet, Concurrency: 4, Burst: 2}),
			[]string{"Limits[1]", `limit "wide"`, "burst without a rate"}},
		{"an unknown scope", limits(store.Limit{Name: "odd", Kind: "fetch", Per: "node", Concurrency: 1}),
			[]string{"Limits[1]", `limit scope "node"`}},
		{"no scope", limits(store.Limit{Name: "odd", Kind: "fetch", Concurrency: 1}),
			[]string{"Limits[1]", `limit scope ""`}},
		{"an empty limit name", limits(store.Limit{Kind: "fetch", Per: store.PerKey, Concurrency: 1}),
			[]string{"Limits[1]", `limit name "" is empty`}},
		{"a control character in a limit name", limits(store.Limit{Name: "a\x00pi", Kind: "fetch", Per: store.PerKey, Concurrency: 1}),
			[]string{"Limits[1]", `limit name "a\x00pi"`, "control character"}},
		{"an empty limit kind", limits(store.Limit{Name: "nokind", Per: store.PerKey, Concurrency: 1}),
			[]string{"Limits[1]", `limit kind "" is empty`}},
		// Same name, another kind and rule: the second would replace the
		// first in the store at Start.
		{"two limits with one name", limits(store.Limit{Name: "api", Kind: "send", Per: store.PerFleet, Concurrency: 9}),
			[]string{"Limits[1]", `limit "api" is declared twice`}},
		{"a zero capacity", capacity(store.Resources{"gpu": 0}), []string{"Capacity", `"gpu=0"`, "out of range"}},
		{"a negative capacity", capacity(store.Resources{"gpu": 1, "mem": -8}), []string{"Capacity", `"mem=-8"`, "out of range"}},
		{"an empty capacity name", capacity(store.Resources{"": 1}), []string{"Capacity", `capacity name "" is empty`}},
		{"a control character in a capacity name", capacity(store.Resources{"g\apu": 1}),
			[]string{"Capacity", `capacity name "g\apu"`, "control character U+0007"}},
		{"a blank capacity name", capacity(store.Resources{"  ": 1}), []string{"Capacity", `capacity name "  " is blank`}},
		{"a capacity name with '='", capacity(store.Resources{"gpu=1": 1}), []string{"Capacity", `capacity name "gpu=1"`}},
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
			// The command line refuses bad flags with ValidateConfig before it
			// connects: it must refuse what New refuses, in the same words.
			if verr := ValidateConfig(c.cfg); verr == nil || verr.Error() != err.Error() {
				t.Errorf("ValidateConfig: %v; New: %v", verr, err)
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
