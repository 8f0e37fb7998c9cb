package metrics

import (
	"context"
	"errors"
	"time"

	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/task"
)

// Middleware measures every handler the node runs: how many run now, by
// kind (flotilla_handlers_running), and how long each ran and what it
// returned (flotilla_handler_duration_seconds, result ok, error, paused or
// panic). Add it to node.Config.Middleware; on a nil *Metrics it measures
// nothing.
//
// It sees the handler's own return, in the process that ran it, where
// flotilla_task_run_seconds counts the outcomes written to the store: an
// attempt given up because its bucket was lost is counted here only.
func (m *Metrics) Middleware() node.Middleware {
	return func(next node.Handler) node.Handler {
		if m == nil {
			return next
		}
		return func(ctx context.Context, t *task.Task) (err error) {
			running := m.handlers.WithLabelValues(t.Kind)
			running.Inc()
			start := time.Now()
			result := "panic" // unless next returns
			defer func() {
				running.Dec()
				m.handlerDur.WithLabelValues(t.Kind, result).Observe(time.Since(start).Seconds())
			}()
			err = next(ctx, t)
			switch {
			case err == nil:
				result = "ok"
			case errors.Is(err, task.ErrPaused):
				result = "paused"
			default:
				result = "error"
			}
			return err
		}
	}
}
