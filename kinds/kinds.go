// Package kinds holds the stock task kinds that the worker binary runs out
// of the box, so that a fleet can be tried before any code is written:
// noop, sleep and fail; and exec, which runs a child process, refused
// unless the operator allow-lists executables (see Exec).
package kinds

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/task"
)

// Register adds the stock kinds to a node.
func Register(n *node.Node) {
	n.Register("noop", Noop)
	n.Register("sleep", Sleep)
	n.Register("fail", Fail)
}

// Names lists the stock kinds.
func Names() []string { return []string{"noop", "sleep", "fail"} }

// Noop succeeds at once.
func Noop(context.Context, *task.Task) error { return nil }

// SleepPayload is the payload of a sleep task: {"duration":"2s"}.
type SleepPayload struct {
	Duration string `json:"duration"`
}

// Sleep waits for the payload's duration, or until its context ends (a stop,
// a timeout, a lost lease, shutdown), whichever comes first.
func Sleep(ctx context.Context, t *task.Task) error {
	var p SleepPayload
	if err := decode(t, &p); err != nil {
		return err
	}
	d, err := time.ParseDuration(p.Duration)
	if err != nil || d < 0 {
		return fmt.Errorf(`sleep: payload duration %q is not a duration like "2s"`, p.Duration)
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		t.Result = json.RawMessage(fmt.Sprintf(`{"slept":%q}`, d))
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// FailPayload is the payload of a fail task: {"until_attempt":3} fails
// attempts 1 and 2 and succeeds on attempt 3. Zero fails every attempt.
type FailPayload struct {
	UntilAttempt int `json:"until_attempt"`
}

// Fail fails until the payload's attempt, then succeeds: for trying retries.
func Fail(_ context.Context, t *task.Task) error {
	var p FailPayload
	if err := decode(t, &p); err != nil {
		return err
	}
	if p.UntilAttempt == 0 || t.Attempt < p.UntilAttempt {
		return fmt.Errorf("fail: attempt %d fails as asked (until_attempt %d)", t.Attempt, p.UntilAttempt)
	}
	return nil
}

func decode(t *task.Task, v any) error {
	if len(t.Payload) == 0 || string(t.Payload) == "null" {
		return nil
	}
	if err := json.Unmarshal(t.Payload, v); err != nil {
		return fmt.Errorf("%s: payload %s does not decode: %w", t.Kind, t.Payload, err)
	}
	return nil
}
