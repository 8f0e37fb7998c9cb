package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// TestPipelineTreeGrowsLinearlyWithAChain: each step of a chain is drawn
// under the one before it, and an indent that grew with every level made
// a 10,000-step chain print 150 MB. Past maxTreeDepth levels the indent
// stops growing and each line names the step it is drawn under.
func TestPipelineTreeGrowsLinearlyWithAChain(t *testing.T) {
	const n = 2000
	p := store.Pipeline{ID: 7, Name: "chain", Key: "k"}
	for i := range n {
		s := store.PipelineStep{Name: fmt.Sprintf("s%d", i), Task: &task.Task{ID: int64(i + 1), Status: task.Queued}, Tries: 1}
		if i > 0 {
			s.DependsOn = []task.Dependency{{Step: fmt.Sprintf("s%d", i-1)}}
		}
		p.Steps = append(p.Steps, s)
	}
	var out bytes.Buffer
	printPipeline(&out, p)

	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != n+1 {
		t.Fatalf("%d lines, want the header and one per step, %d", len(lines), n+1)
	}
	longest := 0
	for _, l := range lines {
		longest = max(longest, len(l))
	}
	// The longest line is an indent of maxTreeDepth levels, "after
	// s1998 ", and the step's own line.
	if bound := 3*3*maxTreeDepth + 120; longest > bound {
		t.Errorf("the longest line is %d bytes, want at most %d whatever the chain's length", longest, bound)
	}
	last := lines[n]
	if !strings.Contains(last, "after s1998 s1999  queued  task 2000") {
		t.Errorf("the last step is drawn as %q; want it to name the step it is under", last)
	}
	// Above the cap the tree is drawn as before: s1 under s0, indented.
	if lines[2] != "   └─ s1  queued  task 2  attempts 0" {
		t.Errorf("the second step is drawn as %q", lines[2])
	}
}
