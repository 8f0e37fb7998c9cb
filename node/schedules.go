package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/schedule"
	"github.com/flotilla-dev/flotilla/store"
)

const (
	// scheduleBatch is the most due schedules read and fired in one round:
	// one read and one transaction, however many fire.
	scheduleBatch = 500
	// minScheduleBatch is the floor of the adaptive round size.
	minScheduleBatch = 16
	// maxScheduleRounds bounds one pass, so that a schedule that keeps
	// failing cannot keep the loop from sleeping.
	maxScheduleRounds = 20
	// scheduleIdle is the longest the schedule loop sleeps (see
	// scheduleWait): about 1 look per node every 2.5 s with the default
	// misfire, where a fixed poll looked 4 times a second.
	scheduleIdle = 5 * time.Second
)

// scheduler is the state of the schedule loop (DESIGN §7a): it fires the
// due schedules of the buckets this node holds. Only the loop's goroutine
// uses it.
type scheduler struct {
	// batch is the size of the next round: scheduleBatch, halved after a
	// round that ran out of time (a loaded database), grown back after one
	// that did not.
	batch int
	specs map[string]schedule.Spec // by spec and time zone
	// refused records the schedules whose stored spec does not parse, so
	// each is logged once rather than at every pass.
	refused map[string]bool
}

func newScheduler() *scheduler {
	return &scheduler{batch: scheduleBatch, specs: map[string]schedule.Spec{}, refused: map[string]bool{}}
}

// spec parses a stored schedule's expression, once per expression.
func (s *scheduler) spec(sc store.Schedule) (schedule.Spec, error) {
	key := sc.Spec + "\x00" + sc.Timezone
	if spec, ok := s.specs[key]; ok {
		return spec, nil
	}
	spec, err := schedule.Parse(sc.Spec, sc.Timezone)
	if err != nil {
		return schedule.Spec{}, err
	}
	s.specs[key] = spec
	return spec, nil
}

// declareSchedules creates the schedules the application declared, or
// updates their definitions. An existing schedule keeps its enabled state,
// since an operator's pause must outlive a restart, and its next tick while
// its timing is unchanged, since every node of a fleet declares the same
// schedules at every start. Both are the store's to keep, in the one write
// of store.UpsertReplace: a state read here first could be stale by the
// time it was written back, and undo a pause committed in between.
func (n *Node) declareSchedules(ctx context.Context, meta store.Meta) error {
	if len(n.cfg.Schedules) == 0 {
		return nil
	}
	policy, err := bucket.NewPolicy(meta.NumBuckets)
	if err != nil {
		return err
	}
	now, err := n.store.Now(ctx)
	if err != nil {
		return fmt.Errorf("reading the database clock: %w", err)
	}
	for _, d := range n.cfg.Schedules {
		sc, err := d.Resolve(policy, now)
		if err != nil {
			return err
		}
		saved, err := n.store.UpsertSchedule(ctx, sc, store.UpsertReplace)
		if err != nil {
			return fmt.Errorf("declaring schedule %q: %w", sc.Name, err)
		}
		n.log.Info("schedule declared", zap.String("schedule", saved.Name), zap.String("spec", saved.Spec),
			zap.String("kind", saved.Kind), zap.Int("bucket", saved.Bucket), zap.Bool("enabled", saved.Enabled),
			zap.Time("next_fire_at", saved.NextFireAt))
	}
	return nil
}

// schedulePass fires every due schedule of the held buckets, in rounds of
// at most scheduleBatch, until none is due or a round moves nothing.
func (n *Node) schedulePass(ctx context.Context) {
	defer n.schedulePasses.Add(1)
	for range maxScheduleRounds {
		held := n.keeper.Held()
		if len(held) == 0 {
			return
		}
		advanced, more := n.scheduleRound(ctx, held)
		if !more || advanced == 0 {
			return
		}
	}
}

// scheduleWait is how long the schedule loop sleeps after a pass: until
// the earliest next tick of the held buckets' schedules, so that a tick
// fires when it is due and a node whose buckets have no schedule due soon
// sends nothing; SchedulePoll when a schedule is due still (one the pass
// could not fire, or a failed read); and never longer than half
// ScheduleMisfire, nor than scheduleIdle. A schedule created, changed or
// resumed wakes the loop through its notification (TopicSchedules); the
// bound keeps a missed notification from making its tick late enough to
// count as missed. Without a notification subscription the loop looks at
// every SchedulePoll, as it would with nothing to wake it.
func (n *Node) scheduleWait(ctx context.Context) time.Duration {
	idle := max(n.cfg.SchedulePoll, min(n.cfg.ScheduleMisfire/2, scheduleIdle))
	if !n.listening.Load() {
		// No notification would wake it (a store without them, or a
		// subscription being set up again): look at every SchedulePoll.
		idle = n.cfg.SchedulePoll
	}
	held := n.keeper.Held()
	if len(held) == 0 {
		return idle // the loop is poked when a bucket is acquired
	}
	buckets := make([]int, len(held))
	for i, h := range held {
		buckets[i] = h.Bucket
	}
	callCtx, cancel := context.WithTimeout(ctx, n.stmtTimeout)
	next, now, err := n.store.NextScheduleFire(callCtx, bucket.Of(buckets...))
	cancel()
	switch {
	case err != nil:
		if ctx.Err() == nil {
			n.log.Warn("reading the next schedule tick failed", zap.Error(err))
		}
		return n.cfg.SchedulePoll
	case next.IsZero():
		return idle
	case !next.After(now):
		return n.cfg.SchedulePoll
	}
	return min(next.Sub(now), idle)
}

// scheduleRound reads up to scheduleBatch due schedules, decides each, and
// applies the decisions in one store call. It reports how many schedules
// advanced, and whether more may be due.
func (n *Node) scheduleRound(ctx context.Context, held []store.HeldBucket) (advanced int, more bool) {
	buckets := make([]int, len(held))
	for i, h := range held {
		buckets[i] = h.Bucket
	}
	// Each call gets its own timeout: a round's calls are not one statement.
	call := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, n.stmtTimeout) }
	batch := n.scheduler.batch
	callCtx, cancel := call()
	due, err := n.store.DueSchedules(callCtx, bucket.Of(buckets...), batch)
	cancel()
	if err != nil {
		n.log.Warn("reading due schedules failed", zap.Error(err))
		return 0, false
	}
	if len(due) == 0 {
		return 0, false
	}
	// Ticks are judged by the database's clock, the one that made them due,
	// so that no node's clock decides what is late.
	callCtx, cancel = call()
	now, err := n.store.Now(callCtx)
	cancel()
	if err != nil {
		n.log.Warn("reading the database clock failed", zap.Error(err))
		return 0, false
	}
	more = len(due) == batch
	reqs := make([]store.FireRequest, 0, len(due))
	decisions := make([]schedule.Decision, 0, len(due))
	policies := make([]string, 0, len(due))
	for _, sc := range due {
		epoch, ok := n.keeper.Holds(sc.Bucket)
		if !ok {
			continue // lost, or past its local deadline: fire nothing
		}
		spec, err := n.scheduler.spec(sc)
		if err != nil {
			if !n.scheduler.refused[sc.Name+"\x00"+sc.Spec] {
				n.scheduler.refused[sc.Name+"\x00"+sc.Spec] = true
				n.log.Error("schedule not fired: its stored spec does not parse; replace it",
					zap.String("schedule", sc.Name), zap.Int("bucket", sc.Bucket), zap.Error(err))
			}
			continue
		}
		d := schedule.Decide(spec, sc.NextFireAt, now, sc.CatchUp, n.cfg.ScheduleMisfire)
		if !d.Fire && d.Next.Equal(sc.NextFireAt) {
			continue
		}
		if !d.Next.After(now) {
			more = true // one tick per request; the next round fires the one after
		}
		reqs = append(reqs, store.FireRequest{
			Name: sc.Name, Epoch: epoch, From: sc.NextFireAt, Fire: d.Fire, ScheduledFor: d.ScheduledFor, Next: d.Next,
			Task: store.NewTask{Kind: sc.Kind, Key: sc.Key, Bucket: sc.Bucket, Payload: sc.Payload,
				Priority: sc.Priority, MaxAttempts: sc.MaxAttempts, Timeout: sc.Timeout},
		})
		decisions = append(decisions, d)
		policies = append(policies, sc.CatchUp)
	}
	if len(reqs) == 0 {
		return 0, false
	}
	callCtx, cancel = call()
	results, err := n.store.FireSchedules(callCtx, n.incarnation, reqs)
	cancel()
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			n.scheduler.batch = max(batch/2, minScheduleBatch)
		}
		n.log.Warn("firing schedules failed", zap.Int("schedules", len(reqs)),
			zap.Int("next_batch", n.scheduler.batch), zap.Error(err))
		return 0, false
	}
	n.scheduler.batch = min(batch*2, scheduleBatch)
	for i, res := range results {
		if res.Err == nil {
			n.metrics.ScheduleAdvanced(res.Fired, firingLag(now, reqs[i], res), decisions[i].Skipped)
			advanced++
		}
		n.logFiring(reqs[i], decisions[i], policies[i], res)
	}
	return advanced, more
}

// logFiring says what became of one schedule's decision.
func (n *Node) logFiring(req store.FireRequest, d schedule.Decision, policy string, res store.FireResult) {
	log := n.log.With(zap.String("schedule", req.Name), zap.Int("bucket", req.Task.Bucket), zap.Int64("epoch", req.Epoch))
	switch {
	case errors.Is(res.Err, store.ErrFenced):
		log.Warn("schedule not fired: this node no longer holds its bucket", zap.Error(res.Err))
		return
	case res.Err != nil:
		// Paused, deleted, or advanced by an earlier holder since it was read.
		log.Debug("schedule not fired: it changed since it was read", zap.Error(res.Err))
		return
	}
	if d.Skipped > 0 {
		log.Warn("schedule ticks missed while its bucket was not served",
			zap.Int("skipped", d.Skipped), zap.Time("from", req.From), zap.Time("next_fire_at", req.Next),
			zap.String("catch_up", policy), zap.Bool("caught_up", req.Fire))
	}
	switch {
	case res.Fired:
		log.Info("schedule fired", zap.Int64("task", res.Task.ID), zap.Time("scheduled_for", req.ScheduledFor),
			zap.Time("next_fire_at", req.Next))
	case req.Fire:
		log.Info("schedule tick already fired, or its unique key busy: not fired again",
			zap.Time("scheduled_for", req.ScheduledFor), zap.Time("next_fire_at", req.Next))
	}
}
