package integration

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/store"
)

// documentedPipeline is the worked example of docs/pipelines.md.
var documentedPipeline = filepath.Join("..", "..", "docs", "examples", "pipeline.json")

// TestTheDocumentedPipelineEndsAsDocsSay submits docs/examples/pipeline.json
// with `worker pipeline submit`, as written, to a worker running the stock
// kinds, and checks that each step ends as docs/pipelines.md says: extract
// succeeds; transform fails its first attempt and succeeds on its second;
// load succeeds; rollback, which runs only on load's failure, is skipped;
// notify, which runs whatever load ends as, succeeds.
func TestTheDocumentedPipelineEndsAsDocsSay(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	f := newSQLiteFleet(t)
	all := mustSet(t, "0-63")
	f.worker("run", "--buckets", "0-63", "--node-id", "docs")
	f.waitUntilHeld("docs", all, startWithin)

	stdout, stderr, code := f.cli("pipeline", "submit", documentedPipeline)
	if code != 0 {
		t.Fatalf("worker pipeline submit %s exited %d: %s", documentedPipeline, code, stderr)
	}
	id := parseID(t, stdout)

	var p store.Pipeline
	ended := poll(taskWithin, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), queryTimeout)
		defer cancel()
		var err error
		if p, err = f.client.GetPipeline(ctx, id); err != nil {
			return false
		}
		for _, s := range p.Steps {
			if !s.Task.Status.Terminal() {
				return false
			}
		}
		return true
	})
	var got []string
	for _, s := range p.Steps {
		got = append(got, s.Name+"="+string(s.Task.Status)+"@"+strconv.Itoa(s.Task.Attempt))
	}
	want := "extract=succeeded@1 transform=succeeded@2 load=succeeded@1 rollback=skipped@0 notify=succeeded@1"
	if !ended || strings.Join(got, " ") != want {
		t.Errorf("pipeline %d ended %q (all ended: %t), want %q, as docs/pipelines.md says", id,
			strings.Join(got, " "), ended, want)
	}
	for _, s := range p.Steps {
		if s.Name == "notify" && s.Task.Priority != 5 {
			t.Errorf("notify has priority %d, want the file's 5", s.Task.Priority)
		}
		if s.Name == "load" && s.Task.Timeout != 30*time.Second {
			t.Errorf("load has timeout %v, want the file's 30s", s.Task.Timeout)
		}
		if s.Name == "transform" && s.Task.MaxAttempts != 3 {
			t.Errorf("transform has max attempts %d, want the file's 3", s.Task.MaxAttempts)
		}
	}
}
