package reconcile

import (
	"context"
	"fmt"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// predict is where the store would send t when asked for to: stopped when
// t is stopping or its owner has a stop pending for it (the stop-wins rule
// of store.Transition), to otherwise.
func (r *rescuer) predict(ctx context.Context, t *task.Task, to task.Status) (task.Status, error) {
	if t.Status == task.Stopping {
		return task.Stopped, nil
	}
	if r.stops == nil {
		r.stops = map[string]map[int64]bool{}
	}
	pending, ok := r.stops[t.Owner]
	if !ok {
		cctx, cancel := r.call(ctx)
		cmds, err := r.s.PendingCommands(cctx, t.Owner)
		cancel()
		if err != nil {
			return "", fmt.Errorf("reconcile: reading pending commands of %s: %w", t.Owner, err)
		}
		pending = map[int64]bool{}
		for _, c := range cmds {
			if c.Kind == store.CommandStop {
				pending[c.TaskID] = true
			}
		}
		r.stops[t.Owner] = pending
	}
	if pending[t.ID] {
		return task.Stopped, nil
	}
	return to, nil
}
