package main

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

var update = flag.Bool("update", false, "rewrite the golden help files under testdata/help")

// commandPaths lists every command and subcommand, as typed after "worker".
func commandPaths() [][]string {
	var out [][]string
	var walk func(parent []string, cmds []*cli.Command)
	walk = func(parent []string, cmds []*cli.Command) {
		for _, c := range cmds {
			path := append(append([]string{}, parent...), c.Name)
			out = append(out, path)
			walk(path, c.Subcommands)
		}
	}
	walk(nil, newApp(nil, nil).Commands)
	return out
}

// TestHelpIsGolden compares the help of the program and of every command
// with testdata/help; go test -run TestHelpIsGolden -update rewrites them.
func TestHelpIsGolden(t *testing.T) {
	paths := append([][]string{{}}, commandPaths()...)
	for _, path := range paths {
		name := strings.Join(path, "_")
		if name == "" {
			name = "worker"
		}
		t.Run(name, func(t *testing.T) {
			stdout, stderr, code := runWorker(t, append(path, "--help")...)
			if code != exitOK || stderr != "" {
				t.Fatalf("exit %d, stderr %q", code, stderr)
			}
			file := filepath.Join("testdata", "help", name+".golden")
			if *update {
				if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(file, []byte(stdout), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(file)
			if err != nil {
				t.Fatalf("%v (run go test ./cmd/worker -run TestHelpIsGolden -update)", err)
			}
			if stdout != string(want) {
				t.Errorf("help of %q differs from %s (go test -run TestHelpIsGolden -update rewrites it):\n%s", name, file, stdout)
			}
		})
	}
}

// TestEveryCommandsHelpTeaches: two examples and the exit statuses in the
// help of every command, and no default said twice.
func TestEveryCommandsHelpTeaches(t *testing.T) {
	for _, path := range commandPaths() {
		stdout, _, _ := runWorker(t, append(path, "--help")...)
		name := strings.Join(path, " ")
		ex, ok := examples[name]
		if !ok || len(ex) < 2 {
			t.Errorf("worker %s has %d examples, want 2 or more", name, len(ex))
			continue
		}
		for _, want := range append([]string{"Examples:", "Exit status:", "2  invalid input"}, ex...) {
			if !strings.Contains(stdout, want) {
				t.Errorf("worker %s --help does not say %q", name, want)
			}
		}
		for _, line := range strings.Split(stdout, "\n") {
			if strings.Count(line, "default") > 1 {
				t.Errorf("worker %s --help says a default twice: %s", name, strings.TrimSpace(line))
			}
		}
	}
}

func TestVersionNamesTheCommit(t *testing.T) {
	defer func(v, c string) { version, commit = v, c }(version, commit)
	version, commit = "v1.2.3", "abc1234"
	stdout, _, code := runWorker(t, "--version")
	if code != exitOK || strings.TrimSpace(stdout) != "worker version v1.2.3 (commit abc1234)" {
		t.Errorf("--version: exit %d, %q", code, stdout)
	}
}

// The default store is an SQLite file: the help of the program, of
// migrate and of every flag naming the database says so, and shows the
// default file.
func TestHelpSaysTheDefaultIsAnSQLiteFile(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"migrate", "--help"}} {
		stdout, _, _ := runWorker(t, args...)
		if !strings.Contains(stdout, "SQLite file (the default)") && !strings.Contains(stdout, "an SQLite file (the default)") {
			t.Errorf("worker %s does not say the default is an SQLite file:\n%s", strings.Join(args, " "), stdout)
		}
	}
	for _, path := range commandPaths() {
		stdout, _, _ := runWorker(t, append(path, "--help")...)
		if !strings.Contains(stdout, "--dsn value") {
			continue
		}
		name := strings.Join(path, " ")
		if !strings.Contains(stdout, "(default: $FLOTILLA_DSN, else sqlite:flotilla.db)") {
			t.Errorf("worker %s --help does not show the default database, sqlite:flotilla.db", name)
		}
		if strings.Contains(stdout, "PostgreSQL connection string") {
			t.Errorf("worker %s --help calls the database a PostgreSQL connection string", name)
		}
	}
}

// `worker version` and --version after any command print what --version
// prints, as users expect of a command line, and exit 0.
func TestVersionIsACommandAndEveryCommandTakesVersion(t *testing.T) {
	defer func(v, c string) { version, commit = v, c }(version, commit)
	version, commit = "v1.2.3", "abc1234"
	const want = "worker version v1.2.3 (commit abc1234)"
	runs := [][]string{{"version"}, {"--version"}}
	for _, path := range commandPaths() {
		runs = append(runs, append(path, "--version"))
	}
	for _, args := range runs {
		stdout, stderr, code := runWorker(t, args...)
		if code != exitOK || strings.TrimSpace(stdout) != want {
			t.Errorf("worker %s: exit %d, stdout %q, stderr %q; want %q", strings.Join(args, " "), code, stdout, stderr, want)
		}
	}
}

func TestCompletionScripts(t *testing.T) {
	for shell, want := range map[string]string{
		"bash": "complete -o bashdefault", "zsh": "#compdef worker", "fish": "complete -c worker",
	} {
		stdout, stderr, code := runWorker(t, "completion", shell)
		if code != exitOK || !strings.Contains(stdout, want) {
			t.Errorf("completion %s: exit %d, stderr %q, script does not hold %q", shell, code, stderr, want)
		}
	}
	// The scripts ask the binary for candidates. urfave/cli reads os.Args
	// for them, not the arguments given to Run.
	defer func(args []string) { os.Args = args }(os.Args)
	os.Args = []string{"worker", "--generate-bash-completion"}
	stdout, _, code := runWorker(t, "--generate-bash-completion")
	if code != exitOK || !strings.Contains(stdout, "submit\n") || !strings.Contains(stdout, "schedule\n") {
		t.Errorf("--generate-bash-completion: exit %d, %q", code, stdout)
	}
}
