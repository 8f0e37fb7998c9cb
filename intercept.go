package flotilla

import (
	"context"

	"github.com/flotilla-dev/flotilla/task"
)

// ClientOption configures a Client (Connect, NewClient).
type ClientOption func(*Client)

// SubmitFunc creates tasks from requests: the rest of a submit, which a
// SubmitMiddleware wraps. It returns the tasks in the order of rs.
type SubmitFunc func(ctx context.Context, rs []TaskRequest) ([]*task.Task, error)

// SubmitMiddleware wraps every submit of the client (SubmitArgs, Submit,
// SubmitMany, SubmitTx, ...) once its options are applied: it may change
// the requests (add Metadata), run code around the rest, and see what was
// created. Package otel starts a span for each submit this way, and keeps
// the trace context in each task's metadata.
type SubmitMiddleware func(next SubmitFunc) SubmitFunc

// WithSubmitMiddleware wraps every submit of the client in mws, the first
// outermost.
func WithSubmitMiddleware(mws ...SubmitMiddleware) ClientOption {
	return func(c *Client) { c.middleware = append(c.middleware, mws...) }
}

func chainSubmit(last SubmitFunc, mws []SubmitMiddleware) SubmitFunc {
	for i := len(mws) - 1; i >= 0; i-- {
		last = mws[i](last)
	}
	return last
}
