package otel_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/node"
	flotillaotel "github.com/flotilla-dev/flotilla/otel"
	"github.com/flotilla-dev/flotilla/store/memory"
	"github.com/flotilla-dev/flotilla/task"
)

func TestMain(m *testing.M) { testdb.VerifyNoLeaks(m) }

type resize struct {
	Image string `json:"image"`
	Fail  bool   `json:"fail,omitempty"`
}

func (resize) Kind() string { return "resize" }

// tracedFleet is a client and a node on one store, both traced into spans.
type tracedFleet struct {
	ctx    context.Context
	client *flotilla.Client
	spans  *tracetest.InMemoryExporter
	tracer trace.Tracer
}

// openTraced runs a traced node over a client made by connect, which also
// returns what to close after the node.
func openTraced(t *testing.T, connect func(opts ...flotilla.ClientOption) (*flotilla.Client, error)) *tracedFleet {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	opts := []flotillaotel.Option{
		flotillaotel.WithTracerProvider(tp), flotillaotel.WithPropagator(propagation.TraceContext{}),
	}
	client, err := connect(flotilla.WithSubmitMiddleware(flotillaotel.SubmitMiddleware(opts...)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	n, err := node.New(client.Store(), node.Config{
		AllBuckets: true, PollInterval: 20 * time.Millisecond, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond,
		Middleware: []node.Middleware{flotillaotel.Middleware(opts...)},
	})
	if err != nil {
		t.Fatal(err)
	}
	err = flotilla.Handle(n, func(_ context.Context, job *flotilla.Job[resize]) (struct{}, error) {
		if job.Args.Fail {
			return struct{}{}, errors.New("cannot read " + job.Args.Image)
		}
		return struct{}{}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Shutdown(context.Background()) })
	return &tracedFleet{ctx: ctx, client: client, spans: spans, tracer: tp.Tracer("test")}
}

// TestAnAttemptsSpanIsAChildOfItsSubmitsOnEveryStore submits a task inside
// a span of the submitter's and follows its trace: the submit's span is a
// child of that span, and each attempt's span a child of the submit's, with
// the attempt, bucket and epoch it ran under.
func TestAnAttemptsSpanIsAChildOfItsSubmitsOnEveryStore(t *testing.T) {
	stores := map[string]func(t *testing.T) func(...flotilla.ClientOption) (*flotilla.Client, error){
		"memory": func(t *testing.T) func(...flotilla.ClientOption) (*flotilla.Client, error) {
			s := memory.New()
			t.Cleanup(s.Close)
			if _, err := s.Migrate(context.Background(), 8); err != nil {
				t.Fatal(err)
			}
			return func(opts ...flotilla.ClientOption) (*flotilla.Client, error) {
				return flotilla.NewClient(context.Background(), s, opts...)
			}
		},
		"sqlite": func(t *testing.T) func(...flotilla.ClientOption) (*flotilla.Client, error) {
			return migrated(t, "sqlite:"+filepath.Join(t.TempDir(), "fleet.db"))
		},
		"postgres": func(t *testing.T) func(...flotilla.ClientOption) (*flotilla.Client, error) {
			return migrated(t, testdb.New(t))
		},
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			f := openTraced(t, open(t))
			ctx, request := f.tracer.Start(f.ctx, "POST /images")
			ok, err := flotilla.SubmitArgs(ctx, f.client, resize{Image: "cat.png"}, flotilla.WithKey("cat"))
			if err != nil {
				t.Fatal(err)
			}
			bad, err := flotilla.SubmitArgs(ctx, f.client, resize{Image: "dog.png", Fail: true},
				flotilla.WithKey("dog"), flotilla.WithMaxAttempts(2))
			if err != nil {
				t.Fatal(err)
			}
			request.End()
			if ok.Metadata["traceparent"] == "" {
				t.Errorf("the submitted task carries no trace context: metadata %v", ok.Metadata)
			}
			okDone, err := f.client.Wait(f.ctx, ok.ID)
			if err != nil || okDone.Status != task.Succeeded {
				t.Fatalf("task %d: %+v, %v; want succeeded", ok.ID, okDone, err)
			}
			badDone, err := f.client.Wait(f.ctx, bad.ID)
			if err != nil || badDone.Status != task.Failed {
				t.Fatalf("task %d: %+v, %v; want failed", bad.ID, badDone, err)
			}

			spans := f.spans.GetSpans()
			root := find(t, spans, "POST /images")
			submits := findAll(spans, "submit resize")
			if len(submits) != 2 {
				t.Fatalf("%d submit spans, want 2: %v", len(submits), names(spans))
			}
			for _, s := range submits {
				if s.Parent.SpanID() != root.SpanContext.SpanID() || s.SpanKind != trace.SpanKindProducer {
					t.Errorf("submit span %v: parent %v, kind %v; want a producer child of the request's span",
						s.Attributes, s.Parent.SpanID(), s.SpanKind)
				}
			}
			okSubmit := find(t, submits, "submit resize", attribute.Int64("flotilla.task.id", ok.ID))
			run := find(t, spans, "run resize", attribute.Int64("flotilla.task.id", ok.ID))
			if run.Parent.SpanID() != okSubmit.SpanContext.SpanID() || run.SpanContext.TraceID() != root.SpanContext.TraceID() ||
				!run.Parent.IsRemote() || run.SpanKind != trace.SpanKindConsumer {
				t.Errorf("the attempt's span: trace %v, parent %v (remote %v), kind %v; want a consumer child of submit span %v in trace %v",
					run.SpanContext.TraceID(), run.Parent.SpanID(), run.Parent.IsRemote(), run.SpanKind,
					okSubmit.SpanContext.SpanID(), root.SpanContext.TraceID())
			}
			for _, want := range []attribute.KeyValue{
				attribute.Int("flotilla.attempt", 1), attribute.Int("flotilla.bucket", okDone.Bucket),
				attribute.Int64("flotilla.epoch", okDone.Epoch), attribute.String("flotilla.task.kind", "resize"),
				attribute.String("flotilla.task.key", "cat"),
			} {
				if !has(run.Attributes, want) {
					t.Errorf("the attempt's span lacks %v: %v", want, run.Attributes)
				}
			}
			if run.Status.Code == codes.Error {
				t.Errorf("a successful attempt's span is marked failed: %v", run.Status)
			}

			badSubmit := find(t, submits, "submit resize", attribute.Int64("flotilla.task.id", bad.ID))
			for attempt := 1; attempt <= 2; attempt++ {
				s := find(t, spans, "run resize", attribute.Int64("flotilla.task.id", bad.ID), attribute.Int("flotilla.attempt", attempt))
				if s.Parent.SpanID() != badSubmit.SpanContext.SpanID() || s.Status.Code != codes.Error ||
					s.Status.Description != "cannot read dog.png" {
					t.Errorf("attempt %d of the failing task: parent %v, status %v; want a failed child of its submit",
						attempt, s.Parent.SpanID(), s.Status)
				}
			}
		})
	}
}

// A submit the store refuses is a failed span, and nothing is traced
// beyond it.
func TestARefusedSubmitIsAFailedSpan(t *testing.T) {
	f := openTraced(t, migrated(t, "sqlite:"+filepath.Join(t.TempDir(), "fleet.db")))
	_, err := flotilla.SubmitArgs(f.ctx, f.client, resize{Image: "x"}, flotilla.WithMaxAttempts(-1))
	if err == nil {
		t.Fatal("a submit with max attempts -1 was accepted")
	}
	s := find(t, f.spans.GetSpans(), "submit resize")
	if s.Status.Code != codes.Error || len(s.Events) == 0 {
		t.Errorf("the refused submit's span: status %v, %d events; want failed with the error recorded", s.Status, len(s.Events))
	}
}

func migrated(t *testing.T, dsn string) func(...flotilla.ClientOption) (*flotilla.Client, error) {
	t.Helper()
	if err := flotilla.Migrate(context.Background(), dsn, flotilla.WithNumBuckets(8)); err != nil {
		t.Fatal(err)
	}
	return func(opts ...flotilla.ClientOption) (*flotilla.Client, error) {
		return flotilla.Connect(context.Background(), dsn, opts...)
	}
}

func findAll(spans tracetest.SpanStubs, name string, attrs ...attribute.KeyValue) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, s := range spans {
		if s.Name != name {
			continue
		}
		match := true
		for _, a := range attrs {
			match = match && has(s.Attributes, a)
		}
		if match {
			out = append(out, s)
		}
	}
	return out
}

// find is the one span of name with attrs, or fails the test.
func find(t *testing.T, spans tracetest.SpanStubs, name string, attrs ...attribute.KeyValue) tracetest.SpanStub {
	t.Helper()
	found := findAll(spans, name, attrs...)
	if len(found) != 1 {
		t.Fatalf("%d spans %q with %v, want 1; spans: %v", len(found), name, attrs, names(spans))
	}
	return found[0]
}

func has(attrs []attribute.KeyValue, want attribute.KeyValue) bool {
	for _, a := range attrs {
		if a.Key == want.Key && a.Value == want.Value {
			return true
		}
	}
	return false
}

func names(spans tracetest.SpanStubs) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Name
	}
	return out
}
