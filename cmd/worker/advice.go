package main

import (
	"context"
	"errors"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/kinds"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// flagAdvice is the command line's own advice for an error of the library,
// whose message names the Go option to use: the flag or command that does
// the same here. "" when there is none.
func flagAdvice(err error) string {
	var (
		unheld    *flotilla.UnheldBucketError
		unserved  *flotilla.UnservedKindError
		schema    *store.SchemaError
		alive     *store.NodeAliveError
		exec      *kinds.NotAllowedError
		execEnv   *kinds.EnvNotAllowedError
		dangerous *kinds.DangerousEnvError
	)
	switch {
	case errors.As(err, &unheld):
		return "--allow-unowned submits it anyway"
	case errors.As(err, &unserved):
		return "--allow-unknown-kind submits it anyway"
	case errors.Is(err, flotilla.ErrNoSchema), errors.As(err, &schema) && schema.Database < schema.Binary:
		return "run `worker migrate`"
	case errors.As(err, &alive):
		return "or start this one with another --node-id"
	case errors.As(err, &exec):
		return "start the node with --allow-exec PATH"
	case errors.As(err, &execEnv):
		return "start the node with --allow-exec-env NAME"
	case errors.As(err, &dangerous):
		return "--allow-exec-env " + dangerous.Name + " is refused"
	case errors.Is(err, kinds.ErrExecUserNeedsRoot):
		return "it was given with --exec-user"
	}
	return ""
}

// withFlagAdvice adds flagAdvice to err's message; the chain, and so the
// exit status, stay err's.
func withFlagAdvice(err error) error {
	if err == nil {
		return nil
	}
	if advice := flagAdvice(err); advice != "" {
		return &advisedError{err: err, advice: advice}
	}
	return err
}

type advisedError struct {
	err    error
	advice string
}

func (e *advisedError) Error() string {
	return e.err.Error() + " (on the command line: " + e.advice + ")"
}
func (e *advisedError) Unwrap() error { return e.err }

// adviseFlags is the middleware of `worker run`: an attempt's error that
// names a Go option (an exec refused by the node's allow list) is recorded
// with the flag that sets it, since whoever reads it ran this binary.
func adviseFlags(next node.Handler) node.Handler {
	return func(ctx context.Context, t *task.Task) error {
		return withFlagAdvice(next(ctx, t))
	}
}
