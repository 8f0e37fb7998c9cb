// Package otel traces flotilla tasks with OpenTelemetry: a span for each
// submit, and a span for each attempt that is a child of the submit's, in
// whatever process and however much later the attempt runs.
//
//	client, err := flotilla.Connect(ctx, dsn,
//		flotilla.WithSubmitMiddleware(otel.SubmitMiddleware()))
//	n, err := node.New(client.Store(), node.Config{
//		AllBuckets: true,
//		Middleware: []node.Middleware{otel.Middleware()},
//	})
//
// Both use the global tracer provider and propagator (otel.SetTracerProvider,
// otel.SetTextMapPropagator of go.opentelemetry.io/otel) unless given
// others, WithTracerProvider and WithPropagator. The propagator must carry
// the trace context (propagation.TraceContext): with the global default,
// which carries nothing, attempts start traces of their own.
//
// The submit's trace context travels in the task's metadata
// (task.Task.Metadata, which every store keeps apart from the payload),
// under the propagator's keys (traceparent, tracestate). An attempt's span
// records the task's id, kind and key, the attempt's number, and the bucket
// and epoch it ran under; a handler's error marks it failed. Spans of a
// submit that creates several tasks record how many; each task's attempts
// are children of that one span.
package otel

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/task"
)

// ScopeName is the instrumentation scope of the spans: the name of the
// tracer they come from.
const ScopeName = "github.com/flotilla-dev/flotilla/otel"

// The attributes of the spans.
const (
	AttrTaskID      = attribute.Key("flotilla.task.id")
	AttrKind        = attribute.Key("flotilla.task.kind")
	AttrKey         = attribute.Key("flotilla.task.key")
	AttrAttempt     = attribute.Key("flotilla.attempt")
	AttrMaxAttempts = attribute.Key("flotilla.max_attempts")
	AttrBucket      = attribute.Key("flotilla.bucket")
	AttrEpoch       = attribute.Key("flotilla.epoch")
	AttrTasks       = attribute.Key("flotilla.tasks")
	AttrPaused      = attribute.Key("flotilla.paused")
)

// Option configures SubmitMiddleware and Middleware.
type Option func(*config)

type config struct {
	provider   trace.TracerProvider
	propagator propagation.TextMapPropagator
}

// WithTracerProvider sets where spans go (default: the global provider,
// read when the middleware is made).
func WithTracerProvider(p trace.TracerProvider) Option {
	return func(c *config) { c.provider = p }
}

// WithPropagator sets how the trace context is written into a task's
// metadata and read back (default: the global propagator).
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(c *config) { c.propagator = p }
}

func newConfig(opts []Option) config {
	c := config{provider: otel.GetTracerProvider(), propagator: otel.GetTextMapPropagator()}
	for _, opt := range opts {
		opt(&c)
	}
	return c
}

// SubmitMiddleware starts a span for every submit of a client
// (flotilla.WithSubmitMiddleware), a child of the span in the submit's
// context, and writes its trace context into each task's metadata.
func SubmitMiddleware(opts ...Option) flotilla.SubmitMiddleware {
	c := newConfig(opts)
	tracer := c.provider.Tracer(ScopeName)
	return func(next flotilla.SubmitFunc) flotilla.SubmitFunc {
		return func(ctx context.Context, rs []flotilla.TaskRequest) ([]*task.Task, error) {
			kind := ""
			if len(rs) > 0 {
				kind = rs[0].Kind
			}
			for _, r := range rs {
				if r.Kind != kind {
					kind = "" // a batch of several kinds
				}
			}
			name := "submit"
			if kind != "" {
				name += " " + kind
			}
			attrs := []attribute.KeyValue{AttrTasks.Int(len(rs))}
			if kind != "" {
				attrs = append(attrs, AttrKind.String(kind))
			}
			ctx, span := tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
			defer span.End()

			carried := make([]flotilla.TaskRequest, len(rs))
			for i, r := range rs {
				md := make(propagation.MapCarrier, len(r.Metadata)+2)
				for k, v := range r.Metadata {
					md[k] = v
				}
				c.propagator.Inject(ctx, md)
				r.Metadata = md
				carried[i] = r
			}
			out, err := next(ctx, carried)
			if err != nil {
				span.RecordError(err)
				span.SetStatus(codes.Error, err.Error())
				return out, err
			}
			if len(out) == 1 {
				span.SetAttributes(AttrTaskID.Int64(out[0].ID), AttrBucket.Int(out[0].Bucket))
			}
			return out, nil
		}
	}
}

// Middleware starts a span for every attempt the node runs
// (node.Config.Middleware): a child of the span of the submit that created
// the task, found in its metadata, or of the span in the attempt's context
// for a task that carries none (a schedule's, a pipeline step's). The
// handler's context carries the span, so that what the handler traces is
// its child.
func Middleware(opts ...Option) node.Middleware {
	c := newConfig(opts)
	tracer := c.provider.Tracer(ScopeName)
	return func(next node.Handler) node.Handler {
		return func(ctx context.Context, t *task.Task) error {
			if len(t.Metadata) > 0 {
				ctx = c.propagator.Extract(ctx, propagation.MapCarrier(t.Metadata))
			}
			ctx, span := tracer.Start(ctx, "run "+t.Kind, trace.WithSpanKind(trace.SpanKindConsumer),
				trace.WithAttributes(
					AttrTaskID.Int64(t.ID), AttrKind.String(t.Kind), AttrKey.String(t.Key),
					AttrAttempt.Int(t.Attempt), AttrMaxAttempts.Int(t.MaxAttempts),
					AttrBucket.Int(t.Bucket), AttrEpoch.Int64(t.Epoch),
				))
			defer func() {
				if r := recover(); r != nil {
					span.SetStatus(codes.Error, fmt.Sprint("handler panicked: ", r))
					span.End()
					panic(r) // the node's Recover makes it the attempt's error
				}
				span.End()
			}()
			err := next(ctx, t)
			switch {
			case err == nil:
			case errors.Is(err, task.ErrPaused):
				span.SetAttributes(AttrPaused.Bool(true))
			default:
				span.RecordError(err)
				span.SetStatus(codes.Error, err.Error())
			}
			return err
		}
	}
}
