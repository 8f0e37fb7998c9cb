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
		// The answer says what the command was issued on: an issuer that
		// does not read the task first (commands.Stop) reports it.
		if cmd.TaskStatus != task.Running || cmd.TaskNode != running.Node || running.Node == "" {
			t.Errorf("issued on task %s of node %q, want running on %q", cmd.TaskStatus, cmd.TaskNode, running.Node)
		}
		if stored, err := b.s.GetCommand(b.ctx, cmd.ID); err != nil || stored.ID != cmd.ID || stored.IssuedAt != cmd.IssuedAt ||
			stored.Owner != cmd.Owner || stored.IssuedBy != cmd.IssuedBy || stored.Kind != cmd.Kind || stored.TaskID != cmd.TaskID {
			t.Errorf("stored command %+v (%v), want what was issued: %+v", stored, err, cmd)
		}
		if got := b.get(running.ID); !got.StopRequested || got.PauseRequested {
			t.Errorf("after a stop command the task reads stop %v pause %v, want the stop recorded on it",
				got.StopRequested, got.PauseRequested)
		}
		// A command is for a task some node runs: one that waits is
		// changed directly by its issuer (package commands), never left a
		// command that a claim would have to find.
		for _, kind := range []string{store.CommandStop, store.CommandPause} {
			if _, err := b.s.IssueCommand(b.ctx, store.NewCommand{TaskID: queued.ID, Kind: kind}); !errors.Is(err, store.ErrConflict) {
				t.Errorf("%s command for a queued task: %v, want store.ErrConflict", kind, err)
			}
		}
		if got := b.get(queued.ID); got.StopRequested || got.PauseRequested {
			t.Errorf("a refused command marked the queued task: stop %v pause %v", got.StopRequested, got.PauseRequested)
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

	t.Run("ACommandIsIssuedOnlyOnTheTaskAsItWasSeen", func(t *testing.T) {
		// The issuer decided on a running task; its attempt failed before
		// the command was written. The command must not land on the retry,
		// which would run again with nothing to stop it.
		b := setup(t, h)
		running, _ := b.runningTask("a", 1)
		b.advance("a", store.ActiveTransition{Ref: running.Ref(), To: task.Retrying, Error: "boom"})
		for _, kind := range []string{store.CommandStop, store.CommandPause} {
			_, err := b.s.IssueCommand(b.ctx, store.NewCommand{TaskID: running.ID, Kind: kind, ExpectVersion: running.StatusVersion})
			if !errors.Is(err, store.ErrConflict) {
				t.Errorf("%s command decided on version %d of a task since retried: %v, want store.ErrConflict",
					kind, running.StatusVersion, err)
			}
		}
		got := b.get(running.ID)
		if got.Status != task.Retrying || got.StopRequested || got.PauseRequested {
			t.Errorf("refused commands changed the task: %s stop %v pause %v", got.Status, got.StopRequested, got.PauseRequested)
		}
		if p, _ := b.s.PendingCommands(b.ctx, "a"); len(p) != 0 {
			t.Errorf("refused commands are pending: %+v", p)
		}

		// Running again, under a new claim: still not the task the issuer
		// decided on, whose attempt is over.
		reclaimed := b.claim("a", b.hold("a", 1), 1)
		if len(reclaimed) != 1 || reclaimed[0].ID != running.ID {
			t.Fatalf("claim of the retry: %v", ids(reclaimed))
		}
		if _, err := b.s.IssueCommand(b.ctx, store.NewCommand{TaskID: running.ID, Kind: store.CommandStop, ExpectVersion: running.StatusVersion}); !errors.Is(err, store.ErrConflict) {
			t.Errorf("stop decided on attempt 1 of a task now running attempt 2: %v, want store.ErrConflict", err)
		}
		if got := b.get(running.ID); got.StopRequested {
			t.Error("a refused stop marked the task's new attempt")
		}

		// At the version it was decided on, the command is issued.
		again, held := b.runningTask("a", 2)
		if _, err := b.s.IssueCommand(b.ctx, store.NewCommand{TaskID: again.ID, Kind: store.CommandStop, ExpectVersion: again.StatusVersion}); err != nil {
			t.Fatalf("stop at the version seen: %v", err)
		}
		// Every move out of the active states honours it, a rescue's too.
		_, err := b.s.Transition(b.ctx, store.Transition{
			ID: again.ID, Version: again.StatusVersion, To: task.Retrying, Reason: "lease expired",
			Node: "rescuer", Epoch: held[0].Epoch, Guard: &store.LeaseGuard{Owner: "a", Epoch: held[0].Epoch},
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := b.get(again.ID); got.Status != task.Stopped || got.StopRequested {
			t.Errorf("rescue of a task with a stop requested: %s (stop flag %v), want stopped and the flag cleared",
				got.Status, got.StopRequested)
		}
	})

	t.Run("APendingPauseWinsOverARetryAndARelease", func(t *testing.T) {
		b := setup(t, h)
		// The attempt fails before its node has applied the pause.
		failing, _ := b.runningTask("a", 1)
		pause, err := b.s.IssueCommand(b.ctx, store.NewCommand{TaskID: failing.ID, Kind: store.CommandPause, ExpectVersion: failing.StatusVersion})
		if err != nil {
			t.Fatal(err)
		}
		if o := b.advance("a", store.ActiveTransition{Ref: failing.Ref(), To: task.Retrying, Error: "boom"}); o.Err != nil || o.Status != task.Paused {
			t.Fatalf("a failed attempt with a pause pending: %+v, want paused", o)
		}
		if got, _ := b.s.GetCommand(b.ctx, pause.ID); got.Outcome != store.OutcomePaused || got.AckedBy != nodeOf("a") {
			t.Errorf("the pause honoured by the failure: %+v, want acknowledged %q by %s", got, store.OutcomePaused, nodeOf("a"))
		}
		if got := b.get(failing.ID); got.PauseRequested || got.Error != "boom" {
			t.Errorf("paused task: pause flag %v error %q, want the flag cleared and the attempt's error kept", got.PauseRequested, got.Error)
		}

		// A pausing attempt released at shutdown keeps its pause; the
		// attempt counts, as it does for a pause at a checkpoint.
		pausing, _ := b.runningTask("a", 2)
		b.advance("a", store.ActiveTransition{Ref: pausing.Ref(), To: task.Pausing})
		if o := b.advance("a", store.ActiveTransition{Ref: pausing.Ref(), To: task.Queued, Reason: "released at shutdown"}); o.Err != nil || o.Status != task.Paused {
			t.Fatalf("release of a pausing attempt: %+v, want paused", o)
		}
		if got := b.get(pausing.ID); got.Attempt != 1 {
			t.Errorf("a paused release counted as attempt %d, want 1", got.Attempt)
		}

		// Success is the truth, whatever was asked.
		done, _ := b.runningTask("a", 3)
		if _, err := b.s.IssueCommand(b.ctx, store.NewCommand{TaskID: done.ID, Kind: store.CommandPause}); err != nil {
			t.Fatal(err)
		}
		if o := b.advance("a", store.ActiveTransition{Ref: done.Ref(), To: task.Succeeded}); o.Status != task.Succeeded {
			t.Errorf("success with a pause pending: %+v", o)
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
