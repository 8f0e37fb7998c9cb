package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/sqlite"
)

// A node that cannot start says why and nothing else: no "shutting down ...
// press Ctrl-C again" before the real error, which it never was. A bad
// --http address is invalid input (exit 2), refused before anything
// connects. And a database file that other users may read is named in a
// warning at start.
func TestAStartThatFailsSaysWhyAndNothingElse(t *testing.T) {
	withoutDSNEnv(t)
	path := filepath.Join(t.TempDir(), "fleet.db")
	dsn := "sqlite:" + path
	if _, stderr, code := runWorker(t, "migrate", "--num-buckets", "8", "--dsn", dsn); code != exitOK {
		t.Fatal(stderr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := sqlite.New(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	err = s.RegisterNode(ctx, store.NodeInfo{ID: "live", Incarnation: "live/1", Buckets: bucket.All(8), Kinds: []string{"noop"}}, time.Hour)
	s.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil { // as a file made before the store made them private
		t.Fatal(err)
	}

	cases := []struct {
		name string
		args []string
		code int
		says []string
	}{
		{"a node id in use", []string{"run", "--node-id", "live", "--dsn", dsn}, exitRefused,
			[]string{`node id "live" is in use`, "readable by other users", path}},
		{"an address without a port", []string{"run", "--node-id", "n2", "--http", "nonsense", "--dsn", dsn}, exitInvalid,
			[]string{`invalid --http "nonsense"`}},
		{"a port out of range", []string{"run", "--node-id", "n2", "--http", "127.0.0.1:99999", "--dsn", dsn}, exitInvalid,
			[]string{`invalid --http "127.0.0.1:99999"`}},
	}
	for _, c := range cases {
		_, stderr, code := runWorker(t, c.args...)
		if code != c.code {
			t.Errorf("%s: exit %d, want %d; stderr:\n%s", c.name, code, c.code, stderr)
		}
		for _, want := range c.says {
			if !strings.Contains(stderr, want) {
				t.Errorf("%s: stderr does not say %q:\n%s", c.name, want, stderr)
			}
		}
		for _, never := range []string{"shutting down", "Ctrl-C"} {
			if strings.Contains(stderr, never) {
				t.Errorf("%s: a start that failed says %q:\n%s", c.name, never, stderr)
			}
		}
	}
}

// A unique key taken is refused naming the task that holds it, in the
// store's words, on SQLite as on every store.
func TestADuplicateUniqueKeyNamesItsHolder(t *testing.T) {
	dsn := sqliteFleet(t) // task 3 holds unique key "u"
	_, stderr, code := runWorker(t, "submit", "--kind", "noop", "--key", "k", "--unique-key", "u", "--allow-unowned", "--dsn", dsn)
	if code != exitRefused || !strings.Contains(stderr, `unique key "u" is held by unfinished task 3`) {
		t.Errorf("a unique key held: exit %d, stderr %q; want %d naming task 3", code, stderr, exitRefused)
	}
	for _, driver := range []string{"constraint", "UNIQUE", "2067"} {
		if strings.Contains(stderr, driver) {
			t.Errorf("the refusal carries SQLite's text %q: %s", driver, stderr)
		}
	}
}
