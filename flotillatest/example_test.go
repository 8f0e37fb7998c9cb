package flotillatest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/flotillatest"
	"github.com/flotilla-dev/flotilla/internal/exampletb"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/task"
)

// exampleT stands in for a test's *testing.T, which an example has not: a
// failure panics, and Done runs the clean-ups. In a test, pass t.
type exampleT = exampletb.TB

// Welcome is the task type of the examples, and welcome its handler.
type Welcome struct {
	To string `json:"to"`
}

func (Welcome) Kind() string { return "welcome" }

func welcome(ctx context.Context, job *flotilla.Job[Welcome]) (string, error) {
	if !strings.Contains(job.Args.To, "@") {
		return "", task.NoRetry(fmt.Errorf("%q is no address", job.Args.To))
	}
	return "sent to " + job.Args.To, nil
}

func registerWelcome(n *node.Node) error { return flotilla.Handle(n, welcome) }

// signup is the code under test: it submits a welcome email.
func signup(ctx context.Context, c *flotilla.Client, email string) error {
	_, err := flotilla.SubmitArgs(ctx, c, Welcome{To: email}, flotilla.WithKey(email), flotilla.WithPriority(5))
	return err
}

// Work runs a handler in a test as a node would, without a fleet.
func ExampleWork() {
	t := &exampleT{}
	defer t.Done()
	got, err := flotillatest.Work(t, welcome, Welcome{To: "ada@example.com"})
	fmt.Println(got, err)
	_, err = flotillatest.Work(t, welcome, Welcome{To: "nobody"})
	fmt.Println(errors.Is(err, task.ErrNoRetry), err)
	// Output:
	// sent to ada@example.com <nil>
	// true "nobody" is no address
}

// RequireSubmitted checks what a function submitted, and returns the task
// with its arguments decoded.
func ExampleRequireSubmitted() {
	t := &exampleT{}
	defer t.Done()
	fleet := flotillatest.NewFleet(t, registerWelcome)
	if err := signup(t.Context(), fleet.Client, "ada@example.com"); err != nil {
		panic(err)
	}
	got := flotillatest.RequireSubmitted[Welcome](t, fleet.Client, flotillatest.Key("ada@example.com"))
	fmt.Println(got.Args.To, got.Task.Priority)
	// Output:
	// ada@example.com 5
}

// RequireNotSubmitted checks that nothing was.
func ExampleRequireNotSubmitted() {
	t := &exampleT{}
	defer t.Done()
	fleet := flotillatest.NewFleet(t, nil)
	flotillatest.RequireNotSubmitted[Welcome](t, fleet.Client)
	fmt.Println("nothing submitted")
	// Output:
	// nothing submitted
}

// NewFleet runs a node on a temporary SQLite file, for a test of the whole
// path: the claim, the attempt, the outcome.
func ExampleNewFleet() {
	t := &exampleT{}
	defer t.Done() // in a test, t.Cleanup shuts the fleet down
	fleet := flotillatest.NewFleet(t, registerWelcome)
	tk, err := flotilla.SubmitArgs(t.Context(), fleet.Client, Welcome{To: "ada@example.com"})
	if err != nil {
		panic(err)
	}
	got, err := flotilla.ResultOf[string](fleet.Wait(tk.ID))
	fmt.Println(got, err)
	// Output:
	// sent to ada@example.com <nil>
}

// A Fleet is a client, a node and the file's DSN.
func ExampleFleet() {
	t := &exampleT{}
	defer t.Done()
	fleet := flotillatest.NewFleet(t, nil)
	fmt.Println(fleet.Node.ID(), strings.HasPrefix(fleet.DSN, "sqlite:"), fleet.Client.Policy().Count())
	// Output:
	// flotillatest true 16
}

// Wait waits for a task to end, failing the test if it does not.
func ExampleFleet_Wait() {
	t := &exampleT{}
	defer t.Done()
	fleet := flotillatest.NewFleet(t, registerWelcome)
	tk, _ := flotilla.SubmitArgs(t.Context(), fleet.Client, Welcome{To: "nobody"})
	ended := fleet.Wait(tk.ID)
	fmt.Println(ended.Status, ended.Attempt)
	// Output:
	// failed 1
}

// A FleetOption configures NewFleet.
func ExampleFleetOption() {
	t := &exampleT{}
	defer t.Done()
	opts := []flotillatest.FleetOption{flotillatest.WithNumBuckets(8), flotillatest.WithNodeConfig(node.Config{NodeID: "n1"})}
	fleet := flotillatest.NewFleet(t, nil, opts...)
	fmt.Println(fleet.Node.ID(), fleet.Client.Policy().Count())
	// Output:
	// n1 8
}

// WithNodeConfig starts the node with a configuration of the test's.
func ExampleWithNodeConfig() {
	t := &exampleT{}
	defer t.Done()
	fleet := flotillatest.NewFleet(t, nil, flotillatest.WithNodeConfig(node.Config{NodeID: "tester", Concurrency: 1}))
	fmt.Println(fleet.Node.ID())
	// Output:
	// tester
}

// WithNumBuckets sets the fleet's bucket count.
func ExampleWithNumBuckets() {
	t := &exampleT{}
	defer t.Done()
	fleet := flotillatest.NewFleet(t, nil, flotillatest.WithNumBuckets(4))
	fmt.Println(fleet.Client.Policy().Count())
	// Output:
	// 4
}

// WithClientOptions opens the fleet's client with options, such as a
// submit middleware under test.
func ExampleWithClientOptions() {
	t := &exampleT{}
	defer t.Done()
	var submits int
	count := func(next flotilla.SubmitFunc) flotilla.SubmitFunc {
		return func(ctx context.Context, rs []flotilla.TaskRequest) ([]*task.Task, error) {
			submits++
			return next(ctx, rs)
		}
	}
	fleet := flotillatest.NewFleet(t, nil, flotillatest.WithClientOptions(flotilla.WithSubmitMiddleware(count)))
	_ = signup(t.Context(), fleet.Client, "ada@example.com")
	fmt.Println(submits)
	// Output:
	// 1
}

// Submitted is the task found, with its arguments.
func ExampleSubmitted() {
	t := &exampleT{}
	defer t.Done()
	fleet := flotillatest.NewFleet(t, registerWelcome)
	_ = signup(t.Context(), fleet.Client, "ada@example.com")
	var got *flotillatest.Submitted[Welcome] = flotillatest.RequireSubmitted[Welcome](t, fleet.Client)
	fmt.Println(got.Task.Kind, got.Task.Key, got.Args.To)
	// Output:
	// welcome ada@example.com ada@example.com
}

// RequireOptions narrow the tasks looked for; all must match.
func ExampleRequireOption() {
	t := &exampleT{}
	defer t.Done()
	fleet := flotillatest.NewFleet(t, registerWelcome)
	_ = signup(t.Context(), fleet.Client, "ada@example.com")
	_ = signup(t.Context(), fleet.Client, "bob@example.com")
	opts := []flotillatest.RequireOption{flotillatest.Key("bob@example.com"), flotillatest.Priority(5)}
	fmt.Println(flotillatest.RequireSubmitted[Welcome](t, fleet.Client, opts...).Args.To)
	// Output:
	// bob@example.com
}

// Key keeps the tasks of a key.
func ExampleKey() {
	t := &exampleT{}
	defer t.Done()
	fleet := flotillatest.NewFleet(t, registerWelcome)
	_ = signup(t.Context(), fleet.Client, "ada@example.com")
	fmt.Println(flotillatest.RequireSubmitted[Welcome](t, fleet.Client, flotillatest.Key("ada@example.com")).Task.ID)
	// Output:
	// 1
}

// Priority keeps the tasks of a priority.
func ExamplePriority() {
	t := &exampleT{}
	defer t.Done()
	fleet := flotillatest.NewFleet(t, registerWelcome)
	_ = signup(t.Context(), fleet.Client, "ada@example.com")
	flotillatest.RequireNotSubmitted[Welcome](t, fleet.Client, flotillatest.Priority(0))
	fmt.Println(flotillatest.RequireSubmitted[Welcome](t, fleet.Client, flotillatest.Priority(5)).Task.Priority)
	// Output:
	// 5
}

// MaxAttempts keeps the tasks allowed so many attempts.
func ExampleMaxAttempts() {
	t := &exampleT{}
	defer t.Done()
	fleet := flotillatest.NewFleet(t, nil)
	_, _ = flotilla.SubmitArgs(t.Context(), fleet.Client, Welcome{To: "a@b"}, flotilla.WithMaxAttempts(7), flotilla.AllowUnknownKind())
	fmt.Println(flotillatest.RequireSubmitted[Welcome](t, fleet.Client, flotillatest.MaxAttempts(7)).Task.MaxAttempts)
	// Output:
	// 7
}

// UniqueKey keeps the tasks of a unique key.
func ExampleUniqueKey() {
	t := &exampleT{}
	defer t.Done()
	fleet := flotillatest.NewFleet(t, nil)
	_, _ = flotilla.SubmitArgs(t.Context(), fleet.Client, Welcome{To: "a@b"}, flotilla.WithUniqueKey("welcome-a"), flotilla.AllowUnknownKind())
	fmt.Println(flotillatest.RequireSubmitted[Welcome](t, fleet.Client, flotillatest.UniqueKey("welcome-a")).Task.UniqueKey)
	// Output:
	// welcome-a
}

// Status keeps the tasks in a state.
func ExampleStatus() {
	t := &exampleT{}
	defer t.Done()
	fleet := flotillatest.NewFleet(t, registerWelcome)
	tk, _ := flotilla.SubmitArgs(t.Context(), fleet.Client, Welcome{To: "ada@example.com"})
	fleet.Wait(tk.ID)
	fmt.Println(flotillatest.RequireSubmitted[Welcome](t, fleet.Client, flotillatest.Status(task.Succeeded)).Task.Status)
	// Output:
	// succeeded
}

// Due keeps the tasks due at a time, to the second.
func ExampleDue() {
	t := &exampleT{}
	defer t.Done()
	fleet := flotillatest.NewFleet(t, nil)
	at := time.Now().Add(time.Hour)
	_, _ = flotilla.SubmitArgs(t.Context(), fleet.Client, Welcome{To: "a@b"}, flotilla.WithRunAt(at), flotilla.AllowUnknownKind())
	fmt.Println(flotillatest.RequireSubmitted[Welcome](t, fleet.Client, flotillatest.Due(at)).Task.Status)
	// Output:
	// scheduled
}

// Args keeps the tasks whose arguments equal the value given.
func ExampleArgs() {
	t := &exampleT{}
	defer t.Done()
	fleet := flotillatest.NewFleet(t, registerWelcome)
	_ = signup(t.Context(), fleet.Client, "ada@example.com")
	_ = signup(t.Context(), fleet.Client, "bob@example.com")
	fmt.Println(flotillatest.RequireSubmitted[Welcome](t, fleet.Client, flotillatest.Args(Welcome{To: "bob@example.com"})).Task.ID)
	// Output:
	// 2
}

// A WorkOption gives the attempt what a node would.
func ExampleWorkOption() {
	t := &exampleT{}
	defer t.Done()
	opts := []flotillatest.WorkOption{flotillatest.WithKey("ada"), flotillatest.WithAttempt(3, 3)}
	last, _ := flotillatest.Work(t, func(ctx context.Context, job *flotilla.Job[Welcome]) (bool, error) {
		return job.Attempt == job.MaxAttempts, nil
	}, Welcome{}, opts...)
	fmt.Println("last attempt:", last)
	// Output:
	// last attempt: true
}

// WithKey sets the task's key.
func ExampleWithKey() {
	t := &exampleT{}
	defer t.Done()
	key, _ := flotillatest.Work(t, func(ctx context.Context, job *flotilla.Job[Welcome]) (string, error) {
		return job.Key, nil
	}, Welcome{}, flotillatest.WithKey("user-42"))
	fmt.Println(key)
	// Output:
	// user-42
}

// WithAttempt runs a later attempt.
func ExampleWithAttempt() {
	t := &exampleT{}
	defer t.Done()
	n, _ := flotillatest.Work(t, func(ctx context.Context, job *flotilla.Job[Welcome]) (int, error) {
		return job.Attempt, nil
	}, Welcome{}, flotillatest.WithAttempt(2, 5))
	fmt.Println(n)
	// Output:
	// 2
}

type counted struct {
	Sent int `json:"sent"`
}

// WithProgress gives the attempt what an earlier one saved.
func ExampleWithProgress() {
	t := &exampleT{}
	defer t.Done()
	resumed, _ := flotillatest.Work(t, func(ctx context.Context, job *flotilla.Job[Welcome]) (int, error) {
		var p counted
		_, err := job.Progress(&p)
		return p.Sent, err
	}, Welcome{}, flotillatest.WithProgress(counted{Sent: 40}))
	fmt.Println(resumed)
	// Output:
	// 40
}

// WithPauseRequested has the attempt's checkpoint answer task.ErrPaused.
func ExampleWithPauseRequested() {
	t := &exampleT{}
	defer t.Done()
	_, err := flotillatest.Work(t, func(ctx context.Context, job *flotilla.Job[Welcome]) (struct{}, error) {
		return struct{}{}, job.Checkpoint(ctx)
	}, Welcome{}, flotillatest.WithPauseRequested())
	fmt.Println(errors.Is(err, task.ErrPaused))
	// Output:
	// true
}

// WithDependencyResults runs the attempt as a pipeline step.
func ExampleWithDependencyResults() {
	t := &exampleT{}
	defer t.Done()
	got, _ := flotillatest.Work(t, func(ctx context.Context, job *flotilla.Job[Welcome]) (string, error) {
		var name string
		err := job.DependencyResult(ctx, "lookup", &name)
		return job.Task().Step + " after lookup: " + name, err
	}, Welcome{}, flotillatest.WithDependencyResults("send", map[string]any{"lookup": "Ada"}))
	fmt.Println(got)
	// Output:
	// send after lookup: Ada
}

// WithMetadata gives the task metadata.
func ExampleWithMetadata() {
	t := &exampleT{}
	defer t.Done()
	got, _ := flotillatest.Work(t, func(ctx context.Context, job *flotilla.Job[Welcome]) (string, error) {
		return job.Metadata()["tenant"], nil
	}, Welcome{}, flotillatest.WithMetadata(map[string]string{"tenant": "acme"}))
	fmt.Println(got)
	// Output:
	// acme
}

// WithMiddleware runs the handler inside middleware, as a node would.
func ExampleWithMiddleware() {
	t := &exampleT{}
	defer t.Done()
	refuse := func(next node.Handler) node.Handler {
		return func(ctx context.Context, t *task.Task) error { return errors.New("refused by the middleware") }
	}
	_, err := flotillatest.Work(t, welcome, Welcome{To: "ada@example.com"}, flotillatest.WithMiddleware(refuse))
	fmt.Println(err)
	// Output:
	// refused by the middleware
}

// WithRecorder records what the handler saved and appended.
func ExampleWithRecorder() {
	t := &exampleT{}
	defer t.Done()
	var rec flotillatest.Recorded
	_, _ = flotillatest.Work(t, func(ctx context.Context, job *flotilla.Job[Welcome]) (struct{}, error) {
		return struct{}{}, job.SaveProgress(ctx, counted{Sent: 1})
	}, Welcome{}, flotillatest.WithRecorder(&rec))
	fmt.Println(string(rec.Progress[0]))
	// Output:
	// {"sent":1}
}

// Recorded holds the task as the handler left it, its result included.
func ExampleRecorded() {
	t := &exampleT{}
	defer t.Done()
	var rec flotillatest.Recorded
	_, _ = flotillatest.Work(t, welcome, Welcome{To: "ada@example.com"}, flotillatest.WithRecorder(&rec))
	fmt.Println(string(rec.Task.Result), len(rec.Appended))
	// Output:
	// "sent to ada@example.com" 0
}
