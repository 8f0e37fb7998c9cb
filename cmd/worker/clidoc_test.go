package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// cliReferenceFile is docs/cli.md, from this package's directory.
var cliReferenceFile = filepath.Join("..", "..", "docs", "cli.md")

// TestCLIReferenceIsCurrent fails when docs/cli.md is not what the command
// definitions generate; go test ./cmd/worker -run TestCLIReferenceIsCurrent
// -update rewrites it.
func TestCLIReferenceIsCurrent(t *testing.T) {
	var b bytes.Buffer
	cliReference(&b)
	if *update {
		if err := os.WriteFile(cliReferenceFile, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(cliReferenceFile)
	if err != nil {
		t.Fatalf("%v (go test ./cmd/worker -run TestCLIReferenceIsCurrent -update writes it)", err)
	}
	if !bytes.Equal(got, b.Bytes()) {
		t.Errorf("%s is stale: go test ./cmd/worker -run TestCLIReferenceIsCurrent -update rewrites it", cliReferenceFile)
	}
}

// TestCLIReferenceNamesEveryCommandAndFlag: the reference has a section for
// every command, every flag of each, and every exit status.
func TestCLIReferenceNamesEveryCommandAndFlag(t *testing.T) {
	var b bytes.Buffer
	cliReference(&b)
	doc := b.String()
	for _, path := range commandPaths() {
		name := strings.Join(path, " ")
		section, ok := sectionOf(doc, "## worker "+name+"\n")
		if !ok {
			t.Errorf("no section for worker %s", name)
			continue
		}
		c := findCommand(t, path)
		for _, f := range c.VisibleFlags() {
			if !strings.Contains(section, "`--"+f.Names()[0]) && !strings.Contains(section, "`-"+f.Names()[0]) {
				t.Errorf("worker %s: flag %s missing", name, f.Names()[0])
			}
		}
	}
	for _, s := range exitStatuses {
		if !strings.Contains(doc, "| "+string(rune('0'+s.status))+" | ") {
			t.Errorf("exit status %d missing", s.status)
		}
	}
}

// sectionOf is the text from heading to the next heading of its level.
func sectionOf(doc, heading string) (string, bool) {
	i := strings.Index(doc, heading)
	if i < 0 {
		return "", false
	}
	rest := doc[i+len(heading):]
	if j := strings.Index(rest, "\n## "); j >= 0 {
		rest = rest[:j]
	}
	return rest, true
}

// findCommand is the command at path, as typed after "worker".
func findCommand(t *testing.T, path []string) *cli.Command {
	t.Helper()
	cmds := newApp(nil, nil).Commands
	var found *cli.Command
	for _, name := range path {
		found = nil
		for _, c := range cmds {
			if c.Name == name {
				found = c
			}
		}
		if found == nil {
			t.Fatalf("no command %v", path)
		}
		cmds = found.Subcommands
	}
	return found
}
