package flotilla_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/flotillatest"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/postgres"
	"github.com/flotilla-dev/flotilla/task"
)

// Email is the task type of the examples: a struct that names its kind.
type Email struct {
	To      string `json:"to"`
	Subject string `json:"subject,omitempty"`
}

func (Email) Kind() string { return "email" }

// sendEmail is its handler; the result is a message id.
func sendEmail(ctx context.Context, job *flotilla.Job[Email]) (string, error) {
	if !strings.Contains(job.Args.To, "@") {
		return "", task.NoRetry(fmt.Errorf("%q is no address", job.Args.To))
	}
	return fmt.Sprintf("msg-%d-%s", job.ID, job.Args.To), nil
}

func handleEmail(n *node.Node) error { return flotilla.Handle(n, sendEmail) }

// A task type names its kind; its value, as JSON, is the task's payload.
func ExampleArgs() {
	r, err := flotilla.NewRequest(Email{To: "ada@example.com", Subject: "welcome"})
	if err != nil {
		panic(err)
	}
	fmt.Printf("kind %s, payload %s\n", r.Kind, r.Payload)
	// Output:
	// kind email, payload {"to":"ada@example.com","subject":"welcome"}
}

// Handle registers a typed handler on a node; SubmitArgs submits a task of
// its type, and WaitResult reads its result, typed.
func ExampleHandle() {
	ctx := context.Background()
	dsn := "sqlite:" + filepath.Join(os.TempDir(), fmt.Sprintf("flotilla-example-%d.db", os.Getpid()))
	defer func() {
		for _, suffix := range []string{"", "-wal", "-shm"} {
			_ = os.Remove(strings.TrimPrefix(dsn, "sqlite:") + suffix)
		}
	}()
	if err := flotilla.Migrate(ctx, dsn); err != nil {
		panic(err)
	}
	client, err := flotilla.Connect(ctx, dsn)
	if err != nil {
		panic(err)
	}
	defer client.Close()
	n, err := node.New(client.Store(), node.Config{AllBuckets: true})
	if err != nil {
		panic(err)
	}
	if err := flotilla.Handle(n, sendEmail); err != nil {
		panic(err)
	}
	if err := n.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = n.Shutdown(ctx) }()

	t, err := flotilla.SubmitArgs(ctx, client, Email{To: "ada@example.com"})
	if err != nil {
		panic(err)
	}
	id, err := flotilla.WaitResult[string](ctx, client, t.ID)
	if err != nil {
		panic(err)
	}
	fmt.Println(id)
	// Output:
	// msg-1-ada@example.com
}

// A payload with a field the type does not have fails at its first
// attempt, naming the field, without retries.
func ExampleHandle_strictPayload() {
	ctx := context.Background()
	fleet, done := exampleFleet(handleEmail)
	defer done()
	t, err := fleet.Client.Submit(ctx, flotilla.TaskRequest{
		Kind: "email", Payload: json.RawMessage(`{"to":"ada@example.com","cc":"bob@example.com"}`),
	})
	if err != nil {
		panic(err)
	}
	ended := fleet.Wait(t.ID)
	fmt.Printf("%s at attempt %d of %d: %s\n", ended.Status, ended.Attempt, ended.MaxAttempts, ended.Error)
	// Output:
	// failed at attempt 1 of 3: email task 1: the payload does not decode into flotilla_test.Email: json: unknown field "cc"
}

// NewHandler is the untyped handler Handle registers: register it yourself
// to wrap one kind in a middleware of its own.
func ExampleNewHandler() {
	ctx := context.Background()
	audit := func(next node.Handler) node.Handler {
		return func(ctx context.Context, t *task.Task) error {
			fmt.Printf("audit: %s task %d, attempt %d\n", t.Kind, t.ID, t.Attempt)
			return next(ctx, t)
		}
	}
	fleet, done := exampleFleet(func(n *node.Node) error {
		return n.RegisterSafely(Email{}.Kind(), audit(flotilla.NewHandler(sendEmail)))
	})
	defer done()
	t, err := flotilla.SubmitArgs(ctx, fleet.Client, Email{To: "ada@example.com"})
	if err != nil {
		panic(err)
	}
	fmt.Println(fleet.Wait(t.ID).Status)
	// Output:
	// audit: email task 1, attempt 1
	// succeeded
}

// ResultOf decodes a task's result; a task that did not succeed has none.
func ExampleResultOf() {
	ctx := context.Background()
	fleet, done := exampleFleet(handleEmail)
	defer done()
	good, _ := flotilla.SubmitArgs(ctx, fleet.Client, Email{To: "ada@example.com"})
	bad, _ := flotilla.SubmitArgs(ctx, fleet.Client, Email{To: "nobody"})

	id, err := flotilla.ResultOf[string](fleet.Wait(good.ID))
	fmt.Println(id, err)
	_, err = flotilla.ResultOf[string](fleet.Wait(bad.ID))
	fmt.Println(errors.Is(err, flotilla.ErrNoResult), err)
	// Output:
	// msg-1-ada@example.com <nil>
	// true task 2 is failed (error: "nobody" is no address): the task has not succeeded, so it has no result
}

// ErrNoResult tells a task that ended without success from one whose
// result does not decode.
func ExampleErrNoResult() {
	_, err := flotilla.ResultOf[string](&task.Task{ID: 7, Status: task.Stopped})
	fmt.Println(errors.Is(err, flotilla.ErrNoResult))
	// Output:
	// true
}

// WaitResult waits for a task to end and decodes its result.
func ExampleWaitResult() {
	ctx := context.Background()
	fleet, done := exampleFleet(handleEmail)
	defer done()
	t, err := flotilla.SubmitArgs(ctx, fleet.Client, Email{To: "ada@example.com"})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	id, err := flotilla.WaitResult[string](ctx, fleet.Client, t.ID)
	fmt.Println(id, err)
	// Output:
	// msg-1-ada@example.com <nil>
}

// SubmitArgs submits a task of a type, with options for its fields. Here
// no node runs emails yet, and the submitter accepts that the task waits.
func ExampleSubmitArgs() {
	ctx := context.Background()
	fleet, done := exampleFleet(nil)
	defer done()
	welcome := []flotilla.SubmitOption{
		flotilla.WithKey("user-42"), flotilla.WithPriority(5), flotilla.WithMaxAttempts(10),
		flotilla.WithUniqueKey("welcome-user-42"), flotilla.AllowUnknownKind(),
	}
	t, err := flotilla.SubmitArgs(ctx, fleet.Client, Email{To: "ada@example.com"}, welcome...)
	if err != nil {
		panic(err)
	}
	fmt.Printf("task %d: kind %s, key %s, priority %d, %d attempts, unique key %s\n",
		t.ID, t.Kind, t.Key, t.Priority, t.MaxAttempts, t.UniqueKey)
	// The unique key is taken while the first task is unfinished.
	_, err = flotilla.SubmitArgs(ctx, fleet.Client, Email{To: "ada@example.com"}, welcome...)
	fmt.Println("again:", errors.Is(err, store.ErrDuplicate))
	// Output:
	// task 1: kind email, key user-42, priority 5, 10 attempts, unique key welcome-user-42
	// again: true
}

// NewRequest builds a task without submitting it, for SubmitMany, which
// submits a batch all or none.
func ExampleNewRequest() {
	ctx := context.Background()
	fleet, done := exampleFleet(handleEmail)
	defer done()
	var batch []flotilla.TaskRequest
	for _, to := range []string{"ada@example.com", "bob@example.com"} {
		r, err := flotilla.NewRequest(Email{To: to}, flotilla.WithKey(to))
		if err != nil {
			panic(err)
		}
		batch = append(batch, r)
	}
	tasks, err := fleet.Client.SubmitMany(ctx, batch)
	if err != nil {
		panic(err)
	}
	for _, t := range tasks {
		fmt.Println(t.ID, t.Key)
	}
	// Output:
	// 1 ada@example.com
	// 2 bob@example.com
}

// Extract, Total and the step handlers make a pipeline: two extracts, and a
// load that adds their rows up.
type Extract struct {
	Region string `json:"region"`
}

func (Extract) Kind() string { return "extract" }

type Load struct{}

func (Load) Kind() string { return "load" }

type Rows struct {
	Rows int `json:"rows"`
}

// NewStep makes pipeline steps of task types; a step's handler reads its
// dependencies' results.
func ExampleNewStep() {
	ctx := context.Background()
	fleet, done := exampleFleet(func(n *node.Node) error {
		return errors.Join(
			flotilla.Handle(n, func(ctx context.Context, job *flotilla.Job[Extract]) (Rows, error) {
				return Rows{Rows: len(job.Args.Region) * 10}, nil
			}),
			flotilla.Handle(n, func(ctx context.Context, job *flotilla.Job[Load]) (Rows, error) {
				var eu, us Rows
				if err := errors.Join(job.DependencyResult(ctx, "extract-eu", &eu),
					job.DependencyResult(ctx, "extract-us", &us)); err != nil {
					return Rows{}, err
				}
				return Rows{Rows: eu.Rows + us.Rows}, nil
			}),
		)
	})
	defer done()
	eu, err1 := flotilla.NewStep("extract-eu", Extract{Region: "eu"})
	us, err2 := flotilla.NewStep("extract-us", Extract{Region: "us"})
	load, err3 := flotilla.NewStep("load", Load{}, "extract-eu", "extract-us")
	if err := errors.Join(err1, err2, err3); err != nil {
		panic(err)
	}
	p, err := fleet.Client.SubmitPipeline(ctx, flotilla.PipelineRequest{Name: "nightly", Steps: []task.Step{eu, us, load}})
	if err != nil {
		panic(err)
	}
	for _, s := range p.Steps {
		if s.Name == "load" {
			rows, err := flotilla.ResultOf[Rows](fleet.Wait(s.Task.ID))
			fmt.Println("loaded", rows.Rows, "rows", err)
		}
	}
	// Output:
	// loaded 40 rows <nil>
}

// SubmitArgsSQLiteTx submits in the application's own transaction on the
// SQLite file: the task exists only if the transaction commits.
func ExampleSubmitArgsSQLiteTx() {
	ctx := context.Background()
	fleet, done := exampleFleet(handleEmail)
	defer done()
	db := appDB(fleet.DSN) // the application's handle on the file: sql.Open("sqlite", "file:PATH?_txlock=immediate")
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		panic(err)
	}
	t, err := flotilla.SubmitArgsSQLiteTx(ctx, fleet.Client, tx, Email{To: "ada@example.com"})
	if err != nil {
		panic(err)
	}
	if err := tx.Commit(); err != nil { // a rollback would leave no task
		panic(err)
	}
	fmt.Println(fleet.Wait(t.ID).Status)
	// Output:
	// succeeded
}

// SubmitArgsTx submits in the application's own PostgreSQL transaction: an
// order and the task that ships it commit together or not at all.
func ExampleSubmitArgsTx_postgres() {
	ctx := context.Background()
	dsn, done := postgresDSN()
	defer done()
	if err := flotilla.Migrate(ctx, dsn); err != nil {
		panic(err)
	}
	client, err := flotilla.Connect(ctx, dsn)
	if err != nil {
		panic(err)
	}
	defer client.Close()
	pool := client.Store().(*postgres.Store).Pool() // or a pgxpool.Pool of the application's own
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id bigserial PRIMARY KEY, item text)`); err != nil {
		panic(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var order int64
		if err := tx.QueryRow(ctx, `INSERT INTO orders (item) VALUES ('teapot') RETURNING id`).Scan(&order); err != nil {
			return err
		}
		_, err := flotilla.SubmitArgsTx(ctx, client, tx, Email{To: "ada@example.com", Subject: fmt.Sprint("order ", order)},
			flotilla.AllowUnowned(), flotilla.AllowUnknownKind())
		return err
	})
	if err != nil {
		panic(err)
	}
	tasks, err := client.List(ctx, store.TaskFilter{})
	if err != nil {
		panic(err)
	}
	fmt.Println(tasks[0].Kind, string(tasks[0].Payload))
	// Output:
	// email {"to": "ada@example.com", "subject": "order 1"}
}

// SubmitTx takes requests, in a pgx.Tx; the task waits for a node that
// runs its kind.
func ExampleClient_SubmitTx_postgres() {
	ctx := context.Background()
	dsn, done := postgresDSN()
	defer done()
	if err := flotilla.Migrate(ctx, dsn, flotilla.WithNumBuckets(16)); err != nil {
		panic(err)
	}
	client, err := flotilla.Connect(ctx, dsn)
	if err != nil {
		panic(err)
	}
	defer client.Close()
	pool := client.Store().(*postgres.Store).Pool()
	r, err := flotilla.NewRequest(Email{To: "ada@example.com"}, flotilla.WithKey("user-1"))
	if err != nil {
		panic(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	tasks, err := client.SubmitTx(ctx, tx, r)
	if err != nil {
		panic(err)
	}
	if err := tx.Commit(ctx); err != nil {
		panic(err)
	}
	fmt.Printf("task %d, key %s, bucket %d: %s\n", tasks[0].ID, tasks[0].Key, tasks[0].Bucket, tasks[0].Status)
	// Output:
	// task 1, key user-1, bucket 8: queued
}

// SubmitPipelineTx creates a pipeline in a pgx.Tx.
func ExampleClient_SubmitPipelineTx_postgres() {
	ctx := context.Background()
	dsn, done := postgresDSN()
	defer done()
	if err := flotilla.Migrate(ctx, dsn); err != nil {
		panic(err)
	}
	client, err := flotilla.Connect(ctx, dsn)
	if err != nil {
		panic(err)
	}
	defer client.Close()
	extract, _ := flotilla.NewStep("extract", Extract{Region: "eu"})
	load, _ := flotilla.NewStep("load", Load{}, "extract")
	pool := client.Store().(*postgres.Store).Pool()
	var p store.Pipeline
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		p, err = client.SubmitPipelineTx(ctx, tx, flotilla.PipelineRequest{Name: "nightly", Steps: []task.Step{extract, load}})
		return err
	})
	if err != nil {
		panic(err)
	}
	for _, s := range p.Steps {
		fmt.Println(s.Name, s.Task.Status)
	}
	// Output:
	// extract queued
	// load pending
}

// SubmitPipelineSQLiteTx creates a pipeline in a transaction on the SQLite
// file.
func ExampleClient_SubmitPipelineSQLiteTx() {
	ctx := context.Background()
	fleet, done := exampleFleet(nil)
	defer done()
	db := appDB(fleet.DSN)
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		panic(err)
	}
	extract, _ := flotilla.NewStep("extract", Extract{Region: "eu"})
	load, _ := flotilla.NewStep("load", Load{}, "extract")
	p, err := fleet.Client.SubmitPipelineSQLiteTx(ctx, tx, flotilla.PipelineRequest{Name: "nightly", Steps: []task.Step{extract, load}})
	if err != nil {
		panic(err)
	}
	if err := tx.Rollback(); err != nil {
		panic(err)
	}
	_, err = fleet.Client.GetPipeline(ctx, p.ID)
	fmt.Println("after a rollback:", errors.Is(err, store.ErrNotFound))
	// Output:
	// after a rollback: true
}

// Migrate creates the database's schema, or upgrades it; Connect then
// opens a client on it. Before Migrate, Connect answers ErrNoSchema.
func ExampleMigrate() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "flotilla-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	dsn := "sqlite:" + filepath.Join(dir, "app.db")

	_, err = flotilla.Connect(ctx, dsn)
	fmt.Println("before:", errors.Is(err, flotilla.ErrNoSchema))
	if err := flotilla.Migrate(ctx, dsn); err != nil {
		panic(err)
	}
	client, err := flotilla.Connect(ctx, dsn)
	if err != nil {
		panic(err)
	}
	defer client.Close()
	fmt.Println("after:", client.Policy().Count(), "buckets")
	// Output:
	// before: true
	// after: 64 buckets
}

// WithNumBuckets sets a new fleet's bucket count, fixed from then on.
func ExampleWithNumBuckets() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "flotilla-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	dsn := "sqlite:" + filepath.Join(dir, "app.db")
	if err := flotilla.Migrate(ctx, dsn, flotilla.WithNumBuckets(256)); err != nil {
		panic(err)
	}
	err = flotilla.Migrate(ctx, dsn, flotilla.WithNumBuckets(512))
	fmt.Println(errors.Is(err, store.ErrBucketCount))
	// Output:
	// true
}

// ErrNoSchema names what to do: Connect creates nothing, not even the
// SQLite file.
func ExampleErrNoSchema() {
	dir, err := os.MkdirTemp("", "flotilla-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	_, err = flotilla.Connect(context.Background(), filepath.Join(dir, "app.db"))
	fmt.Println(strings.ReplaceAll(err.Error(), dir, "DIR"))
	_, statErr := os.Stat(filepath.Join(dir, "app.db"))
	fmt.Println("file created:", statErr == nil)
	// Output:
	// sqlite:DIR/app.db: no flotilla schema: create it with flotilla.Migrate(ctx, dsn) before connecting
	// file created: false
}

// Stop, Pause and Resume take a Reason and a By, which the audit trail
// keeps.
func ExampleClient_Stop() {
	ctx := context.Background()
	fleet, done := exampleFleet(nil) // no node runs emails: the task waits
	defer done()
	t, err := flotilla.SubmitArgs(ctx, fleet.Client, Email{To: "ada@example.com"}, flotilla.AllowUnknownKind())
	if err != nil {
		panic(err)
	}
	res, err := fleet.Client.Stop(ctx, t.ID, flotilla.Reason("sent by hand"), flotilla.By("ops"))
	if err != nil {
		panic(err)
	}
	fmt.Printf("%s -> %s\n", res.From, res.Status)
	fmt.Println(lastMove(fleet.Client, t.ID))
	// Output:
	// queued -> cancelled
	// cancelled - stop requested by ops: sent by hand
}

// lastMove is a task's state and the reason of its latest move, from its
// audit trail.
func lastMove(c *flotilla.Client, id int64) string {
	r, err := c.Report(context.Background(), id)
	if err != nil {
		panic(err)
	}
	return fmt.Sprintf("%s - %s", r.Task.Status, r.Events[len(r.Events)-1].Reason)
}

// Reason says why, in the audit trail.
func ExampleReason() {
	ctx := context.Background()
	fleet, done := exampleFleet(nil)
	defer done()
	t, _ := flotilla.SubmitArgs(ctx, fleet.Client, Email{To: "ada@example.com"}, flotilla.AllowUnknownKind())
	if _, err := fleet.Client.Pause(ctx, t.ID, flotilla.Reason("maintenance window")); err != nil {
		panic(err)
	}
	fmt.Println(lastMove(fleet.Client, t.ID))
	// Output:
	// paused - pause requested: maintenance window
}

// By names who asked, in the audit trail.
func ExampleBy() {
	ctx := context.Background()
	fleet, done := exampleFleet(nil)
	defer done()
	t, _ := flotilla.SubmitArgs(ctx, fleet.Client, Email{To: "ada@example.com"}, flotilla.AllowUnknownKind())
	_, _ = fleet.Client.Pause(ctx, t.ID)
	if _, err := fleet.Client.Resume(ctx, t.ID, flotilla.By("ada")); err != nil {
		panic(err)
	}
	fmt.Println(lastMove(fleet.Client, t.ID))
	// Output:
	// queued - resume requested by ada
}

// Every control call takes the same options: here, on a whole pipeline.
func ExampleCommandOption() {
	ctx := context.Background()
	fleet, done := exampleFleet(nil)
	defer done()
	extract, _ := flotilla.NewStep("extract", Extract{Region: "eu"})
	load, _ := flotilla.NewStep("load", Load{}, "extract")
	p, err := fleet.Client.SubmitPipeline(ctx, flotilla.PipelineRequest{Name: "nightly", Steps: []task.Step{extract, load}},
		flotilla.AllowUnknownKind())
	if err != nil {
		panic(err)
	}
	opts := []flotilla.CommandOption{flotilla.Reason("bad input"), flotilla.By("ops")}
	results, err := fleet.Client.StopPipeline(ctx, p.ID, opts...)
	if err != nil {
		panic(err)
	}
	for _, r := range results {
		fmt.Printf("%s: %s -> %s\n", r.Step, r.From, r.Status)
	}
	p, err = fleet.Client.GetPipeline(ctx, p.ID)
	if err != nil {
		panic(err)
	}
	fmt.Println("load:", p.Steps[1].Task.Status) // cancelled before the step it waited for
	// Output:
	// load: pending -> cancelled
	// extract: queued -> cancelled
	// load: cancelled
}

// Wait waits for a task to end, whatever the end.
func ExampleClient_Wait() {
	ctx := context.Background()
	fleet, done := exampleFleet(handleEmail)
	defer done()
	t, _ := flotilla.SubmitArgs(ctx, fleet.Client, Email{To: "nobody"})
	ended, err := fleet.Client.Wait(ctx, t.ID)
	if err != nil {
		panic(err)
	}
	fmt.Println(ended.Status, ended.Error)
	// Output:
	// failed "nobody" is no address
}

// Report is a task with its audit trail, as `worker get` prints it.
func ExampleClient_Report() {
	ctx := context.Background()
	fleet, done := exampleFleet(handleEmail)
	defer done()
	t, _ := flotilla.SubmitArgs(ctx, fleet.Client, Email{To: "ada@example.com"})
	fleet.Wait(t.ID)
	r, err := fleet.Client.Report(ctx, t.ID)
	if err != nil {
		panic(err)
	}
	for _, e := range r.Events {
		fmt.Printf("%q -> %s\n", e.From, e.To)
	}
	// Output:
	// "" -> queued
	// "queued" -> running
	// "running" -> succeeded
}

// A submit middleware sees every submit of the client: here it tags each
// task with the request it came from, found in the context.
func ExampleWithSubmitMiddleware() {
	ctx := context.Background()
	type requestKey struct{}
	tag := func(next flotilla.SubmitFunc) flotilla.SubmitFunc {
		return func(ctx context.Context, rs []flotilla.TaskRequest) ([]*task.Task, error) {
			if id, ok := ctx.Value(requestKey{}).(string); ok {
				for i := range rs {
					rs[i].Metadata = map[string]string{"request": id}
				}
			}
			return next(ctx, rs)
		}
	}
	fleet, done := exampleFleet(handleEmail)
	defer done()
	client, err := flotilla.Connect(ctx, fleet.DSN, flotilla.WithSubmitMiddleware(tag))
	if err != nil {
		panic(err)
	}
	defer client.Close()
	t, err := flotilla.SubmitArgs(context.WithValue(ctx, requestKey{}, "req-7"), client, Email{To: "ada@example.com"})
	if err != nil {
		panic(err)
	}
	fmt.Println(t.Metadata)
	// Output:
	// map[request:req-7]
}

// SubmitMiddleware is the shape of a submit middleware: this one counts the
// tasks each submit creates.
func ExampleSubmitMiddleware() {
	var created int
	var count flotilla.SubmitMiddleware = func(next flotilla.SubmitFunc) flotilla.SubmitFunc {
		return func(ctx context.Context, rs []flotilla.TaskRequest) ([]*task.Task, error) {
			out, err := next(ctx, rs)
			created += len(out)
			return out, err
		}
	}
	ctx := context.Background()
	fleet, done := exampleFleet(handleEmail, flotillatest.WithClientOptions(flotilla.WithSubmitMiddleware(count)))
	defer done()
	r1, _ := flotilla.NewRequest(Email{To: "a@example.com"})
	r2, _ := flotilla.NewRequest(Email{To: "b@example.com"})
	if _, err := fleet.Client.SubmitMany(ctx, []flotilla.TaskRequest{r1, r2}); err != nil {
		panic(err)
	}
	fmt.Println(created, "tasks created")
	// Output:
	// 2 tasks created
}
