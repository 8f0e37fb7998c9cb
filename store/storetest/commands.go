package storetest

import (
	"errors"
	"testing"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

func testCommands(t *testing.T, h Harness) {
	t.Run("IssuePendingAck", func(t *testing.T) {
		b := setup(t, h)
		running, _ := b.runningTask("a", 1)
		queued := b.create(store.NewTask{Key: "k", Bucket: 2})[0]

		cmd, err := b.s.IssueCommand(b.ctx, store.NewCommand{TaskID: running.ID, Kind: store.CommandStop, Reason: "bad deploy", IssuedBy: "ops@host"})
		if err != nil {
			t.Fatal(err)
		}
		if cmd.ID == 0 || cmd.Owner != "a" || cmd.IssuedAt.IsZero() || cmd.Acked() || cmd.Reason != "bad deploy" {
			t.Errorf("issued command %+v", cmd)
		}
		other, err := b.s.IssueCommand(b.ctx, store.NewCommand{TaskID: queued.ID, Kind: store.CommandPause})
		if err != nil {
			t.Fatal(err)
		}
		if other.Owner != "" {
			t.Errorf("a command for a task nobody runs has owner %q", other.Owner)
		}

		pending, err := b.s.PendingCommands(b.ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		if len(pending) != 1 || pending[0].ID != cmd.ID {
			t.Fatalf("pending for a: %+v, want only the stop", pending)
		}
		if p, _ := b.s.PendingCommands(b.ctx, "b"); len(p) != 0 {
			t.Errorf("b sees a's commands: %+v", p)
		}

		acked, err := b.s.AckCommand(b.ctx, cmd.ID, "node-a", "stopped")
		if err != nil {
			t.Fatal(err)
		}
		if !acked.Acked() || acked.AckedBy != "node-a" || acked.Outcome != "stopped" {
			t.Errorf("acknowledged command %+v", acked)
		}
		if _, err := b.s.AckCommand(b.ctx, cmd.ID, "node-x", "other"); !errors.Is(err, store.ErrConflict) {
			t.Errorf("second acknowledgement: %v, want store.ErrConflict", err)
		}
		got, err := b.s.GetCommand(b.ctx, cmd.ID)
		if err != nil || got.Outcome != "stopped" || got.AckedBy != "node-a" {
			t.Errorf("after a second ack the first answer must stand: %+v %v", got, err)
		}
		if p, _ := b.s.PendingCommands(b.ctx, "a"); len(p) != 0 {
			t.Errorf("an acknowledged command is still pending: %+v", p)
		}
	})

	t.Run("PendingFollowsTheTaskNotTheIssuer", func(t *testing.T) {
		// A command for a task whose holder died is consumed by whoever runs
		// the task next, never by the dead owner's successor in name only.
		b := setup(t, h)
		running, _ := b.runningTask("a", 1)
		cmd, _ := b.s.IssueCommand(b.ctx, store.NewCommand{TaskID: running.ID, Kind: store.CommandStop})
		b.advance("a", store.ActiveTransition{Ref: running.Ref(), To: task.Queued, Reason: "shutdown"})
		if p, _ := b.s.PendingCommands(b.ctx, "a"); len(p) != 0 {
			t.Errorf("a still sees a command for a task it no longer runs: %+v", p)
		}
		if _, err := b.s.GetCommand(b.ctx, cmd.ID); err != nil {
			t.Errorf("the command is gone: %v", err)
		}
		if b.get(running.ID).Status != task.Stopped {
			t.Errorf("release with a stop pending left the task %s, want stopped", b.get(running.ID).Status)
		}
	})

	t.Run("TheMoveThatStopsAcknowledges", func(t *testing.T) {
		// A stop honoured by an attempt's end (the node's completion) or by
		// a rescue (Transition) is acknowledged, atomically, with outcome
		// stopped and the mover's node; other commands of the finished task
		// are answered "already finished".
		b := setup(t, h)
		running, _ := b.runningTask("a", 1)
		stop, _ := b.s.IssueCommand(b.ctx, store.NewCommand{TaskID: running.ID, Kind: store.CommandStop})
		pause, _ := b.s.IssueCommand(b.ctx, store.NewCommand{TaskID: running.ID, Kind: store.CommandPause})
		if o := b.advance("a", store.ActiveTransition{Ref: running.Ref(), To: task.Retrying, Error: "boom"}); o.Status != task.Stopped {
			t.Fatalf("a failed attempt with a stop pending ended %s (%v), want stopped", o.Status, o.Err)
		}
		got, err := b.s.GetCommand(b.ctx, stop.ID)
		if err != nil || !got.Acked() || got.Outcome != store.OutcomeStopped || got.AckedBy != nodeOf("a") {
			t.Errorf("stop after the task stopped: %+v %v, want acknowledged %q by %s", got, err, store.OutcomeStopped, nodeOf("a"))
		}
		if got, _ := b.s.GetCommand(b.ctx, pause.ID); got.Outcome != store.OutcomeFinishedPrefix+"stopped" {
			t.Errorf("a pause of a task that stopped: %+v, want %q", got, store.OutcomeFinishedPrefix+"stopped")
		}

		// Work that finished before its stop was seen answers the stop too.
		done, _ := b.runningTask("a", 3)
		late, _ := b.s.IssueCommand(b.ctx, store.NewCommand{TaskID: done.ID, Kind: store.CommandStop})
		if o := b.advance("a", store.ActiveTransition{Ref: done.Ref(), To: task.Succeeded}); o.Status != task.Succeeded {
			t.Fatalf("completion with a stop pending ended %s (%v), want succeeded", o.Status, o.Err)
		}
		if got, _ := b.s.GetCommand(b.ctx, late.ID); got.Outcome != store.OutcomeFinishedPrefix+"succeeded" || got.AckedBy != nodeOf("a") {
			t.Errorf("a stop that came too late: %+v, want %q by %s", got, store.OutcomeFinishedPrefix+"succeeded", nodeOf("a"))
		}
		if p, _ := b.s.PendingCommands(b.ctx, "a"); len(p) != 0 {
			t.Errorf("commands of finished tasks still pending: %+v", p)
		}

		rescued, held := b.runningTask("b", 2)
		stop2, _ := b.s.IssueCommand(b.ctx, store.NewCommand{TaskID: rescued.ID, Kind: store.CommandStop})
		_, err = b.s.Transition(b.ctx, store.Transition{
			ID: rescued.ID, Version: rescued.StatusVersion, To: task.Retrying, Reason: "lease expired",
			Node: "rescuer", Epoch: held[0].Epoch, Guard: &store.LeaseGuard{Owner: "b", Epoch: held[0].Epoch},
		})
		if err != nil {
			t.Fatal(err)
		}
		got, _ = b.s.GetCommand(b.ctx, stop2.ID)
		if b.get(rescued.ID).Status != task.Stopped || got.Outcome != store.OutcomeStopped || got.AckedBy != "rescuer" {
			t.Errorf("rescue with a stop pending: task %s, command %+v; want stopped, acknowledged by rescuer",
				b.get(rescued.ID).Status, got)
		}
	})

	t.Run("NoSuchTaskOrCommand", func(t *testing.T) {
		b := setup(t, h)
		if _, err := b.s.IssueCommand(b.ctx, store.NewCommand{TaskID: 4242, Kind: store.CommandStop}); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("command for a missing task: %v, want store.ErrNotFound", err)
		}
		if _, err := b.s.GetCommand(b.ctx, 4242); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("missing command: %v", err)
		}
		if _, err := b.s.AckCommand(b.ctx, 4242, "n", "x"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("ack of a missing command: %v", err)
		}
	})
}
