package flotilla

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/flotilla-dev/flotilla/commands"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/postgres"
	"github.com/flotilla-dev/flotilla/task"
)

// PipelineRequest describes a pipeline to submit: steps with dependencies,
// all placed in the bucket of Key.
type PipelineRequest struct {
	Name string
	// Key routes every step of the pipeline to one bucket, whose holder
	// releases each step in the transaction that ends its last
	// dependency. "" means Name + "-" + the pipeline's id.
	Key   string
	Steps []task.Step
}

// SubmitPipeline creates a pipeline and all its steps atomically, after
// checking, for a pipeline with a key, that a live node holds the key's
// bucket and runs every step's kind (unless told otherwise by opts). A
// pipeline without a key gets its key, and so its bucket, from its id,
// which exists only once it is created: it is not checked. Invalid steps
// (no step, a name twice, a dependency on an unknown step, a cycle) are
// refused with store.ErrInvalid, naming the problem, and nothing is
// written.
func (c *Client) SubmitPipeline(ctx context.Context, r PipelineRequest, opts ...SubmitOption) (store.Pipeline, error) {
	var o submitOptions
	for _, opt := range opts {
		opt(&o)
	}
	if _, err := store.CheckSteps(r.Steps, nil, nil); err != nil {
		return store.Pipeline{}, fmt.Errorf("pipeline %q: %w", r.Name, err)
	}
	if r.Key != "" {
		b := c.policy.Of(r.Key)
		nts := make([]store.NewTask, len(r.Steps))
		for i, s := range r.Steps {
			nts[i] = store.NewTask{Kind: s.Kind, Key: r.Key, Bucket: b}
		}
		if err := c.checkServed(ctx, nts, o); err != nil {
			return store.Pipeline{}, err
		}
	}
	return c.store.CreatePipeline(ctx, store.NewPipeline{Name: r.Name, Key: r.Key, Steps: r.Steps})
}

// SubmitPipelineTx creates a pipeline inside the caller's transaction: it
// exists, and nodes hear of it, only if tx commits. It needs a PostgreSQL
// store, and does not check that the steps will be served.
func (c *Client) SubmitPipelineTx(ctx context.Context, tx pgx.Tx, r PipelineRequest) (store.Pipeline, error) {
	pg, ok := c.store.(*postgres.Store)
	if !ok {
		return store.Pipeline{}, fmt.Errorf("SubmitPipelineTx needs the PostgreSQL store, not %T", c.store)
	}
	return pg.CreatePipelineTx(ctx, tx, store.NewPipeline{Name: r.Name, Key: r.Key, Steps: r.Steps})
}

// GetPipeline reads a pipeline with the current task of each step.
func (c *Client) GetPipeline(ctx context.Context, id int64) (store.Pipeline, error) {
	return c.store.GetPipeline(ctx, id)
}

// RetryPipeline runs again the step from and each of its descendants that
// did not succeed, as new tasks; nothing else runs again.
func (c *Client) RetryPipeline(ctx context.Context, id int64, from string) (store.Pipeline, error) {
	return c.store.RetryPipeline(ctx, id, from)
}

// StopPipeline stops every unfinished step of a pipeline through the
// existing paths: a step that waits (pending, queued, retrying, paused) is
// cancelled, and its dependents are skipped; a running one gets a stop
// command. It answers one result per step it acted on; a step that ended
// meanwhile is left as it ended.
func (c *Client) StopPipeline(ctx context.Context, id int64, reason, issuedBy string) ([]commands.Result, error) {
	p, err := c.store.GetPipeline(ctx, id)
	if err != nil {
		return nil, err
	}
	var out []commands.Result
	for _, s := range p.Steps {
		if s.Task.Status.Terminal() {
			continue
		}
		r, err := c.Stop(ctx, s.Task.ID, reason, issuedBy)
		if err != nil {
			if errIsFinished(ctx, c, s.Task.ID) {
				continue // ended on its own, or skipped by an earlier stop
			}
			return out, fmt.Errorf("stop step %s (task %d) of pipeline %d: %w", s.Name, s.Task.ID, id, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// errIsFinished reports whether task id has ended, so that a stop refused
// for it came too late rather than failed.
func errIsFinished(ctx context.Context, c *Client, id int64) bool {
	t, err := c.store.GetTask(ctx, id)
	return err == nil && t.Status.Terminal()
}
