package flotilla_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/flotillatest"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// request is NewRequest for the examples of one option.
func request(opts ...flotilla.SubmitOption) flotilla.TaskRequest {
	r, err := flotilla.NewRequest(Email{To: "ada@example.com"}, opts...)
	if err != nil {
		panic(err)
	}
	return r
}

// A SubmitOption sets a field of the task, or relaxes a check of the
// submit; the same options go to every submit.
func ExampleSubmitOption() {
	opts := []flotilla.SubmitOption{flotilla.WithKey("user-42"), flotilla.WithPriority(1)}
	r := request(append(opts, flotilla.WithPriority(9))...) // a later option wins
	fmt.Println(r.Key, r.Priority)
	// Output:
	// user-42 9
}

// WithKey picks the task's bucket: the tasks of one key are claimed by one
// node, in priority and submit order.
func ExampleWithKey() {
	fmt.Println(request(flotilla.WithKey("user-42")).Key)
	// Output:
	// user-42
}

// WithPriority: higher runs first.
func ExampleWithPriority() {
	fmt.Println(request(flotilla.WithPriority(10)).Priority)
	// Output:
	// 10
}

// WithMaxAttempts: how many attempts before the task fails.
func ExampleWithMaxAttempts() {
	fmt.Println(request(flotilla.WithMaxAttempts(5)).MaxAttempts)
	// Output:
	// 5
}

// WithRunAt: not before this time.
func ExampleWithRunAt() {
	at := time.Date(2030, 1, 1, 9, 0, 0, 0, time.UTC)
	fmt.Println(request(flotilla.WithRunAt(at)).RunAt)
	// Output:
	// 2030-01-01 09:00:00 +0000 UTC
}

// WithDelay: not before this long from the database's now.
func ExampleWithDelay() {
	fmt.Println(request(flotilla.WithDelay(15 * time.Minute)).Delay)
	// Output:
	// 15m0s
}

// WithTimeout bounds each attempt.
func ExampleWithTimeout() {
	fmt.Println(request(flotilla.WithTimeout(30 * time.Second)).Timeout)
	// Output:
	// 30s
}

// WithUniqueKey refuses a second task of the key while the first is
// unfinished.
func ExampleWithUniqueKey() {
	fmt.Println(request(flotilla.WithUniqueKey("welcome-user-42")).UniqueKey)
	// Output:
	// welcome-user-42
}

// WithLimitKey counts the task under a per-key limit's key, here its
// customer's, and routes it by that key.
func ExampleWithLimitKey() {
	fmt.Println(request(flotilla.WithKey("report-7"), flotilla.WithLimitKey("customer-3")).RoutingKey())
	// Output:
	// customer-3
}

// WithResources: what a node must have free to start the task.
func ExampleWithResources() {
	fmt.Println(request(flotilla.WithResources(store.Resources{"gpu": 1})).Resources)
	// Output:
	// gpu=1
}

// WithMetadata adds entries to the task's metadata, apart from its
// payload.
func ExampleWithMetadata() {
	r := request(flotilla.WithMetadata(map[string]string{"request": "req-7"}),
		flotilla.WithMetadata(map[string]string{"tenant": "acme"}))
	fmt.Println(r.Metadata)
	// Output:
	// map[request:req-7 tenant:acme]
}

// A MigrateOption configures Migrate.
func ExampleMigrateOption() {
	var opts []flotilla.MigrateOption
	opts = append(opts, flotilla.WithNumBuckets(128))
	fmt.Println(len(opts), "option")
	// Output:
	// 1 option
}

// A ClientOption configures a Client: Connect and NewClient take them.
func ExampleClientOption() {
	var opts []flotilla.ClientOption
	opts = append(opts, flotilla.WithSubmitMiddleware(func(next flotilla.SubmitFunc) flotilla.SubmitFunc { return next }))
	ctx := context.Background()
	fleet, done := exampleFleet(nil)
	defer done()
	client, err := flotilla.Connect(ctx, fleet.DSN, opts...)
	if err != nil {
		panic(err)
	}
	defer client.Close()
	fmt.Println(client.Policy().Count(), "buckets")
	// Output:
	// 16 buckets
}

// A SubmitFunc creates tasks: the rest of a submit, as a middleware sees
// it.
func ExampleSubmitFunc() {
	refuseWeekend := func(next flotilla.SubmitFunc) flotilla.SubmitFunc {
		return func(ctx context.Context, rs []flotilla.TaskRequest) ([]*task.Task, error) {
			for _, r := range rs {
				if r.Kind == "report" && r.RunAt.Weekday() == time.Sunday {
					return nil, errors.New("no reports on Sundays")
				}
			}
			return next(ctx, rs)
		}
	}
	var created flotilla.SubmitFunc = func(ctx context.Context, rs []flotilla.TaskRequest) ([]*task.Task, error) {
		return []*task.Task{{ID: 1, Kind: rs[0].Kind}}, nil // a stand-in for the store
	}
	sunday := time.Date(2030, 1, 6, 9, 0, 0, 0, time.UTC)
	_, err := refuseWeekend(created)(context.Background(), []flotilla.TaskRequest{{Kind: "report", RunAt: sunday}})
	fmt.Println(err)
	// Output:
	// no reports on Sundays
}

// Import is the task type of the Job examples: rows to import, in a
// handler that saves its progress and can be paused.
type Import struct {
	Rows int `json:"rows"`
}

func (Import) Kind() string { return "import" }

type importProgress struct {
	NextRow int `json:"next_row"`
}

func importRows(ctx context.Context, job *flotilla.Job[Import]) (int, error) {
	var p importProgress
	if _, err := job.Progress(&p); err != nil {
		return 0, task.NoRetry(err)
	}
	for row := p.NextRow; row < job.Args.Rows; row++ {
		if err := job.SaveProgress(ctx, importProgress{NextRow: row + 1}); err != nil {
			return 0, err
		}
		if err := job.Checkpoint(ctx); err != nil {
			return 0, err // task.ErrPaused: the progress is saved
		}
	}
	return job.Args.Rows - p.NextRow, nil // rows this attempt imported
}

// A Job is one attempt of a task, with its arguments decoded.
func ExampleJob() {
	t := &exampleT{}
	defer t.Done()
	imported, err := flotillatest.Work(t, func(ctx context.Context, job *flotilla.Job[Import]) (string, error) {
		return fmt.Sprintf("task %d (%s), attempt %d of %d: %d rows", job.ID, job.Kind(), job.Attempt, job.MaxAttempts,
			job.Args.Rows), nil
	}, Import{Rows: 3})
	fmt.Println(imported, err)
	// Output:
	// task 1 (import), attempt 1 of 3: 3 rows <nil>
}

// Kind is the task's kind, its type's.
func ExampleJob_Kind() {
	t := &exampleT{}
	defer t.Done()
	kind, _ := flotillatest.Work(t, func(ctx context.Context, job *flotilla.Job[Import]) (string, error) {
		return job.Kind(), nil
	}, Import{})
	fmt.Println(kind)
	// Output:
	// import
}

// SaveProgress records how far an attempt got; the next one starts there.
func ExampleJob_SaveProgress() {
	t := &exampleT{}
	defer t.Done()
	var rec flotillatest.Recorded
	_, err := flotillatest.Work(t, importRows, Import{Rows: 3}, flotillatest.WithRecorder(&rec))
	fmt.Println(err)
	for _, p := range rec.Progress {
		fmt.Println(string(p))
	}
	// Output:
	// <nil>
	// {"next_row":1}
	// {"next_row":2}
	// {"next_row":3}
}

// Progress reads what an earlier attempt saved.
func ExampleJob_Progress() {
	t := &exampleT{}
	defer t.Done()
	imported, err := flotillatest.Work(t, importRows, Import{Rows: 10},
		flotillatest.WithProgress(importProgress{NextRow: 7}), flotillatest.WithAttempt(2, 3))
	fmt.Println(imported, "rows imported by attempt 2", err)
	// Output:
	// 3 rows imported by attempt 2 <nil>
}

// Checkpoint answers task.ErrPaused once a pause was requested.
func ExampleJob_Checkpoint() {
	t := &exampleT{}
	defer t.Done()
	var rec flotillatest.Recorded
	_, err := flotillatest.Work(t, importRows, Import{Rows: 10}, flotillatest.WithPauseRequested(), flotillatest.WithRecorder(&rec))
	fmt.Println(errors.Is(err, task.ErrPaused), string(rec.Progress[len(rec.Progress)-1]))
	// Output:
	// true {"next_row":1}
}

// FencingToken grows with every attempt of the task: stored with a side
// effect, it lets a write refuse one from a superseded attempt.
func ExampleJob_FencingToken() {
	t := &exampleT{}
	defer t.Done()
	token, _ := flotillatest.Work(t, func(ctx context.Context, job *flotilla.Job[Import]) (int64, error) {
		return job.FencingToken(), nil
	}, Import{})
	fmt.Println(token > 0)
	// Output:
	// true
}

// Summary is a pipeline step that reads its dependencies' results.
type Summary struct{}

func (Summary) Kind() string { return "summary" }

// DependencyResult decodes the result of one of the step's dependencies.
func ExampleJob_DependencyResult() {
	t := &exampleT{}
	defer t.Done()
	total, err := flotillatest.Work(t, func(ctx context.Context, job *flotilla.Job[Summary]) (int, error) {
		var eu, us Rows
		if err := errors.Join(job.DependencyResult(ctx, "extract-eu", &eu), job.DependencyResult(ctx, "extract-us", &us)); err != nil {
			return 0, err
		}
		return eu.Rows + us.Rows, nil
	}, Summary{}, flotillatest.WithDependencyResults("summary", map[string]any{
		"extract-eu": Rows{Rows: 20}, "extract-us": Rows{Rows: 22},
	}))
	fmt.Println(total, err)
	// Output:
	// 42 <nil>
}

// DependencyResults returns every dependency's result, by step name: a
// fan-in over dependencies it does not name.
func ExampleJob_DependencyResults() {
	t := &exampleT{}
	defer t.Done()
	n, err := flotillatest.Work(t, func(ctx context.Context, job *flotilla.Job[Summary]) (int, error) {
		results, err := job.DependencyResults(ctx)
		return len(results), err
	}, Summary{}, flotillatest.WithDependencyResults("summary", map[string]any{"a": 1, "b": 2, "c": nil}))
	fmt.Println(n, "dependencies", err)
	// Output:
	// 3 dependencies <nil>
}

// Append adds steps to the pipeline, written when the attempt's outcome is.
func ExampleJob_Append() {
	t := &exampleT{}
	defer t.Done()
	var rec flotillatest.Recorded
	_, err := flotillatest.Work(t, func(ctx context.Context, job *flotilla.Job[Summary]) (struct{}, error) {
		report, err := flotilla.NewStep("report", Email{To: "ops@example.com"})
		if err != nil {
			return struct{}{}, err
		}
		return struct{}{}, job.Append(report)
	}, Summary{}, flotillatest.WithDependencyResults("summary", nil), flotillatest.WithRecorder(&rec))
	fmt.Println(rec.Appended[0].Name, rec.Appended[0].Kind, err)
	// Output:
	// report email <nil>
}

// Metadata is what travels with the task apart from its payload.
func ExampleJob_Metadata() {
	t := &exampleT{}
	defer t.Done()
	id, _ := flotillatest.Work(t, func(ctx context.Context, job *flotilla.Job[Import]) (string, error) {
		return job.Metadata()["request"], nil
	}, Import{}, flotillatest.WithMetadata(map[string]string{"request": "req-7"}))
	fmt.Println(id)
	// Output:
	// req-7
}

// Task is the task under the job, for what the job does not show.
func ExampleJob_Task() {
	t := &exampleT{}
	defer t.Done()
	step, _ := flotillatest.Work(t, func(ctx context.Context, job *flotilla.Job[Summary]) (string, error) {
		return job.Task().Step, nil
	}, Summary{}, flotillatest.WithDependencyResults("summary", nil))
	fmt.Println(step)
	// Output:
	// summary
}
