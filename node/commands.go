package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/internal/clock"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// The command loop applies the commands issued for the tasks this node runs
// (DESIGN §7). It reads them from the store, which decides what is this
// node's: the unacknowledged commands of the active tasks whose lease this
// incarnation holds. It runs from Start, is woken by TopicCommands
// notifications, and polls every CommandPoll so that a missed notification
// delays a command by one poll at most.
//
// A stop's notification names the attempt it is for (store.CommandNote): its
// holder cancels the handler's context with ErrStopRequested on the note,
// before it reads the command. Reading the command then moves the task to
// stopping (fenced), cancels the handler if the note did not (a missed
// note, or a stop found by the poll), and leaves the rest to the completion
// path: the
// handler returns, its outcome is written as stopped, and the store
// acknowledges the command in the same statement. A handler still running
// StopGrace later is abandoned: the task is written stopped and dropped from
// the running set, and anything the handler writes later is fenced.
//
// A pause moves the task to pausing and makes the handler's Checkpoint
// answer task.ErrPaused; it is acknowledged at once (OutcomePausing), since
// its end depends on the handler (paused at a checkpoint, or finished
// anyway).

// commander is the command loop: it reads the pending commands of the
// tasks this incarnation holds, and applies each to the attempt this node
// means to finish. Its dependencies are the store, the attempt registry,
// and the completer for a stop whose handler does not return in time.
type commander struct {
	store       store.Store
	owner       string // the incarnation
	node        string // the node id, recorded in events and acknowledgements
	attempts    *attempts
	completer   *completer
	clock       clock.Clock
	stopGrace   time.Duration
	poll        time.Duration
	stmtTimeout time.Duration
	metrics     Metrics
	log         *zap.Logger
	loop        *loop
}

// noted handles a TopicCommands notification. A note for another
// incarnation's task is ignored. A stop for the attempt this incarnation
// runs cancels its handler at once, before the command is read: the stop is
// already recorded on the task's row (the note is sent when the issuing
// transaction commits), so whatever the handler returns now, the store
// writes stopped (task.Destination), unless it succeeded. The loop is poked
// in every other case too, and reads, applies and acknowledges the command
// as it does on its poll; a note is never more than a head start.
//
// A note for a task that nobody ran when it was issued (no owner) may be
// ours since, and so may one that cannot be read (an issuer of an older
// version); both poke the loop without cancelling anything.
func (c *commander) noted(payload string) {
	note, err := store.ParseCommandNote(payload)
	if err == nil && note.Owner != "" && note.Owner != c.owner {
		return
	}
	if err == nil && note.Kind == store.CommandStop && note.Owner == c.owner {
		c.cancelNoted(note)
	}
	c.loop.poke()
}

// cancelNoted cancels the handler of the attempt a stop note names, if it
// is the attempt this node means to finish and its handler is running. A
// note naming another attempt of the task (an earlier claim, abandoned or
// finished, or a later one) cancels nothing: claim_seq fences the note as it
// fences every write.
func (c *commander) cancelNoted(note store.CommandNote) {
	a := c.attempts.current(note.TaskID)
	if a == nil || a.ref != (task.Ref{ID: note.TaskID, ClaimSeq: note.ClaimSeq}) {
		return
	}
	a.mu.Lock()
	skip := a.done || a.abandoned != nil || a.stopNoted
	a.stopNoted = true
	if !skip {
		a.notedStop = suffix(store.Command{IssuedBy: note.IssuedBy, Reason: note.Reason})
	}
	a.mu.Unlock()
	if skip {
		return
	}
	c.log.Info("stop noted: cancelling the handler; the command is read next",
		append(a.fields(), zap.Int64("command", note.ID))...)
	// The handler's outcome may acknowledge the command before this node
	// reads it, so the delivery is timed here, from the note's issue time.
	c.metrics.CommandApplied(note.Kind, c.clock.Now().Sub(note.IssuedAt))
	a.cancel(ErrStopRequested)
}

// run polls every CommandPoll, and at once, until the loop stops.
func (c *commander) run(ctx context.Context) {
	every(ctx, c.clock, c.poll, c.loop.wake, true, c.pass)
}

// pass applies every pending command of this node's tasks.
func (c *commander) pass(ctx context.Context) {
	qctx, cancel := context.WithTimeout(ctx, c.stmtTimeout)
	cmds, err := c.store.PendingCommands(qctx, c.owner)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			c.log.Warn("reading pending commands failed; will retry", zap.Error(err))
		}
		return
	}
	for _, cmd := range cmds {
		c.applyCommand(ctx, cmd)
	}
}

func commandFields(a *attempt, cmd store.Command) []zap.Field {
	return append(a.fields(), zap.Int64("command", cmd.ID), zap.String("command_kind", cmd.Kind),
		zap.String("issued_by", cmd.IssuedBy), zap.String("reason", cmd.Reason))
}

func (c *commander) applyCommand(ctx context.Context, cmd store.Command) {
	a := c.attempts.current(cmd.TaskID)
	if a == nil {
		// The store says this incarnation holds the task, but no attempt of
		// it is running here: its outcome was written meanwhile, or it was
		// claimed by a pass whose answer never arrived. The command stays
		// pending; whoever moves the task next (the completion, or a
		// rescue once its lease lapses) answers it.
		c.log.Debug("command for a task not running here; left pending",
			zap.Int64("task", cmd.TaskID), zap.Int64("command", cmd.ID), zap.String("command_kind", cmd.Kind))
		return
	}
	switch cmd.Kind {
	case store.CommandStop:
		c.applyStop(ctx, a, cmd)
	case store.CommandPause:
		c.applyPause(ctx, a, cmd)
	default:
		// Resume is applied by its issuer (a paused task runs nowhere); a
		// resume row is a mistake of some other writer.
		c.ack(ctx, a, cmd, fmt.Sprintf("not applicable: %s is not a command for a running task", cmd.Kind))
	}
}

// applyStop stops an attempt: stopping, then its handler cancelled (unless
// the stop's note cancelled it already, see noted), and a grace period
// after which a handler that has not returned is abandoned. When the note
// came first and the handler returned at once, its outcome may be written
// before this move: the trail then reads running -> stopped, and this move
// is fenced.
func (c *commander) applyStop(ctx context.Context, a *attempt, cmd store.Command) {
	a.mu.Lock()
	skip := a.done || a.abandoned != nil || a.stopCommand != 0
	if !skip {
		a.stopCommand = cmd.ID
	}
	a.mu.Unlock()
	if skip {
		// Already being stopped, or settling: the completion's write
		// honours and acknowledges the stop.
		return
	}
	o, err := c.advanceOne(ctx, store.ActiveTransition{
		Ref: a.ref, To: task.Stopping, Node: c.node, Reason: stopReason(cmd),
	})
	var te *task.TransitionError
	switch {
	case err != nil:
		c.log.Warn("applying a stop failed; will retry at the next poll", append(commandFields(a, cmd), zap.Error(err))...)
		a.mu.Lock()
		a.stopCommand = 0
		a.mu.Unlock()
		return
	case errors.Is(o.Err, store.ErrFenced) && errors.Is(context.Cause(a.ctx), ErrStopRequested):
		// The stop's note cancelled the handler, and its outcome (stopped,
		// acknowledging this command) was written first.
		c.log.Debug("stop already honoured by the handler's outcome", commandFields(a, cmd)...)
		return
	case errors.Is(o.Err, store.ErrFenced):
		c.log.Warn("stop not applied: fenced, the attempt was superseded", commandFields(a, cmd)...)
		return
	case errors.As(o.Err, &te) && te.From == task.Stopping:
		// Stopping already: a second stop adds nothing but the cancel.
	case o.Err != nil:
		c.log.Error("stop refused by the store", append(commandFields(a, cmd), zap.Error(o.Err))...)
		return
	}
	c.log.Info("stopping task: cancelling its handler", append(commandFields(a, cmd), zap.String("status", string(o.Status)))...)
	a.mu.Lock()
	noted := a.stopNoted
	a.stopNoted = true
	a.mu.Unlock()
	if !noted {
		c.metrics.CommandApplied(cmd.Kind, c.clock.Now().Sub(cmd.IssuedAt))
	}
	a.cancel(ErrStopRequested)
	a.mu.Lock()
	if !a.done {
		a.stopGrace = c.clock.AfterFunc(c.stopGrace, func() { c.abandonStopped(a, cmd) })
	}
	a.mu.Unlock()
}

// abandonStopped gives up a stopped handler that has not returned within
// StopGrace: the task is written stopped now, and the handler is left to
// end on its own; its writes from here on are fenced.
func (c *commander) abandonStopped(a *attempt, cmd store.Command) {
	if !a.abandon(fmt.Errorf("handler ignored its stop for %v", c.stopGrace)) {
		return
	}
	c.log.Warn("stopped handler did not return in time: task recorded stopped, handler abandoned; "+
		"its later writes will be fenced", append(commandFields(a, cmd), zap.Duration("grace", c.stopGrace))...)
	c.completer.add(a, store.ActiveTransition{
		Ref: a.ref, To: task.Stopped, Node: c.node,
		Reason: fmt.Sprintf("stopped; handler abandoned after %v", c.stopGrace),
	})
}

// applyPause asks the handler to pause at its next checkpoint.
func (c *commander) applyPause(ctx context.Context, a *attempt, cmd store.Command) {
	if done, abandoned := a.state(); done || abandoned != nil {
		return // its outcome is on its way; the command stays pending until then
	}
	o, err := c.advanceOne(ctx, store.ActiveTransition{
		Ref: a.ref, To: task.Pausing, Node: c.node, Reason: "pause requested" + suffix(cmd),
	})
	var te *task.TransitionError
	switch {
	case err != nil:
		c.log.Warn("applying a pause failed; will retry at the next poll", append(commandFields(a, cmd), zap.Error(err))...)
		return
	case errors.Is(o.Err, store.ErrFenced):
		c.log.Warn("pause not applied: fenced, the attempt was superseded", commandFields(a, cmd)...)
		return
	case errors.As(o.Err, &te):
		// Pausing already, or stopping: a stop wins over a pause.
		c.ack(ctx, a, cmd, fmt.Sprintf("not applied: the task is %s", te.From))
		return
	case o.Err != nil:
		c.log.Error("pause refused by the store", append(commandFields(a, cmd), zap.Error(o.Err))...)
		return
	}
	a.pauseRequested.Store(true)
	c.metrics.CommandApplied(cmd.Kind, c.clock.Now().Sub(cmd.IssuedAt))
	c.log.Info("pausing task at its next checkpoint", commandFields(a, cmd)...)
	c.ack(ctx, a, cmd, store.OutcomePausing)
}

// advanceOne writes one fenced transition now, outside the completer: a
// command's move must be recorded before the handler is told.
func (c *commander) advanceOne(ctx context.Context, tr store.ActiveTransition) (store.Outcome, error) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.stmtTimeout)
	defer cancel()
	out, err := c.store.AdvanceActive(wctx, c.owner, []store.ActiveTransition{tr})
	if err != nil {
		return store.Outcome{}, err
	}
	if len(out) != 1 {
		return store.Outcome{}, fmt.Errorf("the store answered %d outcomes for one transition", len(out))
	}
	return out[0], nil
}

// ack acknowledges a command; one acknowledged already keeps its answer.
func (c *commander) ack(ctx context.Context, a *attempt, cmd store.Command, outcome string) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.stmtTimeout)
	defer cancel()
	if _, err := c.store.AckCommand(actx, cmd.ID, c.node, outcome); err != nil && !errors.Is(err, store.ErrConflict) {
		c.log.Warn("acknowledging a command failed; it stays pending", append(commandFields(a, cmd), zap.Error(err))...)
	}
}

func stopReason(cmd store.Command) string { return "stop requested" + suffix(cmd) }

// suffix names who asked and why, for the audit trail.
func suffix(cmd store.Command) string {
	s := ""
	if cmd.IssuedBy != "" {
		s += " by " + cmd.IssuedBy
	}
	if cmd.Reason != "" {
		s += ": " + cmd.Reason
	}
	return s
}
