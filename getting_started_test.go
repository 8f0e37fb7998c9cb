package flotilla_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestTheGettingStartedProgramsRunAsWritten takes the programs of
// docs/getting-started.md out of the page, builds them against this
// checkout and runs them, so that the page cannot drift from the library:
// the first program (held to a main of at most 30 lines) and the flotilla
// side of the River email port.
func TestTheGettingStartedProgramsRunAsWritten(t *testing.T) {
	page, err := os.ReadFile(filepath.Join("docs", "getting-started.md"))
	if err != nil {
		t.Fatal(err)
	}
	first := goBlockAfter(t, string(page), "<!-- The first program:")
	if lines := mainLines(t, first); lines > 30 {
		t.Errorf("the first program's main is %d lines; the page promises at most 30", lines)
	}
	port := goBlockAfter(t, string(page), "// flotilla\npackage main")

	root, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	mod := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		path := filepath.Join(mod, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module hello\n\ngo 1.26\n\nrequire github.com/flotilla-dev/flotilla v0.0.0\n\n"+
		"replace github.com/flotilla-dev/flotilla => "+root+"\n")
	sum, err := os.ReadFile("go.sum")
	if err != nil {
		t.Fatal(err)
	}
	write("go.sum", string(sum))
	write("first/main.go", first)
	write("email/main.go", port)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// The checkout's go.sum pins every module the programs need; the module
	// graph may still want go.mod files of older versions that building
	// the checkout never fetched, so the go command may reach the module
	// proxy as it would for a reader.
	build := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(mod, "bin")+string(filepath.Separator), "./first", "./email")
	build.Dir = mod
	build.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build of the page's programs: %v\n%s", err, out)
	}

	for _, c := range []struct{ program, want string }{
		{"first", "hello, Ada\n"},
		{"email", "sent an email to ada@example.com\n"},
	} {
		work := t.TempDir()             // where the program's SQLite file goes
		for run := 1; run <= 2; run++ { // the second run finds the schema in place
			cmd := exec.CommandContext(ctx, filepath.Join(mod, "bin", c.program))
			cmd.Dir = work
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("%s, run %d: %v\n%s%s", c.program, run, err, stdout.String(), stderr.String())
			}
			if stdout.String() != c.want {
				t.Errorf("%s, run %d printed %q, want %q (stderr %q)", c.program, run, stdout.String(), c.want, stderr.String())
			}
		}
	}
}

// goBlockAfter returns the first ```go block of page that follows marker,
// or whose text starts with it.
func goBlockAfter(t *testing.T, page, marker string) string {
	t.Helper()
	at := strings.Index(page, marker)
	if at < 0 {
		t.Fatalf("docs/getting-started.md has no %q", marker)
	}
	start := strings.LastIndex(page[:at], "```go\n")
	if start < 0 || strings.Contains(page[start:at], "```\n") {
		start = strings.Index(page[at:], "```go\n")
		if start < 0 {
			t.Fatalf("no Go block follows %q", marker)
		}
		start += at
	}
	body := page[start+len("```go\n"):]
	end := strings.Index(body, "```")
	if end < 0 {
		t.Fatalf("the Go block at %q does not end", marker)
	}
	return body[:end]
}

// mainLines counts the lines of the body of func main in src.
func mainLines(t *testing.T, src string) int {
	t.Helper()
	_, rest, ok := strings.Cut(src, "\nfunc main() {\n")
	if !ok {
		t.Fatal("the program has no func main")
	}
	body, _, ok := strings.Cut(rest, "\n}\n")
	if !ok {
		t.Fatal("func main does not end")
	}
	return strings.Count(body, "\n") + 1
}
