// Package kinds holds the stock task kinds that the worker binary runs out
// of the box, so that a fleet can be tried before any code is written:
// noop, sleep and fail; and exec, which runs a child process, refused
// unless the operator allow-lists executables (see Exec).
//
// A program registers them on its node, and submits their payloads as any
// task type (each is a flotilla.Args):
//
//	kinds.Register(n)
//	kinds.RegisterExec(n, kinds.ExecConfig{Allowed: []string{"/usr/local/bin/backup"}})
//	t, err := flotilla.SubmitArgs(ctx, client, kinds.SleepPayload{Duration: "2s"})
package kinds

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store"
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

// Kind is "sleep": a SleepPayload is the arguments of a sleep task
// (flotilla.SubmitArgs).
func (SleepPayload) Kind() string { return "sleep" }

// SleepProgress is what a paused sleep saves: how long it has slept, so
// that the attempt after a resume sleeps only the rest.
type SleepProgress struct {
	Slept string `json:"slept"`
}

// sleepCheckpoint is how often Sleep asks whether it should pause: short
// enough that a pause from the command line takes effect at once, long
// enough to cost nothing.
const sleepCheckpoint = 100 * time.Millisecond

// Sleep waits for the payload's duration, or until its context ends (a stop,
// a timeout, a lost lease, shutdown), whichever comes first. It checkpoints
// as it sleeps: a pause saves how long it has slept and ends the attempt
// (task.ErrPaused), and the attempt after a resume sleeps the rest.
func Sleep(ctx context.Context, t *task.Task) error {
	d, err := sleepDuration(t.Payload)
	if err != nil {
		return task.NoRetry(err)
	}
	var slept time.Duration
	if len(t.Progress) > 0 && string(t.Progress) != "null" {
		var p SleepProgress
		if err := json.Unmarshal(t.Progress, &p); err == nil {
			slept, _ = time.ParseDuration(p.Slept)
		}
	}
	start := time.Now()
	timer := time.NewTimer(max(d-slept, 0))
	defer timer.Stop()
	tick := time.NewTicker(sleepCheckpoint)
	defer tick.Stop()
	for {
		select {
		case <-timer.C:
			t.Result = json.RawMessage(fmt.Sprintf(`{"slept":%q}`, d))
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-tick.C:
			if err := t.Checkpoint(ctx); errors.Is(err, task.ErrPaused) {
				done := slept + time.Since(start)
				progress, _ := json.Marshal(SleepProgress{Slept: done.String()})
				if err := t.SaveProgress(ctx, progress); err != nil {
					return fmt.Errorf("sleep: save progress for the pause: %w", err)
				}
				return task.ErrPaused
			}
		}
	}
}

// sleepDuration reads a sleep payload's duration.
func sleepDuration(payload json.RawMessage) (time.Duration, error) {
	var p SleepPayload
	if err := decodeStrict(payload, &p); err != nil {
		return 0, fmt.Errorf(`sleep: %w: give {"duration":"2s"}`, err)
	}
	d, err := time.ParseDuration(p.Duration)
	if err != nil || d < 0 {
		return 0, fmt.Errorf(`sleep: payload duration %q is not a duration like "2s"`, p.Duration)
	}
	return d, nil
}

// FailPayload is the payload of a fail task: {"until_attempt":3} fails
// attempts 1 and 2 and succeeds on attempt 3. Zero fails every attempt.
type FailPayload struct {
	UntilAttempt int `json:"until_attempt"`
}

// Kind is "fail": a FailPayload is the arguments of a fail task.
func (FailPayload) Kind() string { return "fail" }

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

// Payloads describes the payload of each stock kind, for help texts.
var Payloads = map[string]string{
	"noop":  `any JSON, ignored; succeeds at once`,
	"sleep": `{"duration":"2s"}: sleeps that long, checkpointing, so that it can be paused and resumed`,
	"fail":  `{"until_attempt":3}: fails attempts 1 and 2, succeeds on 3; 0 or none fails every attempt`,
	"exec":  `{"argv":["/usr/bin/env","echo","hi"],"env":{"NAME":"value"},"dir":"/tmp"}: runs a program the node allows (--allow-exec)`,
}

// CheckPayload refuses, at submit, a payload that a stock kind could never
// use, so that it fails now with exit 2 rather than attempt after attempt on
// a node: a *store.InvalidError, which matches store.ErrInvalid. Kinds that are not stock are not
// checked: their handlers are the application's.
func CheckPayload(kind string, payload json.RawMessage) error {
	var err error
	switch kind {
	case "sleep":
		_, err = sleepDuration(payload)
	case "fail":
		var p FailPayload
		if err = decodeStrict(payload, &p); err == nil && p.UntilAttempt < 0 {
			err = fmt.Errorf("until_attempt %d is negative", p.UntilAttempt)
		}
		if err != nil {
			err = fmt.Errorf(`fail: %w: give {"until_attempt":N} with N at least 0`, err)
		}
	case "exec":
		var p ExecPayload
		if err = decodeStrict(payload, &p); err == nil && (len(p.Argv) == 0 || p.Argv[0] == "") {
			err = errors.New("no command")
		}
		if err != nil {
			err = fmt.Errorf(`exec: %w: give {"argv":["/path/to/program", ...]}`, err)
		}
	}
	if err != nil {
		return &store.InvalidError{Field: "payload", Value: string(payload), Problem: "is refused by kind " + kind,
			Valid: strings.TrimPrefix(err.Error(), kind+": ")}
	}
	return nil
}

// decodeStrict decodes a payload, refusing fields the kind does not know
// (a misspelt "duration" would otherwise mean none). Null or none decodes
// to the zero value.
func decodeStrict(payload json.RawMessage, v any) error {
	if len(payload) == 0 || string(payload) == "null" {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("the payload does not decode (%v)", err)
	}
	return nil
}
