package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"go.uber.org/zap"

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
// A stop moves the task to stopping (fenced), cancels the handler's context
// with ErrStopRequested, and leaves the rest to the completion path: the
// handler returns, its outcome is written as stopped, and the store
// acknowledges the command in the same statement. A handler still running
// StopGrace later is abandoned: the task is written stopped and dropped from
// the running set, and anything the handler writes later is fenced.
//
// A pause moves the task to pausing and makes the handler's Checkpoint
// answer task.ErrPaused; it is acknowledged at once (OutcomePausing), since
// its end depends on the handler (paused at a checkpoint, or finished
// anyway).

// commandConcerns reports whether a TopicCommands payload, "<command id>
// <owner>", may be for this node: its owner is this incarnation, or the task
// was not active when the command was issued (a claim may have made it
// ours since). An unreadable payload is assumed to concern us.
func (n *Node) commandConcerns(payload string) bool {
	_, owner, ok := strings.Cut(payload, " ")
	return !ok || owner == "" || owner == n.incarnation
}

// commandPass applies every pending command of this node's tasks.
func (n *Node) commandPass(ctx context.Context) {
	qctx, cancel := context.WithTimeout(ctx, n.stmtTimeout)
	cmds, err := n.store.PendingCommands(qctx, n.incarnation)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			n.log.Warn("reading pending commands failed; will retry", zap.Error(err))
		}
		return
	}
	for _, cmd := range cmds {
		n.applyCommand(ctx, cmd)
	}
}

// attemptOf returns the attempt of task id this node means to finish: not
// given up, the latest claim among them. An abandoned attempt whose handler
// has yet to return is never the one a command applies to.
func (n *Node) attemptOf(id int64) *attempt {
	return n.attempts.current(id)
}

func commandFields(a *attempt, cmd store.Command) []zap.Field {
	return append(a.fields(), zap.Int64("command", cmd.ID), zap.String("command_kind", cmd.Kind),
		zap.String("issued_by", cmd.IssuedBy), zap.String("reason", cmd.Reason))
}

func (n *Node) applyCommand(ctx context.Context, cmd store.Command) {
	a := n.attemptOf(cmd.TaskID)
	if a == nil {
		// The store says this incarnation holds the task, but no attempt of
		// it is running here: its outcome was written meanwhile, or it was
		// claimed by a pass whose answer never arrived. The command stays
		// pending; whoever moves the task next (the completion, or a
		// rescue once its lease lapses) answers it.
		n.log.Debug("command for a task not running here; left pending",
			zap.Int64("task", cmd.TaskID), zap.Int64("command", cmd.ID), zap.String("command_kind", cmd.Kind))
		return
	}
	switch cmd.Kind {
	case store.CommandStop:
		n.applyStop(ctx, a, cmd)
	case store.CommandPause:
		n.applyPause(ctx, a, cmd)
	default:
		// Resume is applied by its issuer (a paused task runs nowhere); a
		// resume row is a mistake of some other writer.
		n.ack(ctx, a, cmd, fmt.Sprintf("not applicable: %s is not a command for a running task", cmd.Kind))
	}
}

// applyStop stops an attempt: stopping, then its handler cancelled. The
// write comes first so that the trail reads running -> stopping -> stopped.
func (n *Node) applyStop(ctx context.Context, a *attempt, cmd store.Command) {
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
	o, err := n.advanceOne(ctx, store.ActiveTransition{
		Ref: a.ref, To: task.Stopping, Node: n.id, Reason: stopReason(cmd),
	})
	var te *task.TransitionError
	switch {
	case err != nil:
		n.log.Warn("applying a stop failed; will retry at the next poll", append(commandFields(a, cmd), zap.Error(err))...)
		a.mu.Lock()
		a.stopCommand = 0
		a.mu.Unlock()
		return
	case errors.Is(o.Err, store.ErrFenced):
		n.log.Warn("stop not applied: fenced, the attempt was superseded", commandFields(a, cmd)...)
		return
	case errors.As(o.Err, &te) && te.From == task.Stopping:
		// Stopping already: a second stop adds nothing but the cancel.
	case o.Err != nil:
		n.log.Error("stop refused by the store", append(commandFields(a, cmd), zap.Error(o.Err))...)
		return
	}
	n.log.Info("stopping task: cancelling its handler", append(commandFields(a, cmd), zap.String("status", string(o.Status)))...)
	n.metrics.CommandApplied(cmd.Kind, n.cfg.Clock.Now().Sub(cmd.IssuedAt))
	a.cancel(ErrStopRequested)
	a.mu.Lock()
	if !a.done {
		a.stopGrace = n.cfg.Clock.AfterFunc(n.cfg.StopGrace, func() { n.abandonStopped(a, cmd) })
	}
	a.mu.Unlock()
}

// abandonStopped gives up a stopped handler that has not returned within
// StopGrace: the task is written stopped now, and the handler is left to
// end on its own; its writes from here on are fenced.
func (n *Node) abandonStopped(a *attempt, cmd store.Command) {
	if !a.abandon(fmt.Errorf("handler ignored its stop for %v", n.cfg.StopGrace)) {
		return
	}
	n.log.Warn("stopped handler did not return in time: task recorded stopped, handler abandoned; "+
		"its later writes will be fenced", append(commandFields(a, cmd), zap.Duration("grace", n.cfg.StopGrace))...)
	n.completer.add(a, store.ActiveTransition{
		Ref: a.ref, To: task.Stopped, Node: n.id,
		Reason: fmt.Sprintf("stopped; handler abandoned after %v", n.cfg.StopGrace),
	})
}

// applyPause asks the handler to pause at its next checkpoint.
func (n *Node) applyPause(ctx context.Context, a *attempt, cmd store.Command) {
	if done, abandoned := a.state(); done || abandoned != nil {
		return // its outcome is on its way; the command stays pending until then
	}
	o, err := n.advanceOne(ctx, store.ActiveTransition{
		Ref: a.ref, To: task.Pausing, Node: n.id, Reason: "pause requested" + suffix(cmd),
	})
	var te *task.TransitionError
	switch {
	case err != nil:
		n.log.Warn("applying a pause failed; will retry at the next poll", append(commandFields(a, cmd), zap.Error(err))...)
		return
	case errors.Is(o.Err, store.ErrFenced):
		n.log.Warn("pause not applied: fenced, the attempt was superseded", commandFields(a, cmd)...)
		return
	case errors.As(o.Err, &te):
		// Pausing already, or stopping: a stop wins over a pause.
		n.ack(ctx, a, cmd, fmt.Sprintf("not applied: the task is %s", te.From))
		return
	case o.Err != nil:
		n.log.Error("pause refused by the store", append(commandFields(a, cmd), zap.Error(o.Err))...)
		return
	}
	a.pauseRequested.Store(true)
	n.metrics.CommandApplied(cmd.Kind, n.cfg.Clock.Now().Sub(cmd.IssuedAt))
	n.log.Info("pausing task at its next checkpoint", commandFields(a, cmd)...)
	n.ack(ctx, a, cmd, store.OutcomePausing)
}

// advanceOne writes one fenced transition now, outside the completer: a
// command's move must be recorded before the handler is told.
func (n *Node) advanceOne(ctx context.Context, tr store.ActiveTransition) (store.Outcome, error) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), n.stmtTimeout)
	defer cancel()
	out, err := n.store.AdvanceActive(wctx, n.incarnation, []store.ActiveTransition{tr})
	if err != nil {
		return store.Outcome{}, err
	}
	if len(out) != 1 {
		return store.Outcome{}, fmt.Errorf("the store answered %d outcomes for one transition", len(out))
	}
	return out[0], nil
}

// ack acknowledges a command; one acknowledged already keeps its answer.
func (n *Node) ack(ctx context.Context, a *attempt, cmd store.Command, outcome string) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), n.stmtTimeout)
	defer cancel()
	if _, err := n.store.AckCommand(actx, cmd.ID, n.id, outcome); err != nil && !errors.Is(err, store.ErrConflict) {
		n.log.Warn("acknowledging a command failed; it stays pending", append(commandFields(a, cmd), zap.Error(err))...)
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

// attemptHooks connect a handler's task.Task to its attempt on this node.
type attemptHooks struct {
	n *Node
	a *attempt
}

func (h *attemptHooks) Checkpoint(context.Context) error {
	if h.a.pauseRequested.Load() {
		return task.ErrPaused
	}
	return nil
}

func (h *attemptHooks) SaveProgress(ctx context.Context, progress json.RawMessage) error {
	n, a := h.n, h.a
	err := n.store.SaveProgress(ctx, n.incarnation, a.ref, progress)
	if errors.Is(err, store.ErrFenced) {
		n.log.Warn("fenced: progress of a superseded attempt was not saved", a.fields()...)
	}
	return err
}
