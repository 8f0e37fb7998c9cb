package integration

import (
	"context"
	"flag"
	"fmt"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

var pipelineCount = flag.Int("pipelines", 60,
	"how many 20-step pipelines TestPipelinesSurviveKillNine runs (the full run: -pipelines 200)")

// TestPipelinesSurviveKillNine: three test workers with disjoint buckets
// run pipelines of 20 probe steps (chains, diamonds, fan-out 10 / fan-in)
// while holders are killed with SIGKILL and started again. Every pipeline
// must end with every step succeeded exactly once (from the probe's
// ledger), no step may have started before each of its dependencies had
// succeeded, and every trail must be complete.
func TestPipelinesSurviveKillNine(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	r := newRig(t)
	for _, s := range threeNodes {
		r.start(s)
	}
	for _, s := range threeNodes {
		r.waitUntilHeld(s.id, mustSet(t, s.buckets), startWithin)
	}
	ctx, cancel := context.WithTimeout(t.Context(), settleWithin)
	defer cancel()
	began := time.Now()
	var ids []int64
	for i := range *pipelineCount {
		p, err := r.fleet.client.SubmitPipeline(ctx, flotilla.PipelineRequest{
			Name: fmt.Sprintf("p%d", i), Steps: pipelineShape(i % 3),
		})
		if err != nil {
			t.Fatalf("submit pipeline %d: %v", i, err)
		}
		ids = append(ids, p.ID)
		r.mu.Lock()
		for _, s := range p.Steps {
			r.submitted = append(r.submitted, s.Task.ID)
		}
		r.mu.Unlock()
	}
	kills := 0
	for done := false; !done; {
		if kills < 2 {
			r.killAndRestart(threeNodes, failoverWithin)
			kills++
		}
		done = true
		for _, id := range ids {
			p, err := r.fleet.client.GetPipeline(ctx, id)
			if err != nil {
				t.Fatalf("pipeline %d: %v", id, err)
			}
			switch p.Status() {
			case store.PipelineRunning:
				done = false
			case store.PipelineFailed:
				t.Fatalf("pipeline %d failed: %+v", id, p.Steps)
			}
		}
		if !done {
			select {
			case <-ctx.Done():
				t.Fatalf("the pipelines did not all end within %v", settleWithin)
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
	fig := r.verify()
	// A step's every execution starts after each dependency's successful
	// execution ended (one machine, one wall clock).
	early := r.queryInts(ctx, `
SELECT c.task_id FROM flotilla_task_deps d
JOIN probe_ledger c ON c.task_id = d.task_id
JOIN probe_ledger p ON p.task_id = d.dep_id AND p.outcome = 'done'
WHERE c.started_at < p.ended_at`)
	if len(early) > 0 {
		t.Errorf("%d executions started before a dependency had succeeded, tasks %v", len(early), early[:min(10, len(early))])
	}
	t.Logf("figures: scenario=pipelines pipelines=%d steps=%d kills=%d settled_after=%v %s",
		len(ids), len(ids)*20, kills, time.Since(began).Round(time.Second), fig)
}

// pipelineShape is a 20-step pipeline of probe steps: a chain (0), a run
// of diamonds (1), or a fan-out of 10 into a fan-in followed by a chain (2).
func pipelineShape(shape int) []task.Step {
	probe := func(name string, deps ...string) task.Step {
		s := task.Step{Name: name, Kind: "probe", Payload: []byte(`{"duration":"10ms"}`), MaxAttempts: 10}
		for _, d := range deps {
			s.DependsOn = append(s.DependsOn, task.Dependency{Step: d})
		}
		return s
	}
	steps := []task.Step{probe("s0")}
	name := func(i int) string { return fmt.Sprintf("s%d", i) }
	switch shape {
	case 0:
		for i := 1; i < 20; i++ {
			steps = append(steps, probe(name(i), name(i-1)))
		}
	case 1:
		top := "s0"
		for i := 1; i+2 < 20; i += 3 {
			steps = append(steps, probe(name(i), top), probe(name(i+1), top), probe(name(i+2), name(i), name(i+1)))
			top = name(i + 2)
		}
		steps = append(steps, probe("s19", top))
	default:
		var leaves []string
		for i := 1; i <= 10; i++ {
			steps = append(steps, probe(name(i), "s0"))
			leaves = append(leaves, name(i))
		}
		steps = append(steps, probe("s11", leaves...))
		for i := 12; i < 20; i++ {
			steps = append(steps, probe(name(i), name(i-1)))
		}
	}
	return steps
}
