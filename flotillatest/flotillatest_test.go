package flotillatest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/flotillatest"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/task"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type copyFiles struct {
	From  string   `json:"from"`
	Files []string `json:"files"`
}

func (copyFiles) Kind() string { return "copy" }

type copied struct {
	Done int `json:"done"`
}

// copyHandler copies files from where an earlier attempt left off, saving
// its progress and stopping at a pause.
func copyHandler(ctx context.Context, job *flotilla.Job[copyFiles]) (copied, error) {
	var p copied
	if _, err := job.Progress(&p); err != nil {
		return copied{}, err
	}
	if job.Args.From == "" {
		return copied{}, task.NoRetry(errors.New("no source"))
	}
	for ; p.Done < len(job.Args.Files); p.Done++ {
		if job.Args.Files[p.Done] == "panic" {
			panic("cannot copy " + job.Args.Files[p.Done])
		}
		if err := job.SaveProgress(ctx, copied{Done: p.Done + 1}); err != nil {
			return copied{}, err
		}
		if err := job.Checkpoint(ctx); err != nil {
			return copied{}, err
		}
	}
	return p, nil
}

func TestWorkRunsAHandlerAsANodeWould(t *testing.T) {
	args := copyFiles{From: "s3://a", Files: []string{"1", "2", "3"}}
	var rec flotillatest.Recorded
	got, err := flotillatest.Work(t, copyHandler, args, flotillatest.WithRecorder(&rec))
	if err != nil || got.Done != 3 {
		t.Fatalf("Work = %+v, %v; want 3 done", got, err)
	}
	if len(rec.Progress) != 3 || string(rec.Progress[2]) != `{"done":3}` || string(rec.Task.Result) != `{"done":3}` {
		t.Errorf("recorded progress %s and result %s", rec.Progress, rec.Task.Result)
	}

	got, err = flotillatest.Work(t, copyHandler, args, flotillatest.WithProgress(copied{Done: 2}), flotillatest.WithAttempt(2, 3))
	if err != nil || got.Done != 3 {
		t.Errorf("a second attempt from saved progress: %+v, %v", got, err)
	}

	_, err = flotillatest.Work(t, copyHandler, args, flotillatest.WithPauseRequested(), flotillatest.WithRecorder(&rec))
	if !errors.Is(err, task.ErrPaused) || len(rec.Progress) != 1 {
		t.Errorf("under a pause request: %v after %d saves, want task.ErrPaused after the first", err, len(rec.Progress))
	}

	_, err = flotillatest.Work(t, copyHandler, copyFiles{Files: []string{"1"}})
	if !errors.Is(err, task.ErrNoRetry) {
		t.Errorf("bad input: %v, want an error wrapped in task.NoRetry", err)
	}

	_, err = flotillatest.Work(t, copyHandler, copyFiles{From: "s3://a", Files: []string{"panic"}})
	var panicked *node.PanicError
	if !errors.As(err, &panicked) || !strings.Contains(err.Error(), "cannot copy panic") {
		t.Errorf("a panic: %v, want a *node.PanicError", err)
	}
}

type sum struct{}

func (sum) Kind() string { return "sum" }

func TestWorkGivesAStepItsDependenciesAndRecordsWhatItAppends(t *testing.T) {
	handler := func(ctx context.Context, job *flotilla.Job[sum]) (int, error) {
		var a, b int
		if err := job.DependencyResult(ctx, "a", &a); err != nil {
			return 0, err
		}
		if err := job.DependencyResult(ctx, "b", &b); err != nil {
			return 0, err
		}
		if err := job.Append(task.Step{Name: "report", Kind: "report"}); err != nil {
			return 0, err
		}
		return a + b, nil
	}
	var rec flotillatest.Recorded
	got, err := flotillatest.Work(t, handler, sum{},
		flotillatest.WithDependencyResults("total", map[string]any{"a": 2, "b": 40}), flotillatest.WithRecorder(&rec))
	if err != nil || got != 42 {
		t.Fatalf("Work = %d, %v; want 42", got, err)
	}
	if len(rec.Appended) != 1 || rec.Appended[0].Name != "report" {
		t.Errorf("appended %+v, want the report step", rec.Appended)
	}
	_, err = flotillatest.Work(t, handler, sum{}, flotillatest.WithDependencyResults("total", map[string]any{"a": 2}))
	if err == nil || !strings.Contains(err.Error(), `step "b" is not a dependency of step "total"`) {
		t.Errorf("a missing dependency: %v", err)
	}
	if _, err := flotillatest.Work(t, handler, sum{}); !errors.Is(err, task.ErrNotInPipeline) {
		t.Errorf("a step run outside a pipeline: %v, want task.ErrNotInPipeline", err)
	}
}

func TestWorkRunsTheMiddlewareGiven(t *testing.T) {
	var saw string
	mw := func(next node.Handler) node.Handler {
		return func(ctx context.Context, t *task.Task) error {
			saw = fmt.Sprintf("%s task %d attempt %d key %s metadata %v", t.Kind, t.ID, t.Attempt, t.Key, t.Metadata)
			return next(ctx, t)
		}
	}
	_, err := flotillatest.Work(t, copyHandler, copyFiles{From: "x"}, flotillatest.WithMiddleware(mw),
		flotillatest.WithKey("k"), flotillatest.WithMetadata(map[string]string{"request": "7"}))
	if err != nil || saw != "copy task 1 attempt 1 key k metadata map[request:7]" {
		t.Errorf("the middleware saw %q (%v)", saw, err)
	}
}

type email struct {
	To string `json:"to"`
}

func (email) Kind() string { return "email" }

func TestAFleetRunsTasksAndIsGoneAfterTheTest(t *testing.T) {
	var dir string
	t.Run("fleet", func(t *testing.T) {
		sent := make(chan string, 2)
		fleet := flotillatest.NewFleet(t, func(n *node.Node) error {
			return flotilla.Handle(n, func(_ context.Context, job *flotilla.Job[email]) (string, error) {
				sent <- job.Args.To
				return "sent to " + job.Args.To, nil
			})
		})
		dir = filepath.Dir(strings.TrimPrefix(fleet.DSN, "sqlite:"))
		tk, err := flotilla.SubmitArgs(t.Context(), fleet.Client, email{To: "ada@example.com"}, flotilla.WithKey("ada"))
		if err != nil {
			t.Fatal(err)
		}
		done := fleet.Wait(tk.ID)
		if got, err := flotilla.ResultOf[string](done); err != nil || got != "sent to ada@example.com" {
			t.Errorf("result %q, %v", got, err)
		}
		if got := <-sent; got != "ada@example.com" {
			t.Errorf("sent to %q", got)
		}
	})
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the fleet's directory %s is still there after its test: %v", dir, err)
	}
}

func TestRequireSubmittedFindsOneTaskOrSaysWhatThereIs(t *testing.T) {
	fleet := flotillatest.NewFleet(t, nil)
	ctx := t.Context()
	for _, to := range []string{"ada@example.com", "bob@example.com"} {
		_, err := flotilla.SubmitArgs(ctx, fleet.Client, email{To: to}, flotilla.WithKey(to), flotilla.WithPriority(5),
			flotilla.AllowUnknownKind())
		if err != nil {
			t.Fatal(err)
		}
	}
	got := flotillatest.RequireSubmitted[email](t, fleet.Client, flotillatest.Key("bob@example.com"), flotillatest.Priority(5))
	if got.Args.To != "bob@example.com" || got.Task.Status != task.Queued {
		t.Errorf("found %+v", got)
	}
	flotillatest.RequireSubmitted[email](t, fleet.Client, flotillatest.Args(email{To: "ada@example.com"}))
	flotillatest.RequireNotSubmitted[email](t, fleet.Client, flotillatest.Key("eve@example.com"))

	for _, c := range []struct {
		check func(t testing.TB)
		want  []string
	}{
		{func(t testing.TB) { flotillatest.RequireSubmitted[email](t, fleet.Client, flotillatest.Priority(9)) },
			[]string{`want 1 task of kind "email" with priority 9, found 0`, `key "ada@example.com", queued, priority 5`}},
		{func(t testing.TB) { flotillatest.RequireSubmitted[email](t, fleet.Client) },
			[]string{`want 1 task of kind "email", found 2`}},
		{func(t testing.TB) {
			flotillatest.RequireNotSubmitted[email](t, fleet.Client, flotillatest.Key("ada@example.com"))
		},
			[]string{`want no task of kind "email" with key "ada@example.com", found 1`}},
		{func(t testing.TB) { flotillatest.RequireSubmitted[copyFiles](t, fleet.Client) },
			[]string{`no task of kind "copy" was submitted`}},
	} {
		failure := fails(t, c.check)
		for _, w := range c.want {
			if !strings.Contains(failure, w) {
				t.Errorf("the failure %q lacks %q", failure, w)
			}
		}
	}
}

// recorder is a testing.TB whose Fatalf records the failure and ends the
// goroutine, as the real one does.
type recorder struct {
	testing.TB
	mu      sync.Mutex
	failure string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.mu.Lock()
	r.failure = fmt.Sprintf(format, args...)
	r.mu.Unlock()
	runtime.Goexit()
}

// fails runs check with a recorder, and returns the failure it reported
// (the test fails if it reported none).
func fails(t *testing.T, check func(t testing.TB)) string {
	t.Helper()
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		check(r)
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the check did not return")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failure == "" {
		t.Error("the check passed; want it to fail")
	}
	return r.failure
}
