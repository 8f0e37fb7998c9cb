package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/flotilla-dev/flotilla/task"
)

// Middleware wraps a handler with code that runs around every attempt: a
// log line, a metric, a trace span, a panic report. It returns the handler
// to run instead of next, and that handler decides whether and how next
// runs; what it returns is the attempt's outcome.
//
// Config.Middleware wraps every handler the node runs, the stock kinds
// included.
type Middleware func(next Handler) Handler

// Chain wraps h in mws: the first is outermost, so it runs first and sees
// the outcome last.
func Chain(h Handler, mws ...Middleware) Handler {
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	return h
}

// Recover turns a panic in next into a failed attempt whose error holds the
// panic value and the stack, instead of a crashed process. Every node runs
// its handlers inside it, outside Config.Middleware, so that a panic in a
// middleware fails the attempt too; use it to run a handler of your own
// outside a node as a node would.
func Recover(next Handler) Handler {
	return func(ctx context.Context, t *task.Task) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = &PanicError{Value: r, Stack: debug.Stack()}
			}
		}()
		return next(ctx, t)
	}
}

// PanicError is a handler's panic, as the attempt's error (Recover).
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("handler panicked: %v\n\n%s", e.Value, e.Stack)
}

// loggerKey carries the attempt's logger in its context (LogAttempts).
type loggerKey struct{}

// LogAttempts logs the end of every attempt on l, with the task's kind,
// id, attempt, bucket and epoch and the handler's run time: at Debug when it
// succeeded, at Warn when it returned an error (task.ErrPaused is not one).
// The handler finds l, with those attributes, through LoggerFrom(ctx).
func LogAttempts(l *slog.Logger) Middleware {
	return func(next Handler) Handler {
		return func(ctx context.Context, t *task.Task) error {
			al := l.With(slog.String("kind", t.Kind), slog.Int64("task", t.ID), slog.Int("attempt", t.Attempt),
				slog.Int("bucket", t.Bucket), slog.Int64("epoch", t.Epoch))
			start := time.Now()
			err := next(context.WithValue(ctx, loggerKey{}, al), t)
			took := slog.Duration("took", time.Since(start))
			switch {
			case err == nil:
				al.DebugContext(ctx, "handler succeeded", took)
			case errors.Is(err, task.ErrPaused):
				al.InfoContext(ctx, "handler paused at a checkpoint", took)
			default:
				al.WarnContext(ctx, "handler failed", took, slog.String("error", err.Error()))
			}
			return err
		}
	}
}

// LoggerFrom returns the logger LogAttempts gave the attempt whose context
// ctx is, with the task's attributes; slog.Default() outside one.
func LoggerFrom(ctx context.Context) *slog.Logger {
	if l, ok := ctx.Value(loggerKey{}).(*slog.Logger); ok {
		return l
	}
	return slog.Default()
}
