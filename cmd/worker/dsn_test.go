package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/flotilla-dev/flotilla/internal/testdb"
)

// unreachable is a connection string whose server refuses at once: the
// commands that take it get past their flags and fail to connect (exit 1).
const unreachable = "postgres://flotilla@127.0.0.1:1/fleet?sslmode=disable&connect_timeout=5"

// withoutDSNEnv runs the test with FLOTILLA_DSN unset, restoring it after.
func withoutDSNEnv(t *testing.T) {
	t.Helper()
	t.Setenv(dsnEnv, "") // registers the restore
	if err := os.Unsetenv(dsnEnv); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "dsn")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestDSNRefusals(t *testing.T) {
	withoutDSNEnv(t)
	missing := filepath.Join(t.TempDir(), "no-such-file")
	empty := writeFile(t, " \n\t\n")
	good := writeFile(t, unreachable)
	tests := []struct {
		name     string
		env      string
		args     []string
		mentions []string
	}{
		{name: "both flags", args: []string{"run", "--dsn", unreachable, "--dsn-file", good},
			mentions: []string{"--dsn and --dsn-file both give the connection string"}},
		{name: "missing file", args: []string{"migrate", "--dsn-file", missing},
			mentions: []string{"--dsn-file " + missing + " cannot be read", "no such file or directory"}},
		{name: "directory", args: []string{"nodes", "--dsn-file", filepath.Dir(missing)},
			mentions: []string{"--dsn-file " + filepath.Dir(missing) + " cannot be read"}},
		{name: "empty file", args: []string{"list", "--dsn-file", empty},
			mentions: []string{"--dsn-file " + empty + " is empty"}},
		{name: "empty flag", args: []string{"buckets", "--dsn", ""},
			mentions: []string{"--dsn is empty"}},
		{name: "neither form", args: []string{"list", "--dsn", "mysql://u:hunter2@h/db"},
			mentions: []string{`"mysql://u@h/db"`, "postgres://", "sqlite:PATH", "path ending in .db"}},
		{name: "neither form from the environment", env: "host=db password=hunter2", args: []string{"run"},
			mentions: []string{"host=db", "postgres://", "sqlite:PATH"}},
		{name: "bucket-of missing file", args: []string{"bucket-of", "k", "--dsn-file", missing},
			mentions: []string{"--dsn-file " + missing}},
		{name: "bench both flags", args: []string{"bench", "--dsn", unreachable, "--dsn-file", good},
			mentions: []string{"--dsn and --dsn-file"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.env != "" {
				t.Setenv(dsnEnv, tt.env)
			}
			stdout, stderr, code := runWorker(t, tt.args...)
			if strings.Contains(stderr, "hunter2") {
				t.Errorf("stderr shows the password: %s", stderr)
			}
			if code != exitInvalid {
				t.Errorf("exit %d, want %d; stderr: %s", code, exitInvalid, stderr)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
			for _, want := range tt.mentions {
				if !strings.Contains(stderr, want) {
					t.Errorf("stderr %q does not say %q", stderr, want)
				}
			}
		})
	}
}

// TestDSNFileReachesTheFleet: the connection string read from a file, its
// surrounding whitespace ignored, works where --dsn would, and wins over
// FLOTILLA_DSN.
func TestDSNFileReachesTheFleet(t *testing.T) {
	path := writeFile(t, "\n  "+testdb.New(t)+"  \n")
	t.Setenv(dsnEnv, unreachable)
	for _, args := range [][]string{
		{"migrate", "--dsn-file", path},
		{"nodes", "--dsn-file", path},
		{"bucket-of", "some-key", "--dsn-file", path},
	} {
		if _, stderr, code := runWorker(t, args...); code != exitOK {
			t.Errorf("worker %s: exit %d, want 0; stderr: %s", strings.Join(args, " "), code, stderr)
		}
	}
}

func TestRunWarnsOfAPasswordOnTheCommandLine(t *testing.T) {
	const secret = "s3cret-Pa55"
	withPassword := strings.Replace(unreachable, "flotilla@", "flotilla:"+secret+"@", 1)
	const warning = "the database password was given on the command line"
	tests := []struct {
		name string
		args []string
		env  string // FLOTILLA_DSN
		warn bool
	}{
		{name: "url", args: []string{"--dsn", withPassword}, warn: true},
		{name: "url query", args: []string{"--dsn", unreachable + "&password=" + secret}, warn: true},
		{name: "no password", args: []string{"--dsn", unreachable}},
		{name: "file", args: []string{"--dsn-file", writeFile(t, withPassword)}},
		{name: "environment", env: withPassword},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			withoutDSNEnv(t)
			if tt.env != "" {
				t.Setenv(dsnEnv, tt.env)
			}
			_, stderr, code := runWorker(t, append([]string{"run", "--node-id", "n1"}, tt.args...)...)
			if code != exitRuntime || !strings.Contains(stderr, "cannot reach PostgreSQL") {
				t.Fatalf("exit %d, want %d, failing to connect; stderr: %s", code, exitRuntime, stderr)
			}
			if warned := strings.Contains(stderr, warning); warned != tt.warn {
				t.Errorf("warned %v, want %v; stderr: %s", warned, tt.warn, stderr)
			}
			if strings.Contains(stderr, secret) {
				t.Errorf("stderr shows the password: %s", stderr)
			}
			if dsn, ok := os.LookupEnv(dsnEnv); ok {
				t.Errorf("%s is still in the node's environment: %q", dsnEnv, dsn)
			}
		})
	}
}

func TestHasPassword(t *testing.T) {
	tests := []struct {
		dsn  string
		want bool
	}{
		{"postgres://u:p@h/db", true},
		{"postgresql://u:@h/db", true},
		{"postgres://u@h/db?password=p", true},
		{"postgres://u@h/db?sslmode=disable", false},
		{"postgres://h/db", false},
		{"postgres://u:p%zz@h/db", true}, // does not parse: assume the worst
		// Multi-host URLs, as an HA PostgreSQL's clients use (pg_autoctl show uri).
		{"postgres://u:p@h1:5432,h2:5433/db?target_session_attrs=read-write", true},
		{"postgres://u@h1:5432,h2:5433/db?target_session_attrs=read-write", false},
		{"postgres://u@[::1]:5432,[::1]:5433/db?target_session_attrs=read-write", false},
		{"postgres://u:p@[::1]:5432,[::1]:5433/db", true},
		{"postgres://u@[::1]:5432,[::1]:5433/db?password=p", true},
		{"host=h password=p", true},
		{"password = p host=h", true},
		{"host=h user=u", false},
		{"host=h user=nopassword", false},
	}
	for _, tt := range tests {
		if got := hasPassword(tt.dsn); got != tt.want {
			t.Errorf("hasPassword(%q) = %v, want %v", tt.dsn, got, tt.want)
		}
	}
}

func TestEveryCommandWithDSNTakesDSNFile(t *testing.T) {
	var walk func(path string, cmds []*cli.Command)
	walk = func(path string, cmds []*cli.Command) {
		for _, c := range cmds {
			name := strings.TrimSpace(path + " " + c.Name)
			if lookupFlag(c.Flags, dsnFlag.Name) != nil && lookupFlag(c.Flags, dsnFileFlag.Name) == nil {
				t.Errorf("worker %s takes --dsn but not --dsn-file", name)
			}
			walk(name, c.Subcommands)
		}
	}
	walk("", newApp(nil, nil).Commands)
}

// TestNoDSNUsesTheSQLiteFileInTheWorkingDirectory: with no --dsn,
// --dsn-file or $FLOTILLA_DSN every command uses flotilla.db in the working
// directory, and says so once on stderr.
func TestNoDSNUsesTheSQLiteFileInTheWorkingDirectory(t *testing.T) {
	withoutDSNEnv(t)
	dir := t.TempDir()
	t.Chdir(dir)
	note := "using the SQLite file " + filepath.Join(dir, "flotilla.db")
	for _, args := range [][]string{{"migrate", "--num-buckets", "8"}, {"submit", "--kind", "noop", "--key", "k", "--allow-unowned", "--allow-unknown-kind"}, {"list"}} {
		stdout, stderr, code := runWorker(t, args...)
		if code != 0 {
			t.Fatalf("worker %v: exit %d; stderr: %s", args, code, stderr)
		}
		if n := strings.Count(stderr, note); n != 1 {
			t.Errorf("worker %v said %q %d times on stderr, want once: %s", args, note, n, stderr)
		}
		if strings.Contains(stdout, note) {
			t.Errorf("worker %v printed the note on stdout", args)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "flotilla.db")); err != nil {
		t.Fatalf("no flotilla.db in the working directory: %v", err)
	}
}
