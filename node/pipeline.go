package node

import (
	"context"
	"encoding/json"
	"maps"
	"slices"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// DependencyResults reads the results of the attempt's dependencies from the
// store at the handler's first call, and answers later calls from what it
// read: a dependency's result never changes once it has ended, and the step
// runs only after its dependencies have. Loading them on demand keeps the
// claim, which every task pays for, free of a read only some steps need.
func (h *attemptHooks) DependencyResults(ctx context.Context) (map[string]json.RawMessage, error) {
	a := h.a
	a.mu.Lock()
	cached := a.depResults
	a.mu.Unlock()
	if cached == nil {
		got, err := h.n.store.DependencyResults(ctx, a.ref.ID, store.MaxDependencyResultsBytes)
		if err != nil {
			return nil, err
		}
		a.mu.Lock()
		if a.depResults == nil {
			a.depResults = got
		}
		cached = a.depResults
		a.mu.Unlock()
	}
	return maps.Clone(cached), nil
}

// Append keeps steps to write with the attempt's outcome. It refuses at
// once what no store would take from this step (store.CheckAppend, without
// the names of the pipeline's other steps, which the store checks when it
// writes them).
func (h *attemptHooks) Append(steps []task.Step) error {
	a := h.a
	a.mu.Lock()
	defer a.mu.Unlock()
	all := append(slices.Clone(a.appended), steps...)
	if _, err := store.CheckAppend(a.view.Step, all, func(name string) bool { return name == a.view.Step }); err != nil {
		return err
	}
	a.appended = all
	return nil
}

// takeAppended hands over the steps the handler appended.
func (a *attempt) takeAppended() []task.Step {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := a.appended
	a.appended = nil
	return out
}
