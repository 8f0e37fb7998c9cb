package memory

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/flotilla-dev/flotilla/store"
)

// PruneFinished removes the tasks of one held bucket that have outlived
// their retention, oldest first, with everything that names them.
func (s *Store) PruneFinished(ctx context.Context, req store.PruneRequest) (store.PruneResult, error) {
	if err := store.CheckPrune(&req); err != nil {
		return store.PruneResult{}, err
	}
	db, err := s.begin(ctx)
	if err != nil {
		return store.PruneResult{}, err
	}
	defer db.mu.Unlock()
	if err := db.checkBucket(req.Bucket); err != nil {
		return store.PruneResult{}, err
	}
	now := db.now()
	if !req.DryRun && !db.leases[req.Bucket].liveFor(req.Owner, req.Epoch, now) {
		return store.PruneResult{}, fmt.Errorf("prune bucket %d: %s does not hold it under epoch %d: %w",
			req.Bucket, req.Owner, req.Epoch, store.ErrFenced)
	}

	var victims []*taskRecord
	for _, rec := range db.tasks {
		if rec != nil && rec.Bucket == req.Bucket && db.prunable(rec, req.Retention, now) &&
			(req.DryRun || db.locked[rec.ID] == 0) {
			victims = append(victims, rec)
		}
	}
	slices.SortFunc(victims, func(a, b *taskRecord) int {
		return cmp.Or(a.FinishedAt.Compare(b.FinishedAt), cmp.Compare(a.ID, b.ID))
	})
	var out store.PruneResult
	if req.DryRun {
		for _, rec := range victims {
			out.Add(rec.Status, rec.FinishedAt)
		}
		return out, nil
	}
	victims = victims[:min(len(victims), req.Limit)]
	for _, rec := range victims {
		out.Add(rec.Status, rec.FinishedAt)
		out.Events += len(rec.events) - 1 // the creation event is part of the task
		out.Commands += db.removeTask(rec)
	}
	return out, nil
}

// prunable reports whether rec may go now: Retention.Prunable, and, for a
// pipeline's task, every other remaining task of the pipeline too.
func (db *database) prunable(rec *taskRecord, r store.Retention, now time.Time) bool {
	if !db.prunableAlone(rec, r, now) {
		return false
	}
	if rec.Pipeline == 0 {
		return true
	}
	for _, st := range db.pipelines[rec.Pipeline-1].steps {
		for _, id := range st.tasks {
			if other := db.task(id); other != nil && !db.prunableAlone(other, r, now) {
				return false
			}
		}
	}
	return true
}

func (db *database) prunableAlone(rec *taskRecord, r store.Retention, now time.Time) bool {
	unacked := false
	for _, cmd := range db.commandsByTask[rec.ID] {
		unacked = unacked || !cmd.Acked()
	}
	return r.Prunable(&rec.Task, unacked, now)
}

// removeTask deletes a finished task and what names it. Its pipeline is
// gone to reads from then on (removing), and its record goes with its last
// task. It returns the commands removed.
func (db *database) removeTask(rec *taskRecord) int {
	db.tasks[rec.ID-1] = nil
	if rec.Schedule != "" {
		k := fireKey{rec.Schedule, rec.ScheduledFor}
		if db.fired[k] == rec.ID {
			delete(db.fired, k)
		}
	}
	cmds := db.commandsByTask[rec.ID]
	for _, cmd := range cmds {
		db.commands[cmd.ID-1] = nil
	}
	delete(db.commandsByTask, rec.ID)
	delete(db.dependents, rec.ID)
	db.console.forget(rec.ID)
	if rec.Pipeline != 0 {
		db.pipelines[rec.Pipeline-1].removing = true
		left := false
		for _, st := range db.pipelines[rec.Pipeline-1].steps {
			for _, id := range st.tasks {
				left = left || db.task(id) != nil
			}
		}
		if !left {
			db.pipelines[rec.Pipeline-1] = nil
		}
	}
	return len(cmds)
}
