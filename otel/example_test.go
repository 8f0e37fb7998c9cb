package otel_test

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/node"
	flotillaotel "github.com/flotilla-dev/flotilla/otel"
	"github.com/flotilla-dev/flotilla/store/memory"
)

type Welcome struct {
	To string `json:"to"`
}

func (Welcome) Kind() string { return "welcome" }

// exampleFleet runs a client and a node on a memory store, both traced with
// opts, and returns the client and what stops them.
func exampleFleet(opts ...flotillaotel.Option) (*flotilla.Client, func()) {
	ctx := context.Background()
	s := memory.New()
	if _, err := s.Migrate(ctx, 16); err != nil {
		panic(err)
	}
	client, err := flotilla.NewClient(ctx, s, flotilla.WithSubmitMiddleware(flotillaotel.SubmitMiddleware(opts...)))
	if err != nil {
		panic(err)
	}
	n, err := node.New(s, node.Config{AllBuckets: true, Middleware: []node.Middleware{flotillaotel.Middleware(opts...)}})
	if err != nil {
		panic(err)
	}
	err = flotilla.Handle(n, func(ctx context.Context, job *flotilla.Job[Welcome]) (struct{}, error) {
		return struct{}{}, nil
	})
	if err != nil {
		panic(err)
	}
	if err := n.Start(ctx); err != nil {
		panic(err)
	}
	return client, func() { _ = n.Shutdown(ctx); s.Close() }
}

// The client's submits and the node's attempts are traced: the attempt's
// span is a child of the submit's, which is a child of the request that
// submitted it.
func ExampleMiddleware() {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	opts := []flotillaotel.Option{flotillaotel.WithTracerProvider(tp), flotillaotel.WithPropagator(propagation.TraceContext{})}
	client, stop := exampleFleet(opts...)
	defer stop()

	ctx, request := tp.Tracer("app").Start(context.Background(), "POST /signup")
	t, err := flotilla.SubmitArgs(ctx, client, Welcome{To: "ada@example.com"})
	if err != nil {
		panic(err)
	}
	request.End()
	if _, err := client.Wait(context.Background(), t.ID); err != nil {
		panic(err)
	}
	byID := map[string]string{}
	for _, s := range spans.Ended() {
		byID[s.SpanContext().SpanID().String()] = s.Name()
	}
	for _, s := range spans.Ended() {
		parent := byID[s.Parent().SpanID().String()]
		fmt.Printf("%s (child of %q)\n", s.Name(), parent)
	}
	// Output:
	// submit welcome (child of "POST /signup")
	// POST /signup (child of "")
	// run welcome (child of "submit welcome")
}

// SubmitMiddleware keeps the submit's trace context in the task's metadata.
func ExampleSubmitMiddleware() {
	tp := sdktrace.NewTracerProvider()
	client, stop := exampleFleet(flotillaotel.WithTracerProvider(tp), flotillaotel.WithPropagator(propagation.TraceContext{}))
	defer stop()
	t, err := flotilla.SubmitArgs(context.Background(), client, Welcome{To: "ada@example.com"})
	if err != nil {
		panic(err)
	}
	fmt.Println(len(t.Metadata["traceparent"]))
	// Output:
	// 55
}

// WithTracerProvider sends the spans to a provider other than the global
// one.
func ExampleWithTracerProvider() {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	client, stop := exampleFleet(flotillaotel.WithTracerProvider(tp))
	defer stop()
	if _, err := flotilla.SubmitArgs(context.Background(), client, Welcome{}); err != nil {
		panic(err)
	}
	fmt.Println(spans.Ended()[0].InstrumentationScope().Name)
	// Output:
	// github.com/flotilla-dev/flotilla/otel
}

// WithPropagator sets how the trace context is written into a task's
// metadata: W3C trace context and baggage here.
func ExampleWithPropagator() {
	prop := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	client, stop := exampleFleet(flotillaotel.WithTracerProvider(sdktrace.NewTracerProvider()), flotillaotel.WithPropagator(prop))
	defer stop()
	t, err := flotilla.SubmitArgs(context.Background(), client, Welcome{})
	if err != nil {
		panic(err)
	}
	_, ok := t.Metadata["traceparent"]
	fmt.Println(ok)
	// Output:
	// true
}

// An Option configures both middleware alike: give the same ones to the
// client and to the node.
func ExampleOption() {
	opts := []flotillaotel.Option{
		flotillaotel.WithTracerProvider(sdktrace.NewTracerProvider()),
		flotillaotel.WithPropagator(propagation.TraceContext{}),
	}
	_ = flotilla.WithSubmitMiddleware(flotillaotel.SubmitMiddleware(opts...))
	_ = node.Config{Middleware: []node.Middleware{flotillaotel.Middleware(opts...)}}
	fmt.Println(len(opts), "options")
	// Output:
	// 2 options
}
