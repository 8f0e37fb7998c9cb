package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// readCommands are the commands that only read, with the arguments each
// needs.
var readCommands = [][]string{
	{"get", "1"}, {"list"}, {"buckets"}, {"nodes"}, {"pipeline", "get", "1"}, {"schedule", "list"}, {"limit", "list"},
}

// A read command never creates the SQLite file: where there is none it
// says which file is missing and what creates it, with exit status 3.
func TestReadCommandsDoNotCreateTheFile(t *testing.T) {
	withoutDSNEnv(t)
	dir := t.TempDir()
	t.Chdir(dir)
	path := filepath.Join(dir, "flotilla.db")
	// The dashboard too, read-only or with its actions.
	t.Setenv(uiTokenEnv, "")
	dashboards := [][]string{{"ui", "--listen", "127.0.0.1:0"}, {"ui", "--listen", "127.0.0.1:0", "--token-file", tokenFile(t)}}
	for _, args := range append(readCommands, dashboards...) {
		_, stderr, code := runWorker(t, args...)
		if code != exitRefused {
			t.Errorf("worker %s in an empty directory: exit %d, want %d; stderr: %s", strings.Join(args, " "), code, exitRefused, stderr)
		}
		for _, want := range []string{path + " does not exist", "worker migrate"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("worker %s in an empty directory says %q, want it to say %q", strings.Join(args, " "), stderr, want)
			}
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Fatalf("worker %s in an empty directory left %v", strings.Join(args, " "), entries)
		}
	}
}

// A read command writes nothing to the file it reads: an empty file stays
// empty (it has no schema, exit 3), where opening it for writing made it a
// database of one page.
func TestReadCommandsLeaveAnEmptyFileEmpty(t *testing.T) {
	withoutDSNEnv(t)
	path := filepath.Join(t.TempDir(), "zero.db")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range readCommands {
		_, stderr, code := runWorker(t, append(args, "--dsn", path)...)
		if code != exitRefused || !strings.Contains(stderr, "worker migrate") {
			t.Errorf("worker %s on an empty file: exit %d, want %d and the schema missing; stderr: %s",
				strings.Join(args, " "), code, exitRefused, stderr)
		}
		if fi, err := os.Stat(path); err != nil || fi.Size() != 0 {
			t.Fatalf("worker %s grew an empty file to %d bytes (%v)", strings.Join(args, " "), fi.Size(), err)
		}
	}
}

// tokenFile writes a dashboard token to a file of the test's.
func tokenFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte(strings.Repeat("t", 40)), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
