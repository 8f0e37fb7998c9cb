package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"

	"github.com/flotilla-dev/flotilla/metrics"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store/memory"
	"github.com/flotilla-dev/flotilla/task"
)

// Middleware times every handler by kind and result; add it to the node's
// Config.Middleware, beside Config.Metrics.
func ExampleMetrics_Middleware() {
	s := memory.New()
	defer s.Close()
	m, err := metrics.New(s, metrics.Options{})
	if err != nil {
		panic(err)
	}
	cfg := node.Config{AllBuckets: true, Metrics: m, Middleware: []node.Middleware{m.Middleware()}}
	_ = cfg // node.New(s, cfg) runs every handler inside the middleware

	// What the node does with each attempt, done here by hand:
	h := node.Recover(node.Chain(func(context.Context, *task.Task) error { return errors.New("smtp down") }, cfg.Middleware...))
	_ = h(context.Background(), &task.Task{Kind: "email"})

	rec := httptest.NewRecorder()
	m.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if strings.HasPrefix(line, "flotilla_handler_duration_seconds_count") || strings.HasPrefix(line, "flotilla_handlers_running") {
			fmt.Println(line)
		}
	}
	// Output:
	// flotilla_handler_duration_seconds_count{kind="email",result="error"} 1
	// flotilla_handlers_running{kind="email"} 0
}
