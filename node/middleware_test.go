package node

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/flotilla-dev/flotilla/task"
)

func TestMiddlewareWrapsEveryHandlerFirstOutermost(t *testing.T) {
	b := setup(t)
	var mu sync.Mutex
	var order []string
	record := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, s)
	}
	wrap := func(name string) Middleware {
		return func(next Handler) Handler {
			return func(ctx context.Context, t *task.Task) error {
				record(name + " before " + t.Kind)
				err := next(ctx, t)
				record(name + " after " + t.Kind)
				return err
			}
		}
	}
	cfg := b.config(t, "wrapped")
	cfg.Middleware = []Middleware{wrap("outer"), wrap("inner")}
	n := b.startNode(t, cfg, map[string]Handler{
		"work": func(context.Context, *task.Task) error { record("handler"); return nil },
	})
	tk := submit(t, n, SubmitRequest{Kind: "work", Key: "k"})
	eventually(t, "the task succeeded", b.statusIs(t, tk.ID, task.Succeeded))
	mu.Lock()
	defer mu.Unlock()
	if got, want := strings.Join(order, ", "), "outer before work, inner before work, handler, inner after work, outer after work"; got != want {
		t.Errorf("calls %q, want %q", got, want)
	}
}

func TestAMiddlewareDecidesTheOutcome(t *testing.T) {
	b := setup(t)
	refuse := func(next Handler) Handler {
		return func(ctx context.Context, t *task.Task) error {
			if t.Key == "blocked" {
				return task.NoRetry(errors.New("blocked by a middleware"))
			}
			return next(ctx, t)
		}
	}
	cfg := b.config(t, "gatekeeper")
	cfg.Middleware = []Middleware{refuse}
	ran := make(chan string, 2)
	n := b.startNode(t, cfg, map[string]Handler{
		"work": func(_ context.Context, t *task.Task) error { ran <- t.Key; return nil },
	})
	blocked := submit(t, n, SubmitRequest{Kind: "work", Key: "blocked"})
	open := submit(t, n, SubmitRequest{Kind: "work", Key: "open"})
	eventually(t, "the blocked task failed", b.statusIs(t, blocked.ID, task.Failed))
	eventually(t, "the open task succeeded", b.statusIs(t, open.ID, task.Succeeded))
	if got := b.get(t, blocked.ID).Error; got != "blocked by a middleware" {
		t.Errorf("blocked task's error %q", got)
	}
	if key := <-ran; key != "open" || len(ran) != 0 {
		t.Errorf("the handler ran for %q and %d more; want only the open task", key, len(ran))
	}
}

// A panic in a middleware fails the attempt as one in a handler does: the
// node runs the whole chain inside Recover.
func TestAPanicInAMiddlewareIsAFailedAttempt(t *testing.T) {
	b := setup(t)
	cfg := b.config(t, "panicky-middleware")
	cfg.Middleware = []Middleware{func(Handler) Handler {
		return func(context.Context, *task.Task) error { panic("middleware-4711") }
	}}
	n := b.startNode(t, cfg, map[string]Handler{"work": noop})
	tk := submit(t, n, SubmitRequest{Kind: "work", Key: "k", MaxAttempts: 1})
	eventually(t, "the task failed", b.statusIs(t, tk.ID, task.Failed))
	if msg := b.get(t, tk.ID).Error; !strings.Contains(msg, "panicked: middleware-4711") || !strings.Contains(msg, "goroutine") {
		t.Errorf("error %q, want the panic and its stack", msg)
	}
}

func TestLogAttemptsLogsEachEndAndLendsItsLogger(t *testing.T) {
	b := setup(t)
	var buf syncBuffer
	l := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg := b.config(t, "logged")
	cfg.Middleware = []Middleware{LogAttempts(l)}
	n := b.startNode(t, cfg, map[string]Handler{
		"work": func(ctx context.Context, t *task.Task) error {
			LoggerFrom(ctx).Info("inside the handler")
			if t.Key == "bad" {
				return task.NoRetry(errors.New("bad input 4711"))
			}
			return nil
		},
	})
	good := submit(t, n, SubmitRequest{Kind: "work", Key: "good"})
	bad := submit(t, n, SubmitRequest{Kind: "work", Key: "bad"})
	eventually(t, "both ended", func() bool {
		return b.statusIs(t, good.ID, task.Succeeded)() && b.statusIs(t, bad.ID, task.Failed)()
	})
	out := buf.String()
	for _, want := range []string{
		"level=INFO msg=\"inside the handler\" kind=work task=" + strconv.FormatInt(good.ID, 10) + " attempt=1 bucket=",
		"level=DEBUG msg=\"handler succeeded\" kind=work task=" + strconv.FormatInt(good.ID, 10),
		"level=WARN msg=\"handler failed\" kind=work task=" + strconv.FormatInt(bad.ID, 10),
		"error=\"bad input 4711\"",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the log lacks %q:\n%s", want, out)
		}
	}
	if l := LoggerFrom(context.Background()); l != slog.Default() {
		t.Errorf("LoggerFrom outside an attempt is %v, want slog.Default()", l)
	}
}

// A node given a *slog.Logger logs its own lines there, with their fields.
func TestANodeLogsToTheSlogLoggerItIsGiven(t *testing.T) {
	b := setup(t)
	var buf syncBuffer
	cfg := b.config(t, "slogged")
	cfg.Logger = nil
	cfg.Slog = slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	n := b.startNode(t, cfg, map[string]Handler{"work": noop})
	tk := submit(t, n, SubmitRequest{Kind: "work", Key: "k"})
	eventually(t, "the task succeeded", b.statusIs(t, tk.ID, task.Succeeded))
	eventually(t, "the node logged the task's start", func() bool {
		return strings.Contains(buf.String(), `"msg":"task started","node":"slogged","task":`+strconv.FormatInt(tk.ID, 10))
	})
	if out := buf.String(); !strings.Contains(out, `"level":"DEBUG"`) || !strings.Contains(out, `"kind":"work"`) {
		t.Errorf("the node's lines lack their level or fields:\n%s", out)
	}

	both := b.config(t, "both")
	both.Slog = cfg.Slog
	if _, err := New(b.store, both); err == nil || !strings.Contains(err.Error(), "both Slog and Logger") {
		t.Errorf("New with both loggers: %v, want a refusal naming both", err)
	}
}

func TestRegisterSafelyReturnsWhatRegisterPanicsWith(t *testing.T) {
	b := setup(t)
	n := b.newNode(t, b.config(t, "registrar"), map[string]Handler{"work": noop})
	for what, err := range map[string]error{
		"an empty kind":       n.RegisterSafely("", noop),
		"a nil handler":       n.RegisterSafely("x", nil),
		"a duplicate kind":    n.RegisterSafely("work", noop),
		"a kind not UTF-8":    n.RegisterSafely("a\xff", noop),
		"a kind of 600 bytes": n.RegisterSafely(strings.Repeat("k", 600), noop),
	} {
		if err == nil {
			t.Errorf("%s: registered", what)
		}
	}
	if err := n.RegisterSafely("other", noop); err != nil {
		t.Fatal(err)
	}
	if err := n.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.RegisterSafely("late", noop); err == nil || !strings.Contains(err.Error(), "after Start") {
		t.Errorf("a kind after Start: %v", err)
	}
}

// syncBuffer is a bytes.Buffer that handlers on several goroutines may
// write to while a test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
