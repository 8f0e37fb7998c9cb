package node_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store/memory"
	"github.com/flotilla-dev/flotilla/task"
)

// runOne runs one task of kind on a node made with cfg and the handlers
// given, and returns it as it ended.
func runOne(cfg node.Config, kind string, handlers map[string]node.Handler) *task.Task {
	ctx := context.Background()
	s := memory.New()
	defer s.Close()
	if _, err := s.Migrate(ctx, 16); err != nil {
		panic(err)
	}
	cfg.NodeID, cfg.AllBuckets = "node-1", true
	n, err := node.New(s, cfg)
	if err != nil {
		panic(err)
	}
	for k, h := range handlers {
		if err := n.RegisterSafely(k, h); err != nil {
			panic(err)
		}
	}
	if err := n.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = n.Shutdown(ctx) }()
	t, err := n.Submit(ctx, node.SubmitRequest{Kind: kind, Key: "k", MaxAttempts: 1})
	if err != nil {
		panic(err)
	}
	for !t.Status.Terminal() {
		time.Sleep(5 * time.Millisecond)
		if t, err = s.GetTask(ctx, t.ID); err != nil {
			panic(err)
		}
	}
	return t
}

// Config.Middleware wraps every handler the node runs: here, one that
// times each attempt and one that refuses work in a maintenance window.
func ExampleMiddleware() {
	maintenance := true
	var timing node.Middleware = func(next node.Handler) node.Handler {
		return func(ctx context.Context, t *task.Task) error {
			start := time.Now()
			err := next(ctx, t)
			fmt.Printf("%s took under a minute: %v\n", t.Kind, time.Since(start) < time.Minute)
			return err
		}
	}
	window := func(next node.Handler) node.Handler {
		return func(ctx context.Context, t *task.Task) error {
			if maintenance {
				return task.NoRetry(errors.New("maintenance window"))
			}
			return next(ctx, t)
		}
	}
	t := runOne(node.Config{Middleware: []node.Middleware{timing, window}}, "report",
		map[string]node.Handler{"report": func(context.Context, *task.Task) error { return nil }})
	fmt.Println(t.Status, t.Error)
	// Output:
	// report took under a minute: true
	// failed maintenance window
}

// Chain wraps a handler in middleware, the first outermost, as a node does
// with Config.Middleware.
func ExampleChain() {
	tag := func(name string) node.Middleware {
		return func(next node.Handler) node.Handler {
			return func(ctx context.Context, t *task.Task) error {
				fmt.Println("enter", name)
				defer fmt.Println("leave", name)
				return next(ctx, t)
			}
		}
	}
	h := node.Chain(func(context.Context, *task.Task) error { fmt.Println("handler"); return nil }, tag("outer"), tag("inner"))
	_ = h(context.Background(), &task.Task{})
	// Output:
	// enter outer
	// enter inner
	// handler
	// leave inner
	// leave outer
}

// Recover turns a panic into the attempt's error; a node runs every handler
// inside it.
func ExampleRecover() {
	h := node.Recover(func(context.Context, *task.Task) error { panic("nil map") })
	err := h(context.Background(), &task.Task{})
	var p *node.PanicError
	fmt.Println(errors.As(err, &p), p.Value)
	// Output:
	// true nil map
}

// A panicking handler fails its attempt with a *PanicError, the stack
// included.
func ExamplePanicError() {
	t := runOne(node.Config{}, "boom", map[string]node.Handler{
		"boom": func(context.Context, *task.Task) error { panic("boom-4711") },
	})
	fmt.Println(t.Status, strings.HasPrefix(t.Error, "handler panicked: boom-4711"), strings.Contains(t.Error, "goroutine"))
	// Output:
	// failed true true
}

// LogAttempts logs each attempt's end, and lends the handler a logger with
// the task's attributes.
func ExampleLogAttempts() {
	quiet := func(groups []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey || a.Key == "took" || a.Key == "bucket" || a.Key == "epoch" {
			return slog.Attr{} // left out: they change from run to run
		}
		return a
	}
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{ReplaceAttr: quiet}))
	runOne(node.Config{Middleware: []node.Middleware{node.LogAttempts(logger)}}, "send", map[string]node.Handler{
		"send": func(ctx context.Context, t *task.Task) error {
			node.LoggerFrom(ctx).Info("sending")
			return errors.New("mail server down")
		},
	})
	// Output:
	// level=INFO msg=sending kind=send task=1 attempt=1
	// level=WARN msg="handler failed" kind=send task=1 attempt=1 error="mail server down"
}

// LoggerFrom is the attempt's logger under LogAttempts, and slog's default
// elsewhere.
func ExampleLoggerFrom() {
	fmt.Println(node.LoggerFrom(context.Background()) == slog.Default())
	// Output:
	// true
}

// RegisterSafely returns the mistakes Register panics with.
func ExampleNode_RegisterSafely() {
	s := memory.New()
	defer s.Close()
	n, err := node.New(s, node.Config{AllBuckets: true})
	if err != nil {
		panic(err)
	}
	noop := func(context.Context, *task.Task) error { return nil }
	fmt.Println(n.RegisterSafely("resize", noop))
	fmt.Println(n.RegisterSafely("resize", noop))
	// Output:
	// <nil>
	// node: kind "resize" is registered twice
}
