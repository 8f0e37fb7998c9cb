package task

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// mermaidEdge is one transition of the state diagram: "running --> queued".
var mermaidEdge = regexp.MustCompile(`^\s*(\S+)\s*-->\s*(\S+?)\s*(:.*)?$`)

// TestConceptsDiagramMatchesTransitions holds the state diagram of
// docs/concepts.md to the transition table: every edge drawn is a
// transition the table allows, and every transition is drawn.
func TestConceptsDiagramMatchesTransitions(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "concepts.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "```mermaid\nstateDiagram-v2\n")
	if !ok {
		t.Fatal("docs/concepts.md has no mermaid stateDiagram-v2 block")
	}
	diagram, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("the state diagram in docs/concepts.md does not end")
	}
	drawn := map[[2]Status]bool{}
	for _, line := range strings.Split(diagram, "\n") {
		m := mermaidEdge.FindStringSubmatch(line)
		if m == nil {
			if strings.TrimSpace(line) != "" {
				t.Errorf("a line of the diagram is no edge: %q", line)
			}
			continue
		}
		if m[1] == "[*]" || m[2] == "[*]" {
			continue // where tasks start, not a transition
		}
		from, to := Status(m[1]), Status(m[2])
		if !from.Valid() || !to.Valid() {
			t.Errorf("the diagram draws %s --> %s: not a state", from, to)
			continue
		}
		if !CanTransition(from, to) {
			t.Errorf("the diagram draws %s --> %s, which the transition table does not allow", from, to)
		}
		drawn[[2]Status{from, to}] = true
	}
	for _, from := range All() {
		for _, to := range Next(from) {
			if !drawn[[2]Status{from, to}] {
				t.Errorf("the diagram lacks %s --> %s", from, to)
			}
		}
	}
}
