package metrics_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/metrics"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store/memory"
	"github.com/flotilla-dev/flotilla/task"
)

func TestMiddlewareCountsHandlersByKindAndResult(t *testing.T) {
	s := memory.New()
	t.Cleanup(s.Close)
	m, err := metrics.New(s, metrics.Options{Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(m)
	t.Cleanup(srv.Close)
	b := &testBundle{ctx: context.Background(), m: m, url: srv.URL}
	mw := m.Middleware()

	inside := make(chan struct{})
	release := make(chan struct{})
	blocking := node.Recover(mw(func(context.Context, *task.Task) error {
		close(inside)
		<-release
		return nil
	}))
	done := make(chan error)
	go func() { done <- blocking(b.ctx, &task.Task{Kind: "resize"}) }()
	<-inside
	if v, _ := value(b.scrape(t), "flotilla_handlers_running", "kind", "resize"); v != 1 {
		t.Errorf("handlers_running{kind=resize} = %v while one runs, want 1", v)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	for _, h := range []node.Handler{
		func(context.Context, *task.Task) error { return errors.New("boom") },
		func(context.Context, *task.Task) error { return task.ErrPaused },
		func(context.Context, *task.Task) error { panic("boom") },
	} {
		_ = node.Recover(mw(h))(b.ctx, &task.Task{Kind: "resize"})
	}
	fams := b.scrape(t)
	if v, _ := value(fams, "flotilla_handlers_running", "kind", "resize"); v != 0 {
		t.Errorf("handlers_running{kind=resize} = %v once all returned, want 0", v)
	}
	for _, result := range []string{"ok", "error", "paused", "panic"} {
		if v, ok := value(fams, "flotilla_handler_duration_seconds", "kind", "resize", "result", result); !ok || v != 1 {
			t.Errorf("handler_duration_seconds{kind=resize,result=%s} counts %v, want 1", result, v)
		}
	}

	var none *metrics.Metrics
	if err := none.Middleware()(func(context.Context, *task.Task) error { return nil })(b.ctx, &task.Task{}); err != nil {
		t.Errorf("the middleware of a nil *Metrics: %v", err)
	}
}
