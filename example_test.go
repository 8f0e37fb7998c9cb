package flotilla_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/memory"
	"github.com/flotilla-dev/flotilla/store/sqlite"
	"github.com/flotilla-dev/flotilla/task"
)

// Submit routes a task by its key to the key's bucket, and refuses one that
// no live node would run.
func ExampleClient_Submit() {
	ctx := context.Background()
	s := memory.New()
	defer s.Close()
	if _, err := s.Migrate(ctx, 16); err != nil {
		panic(err)
	}
	c, err := flotilla.NewClient(ctx, s)
	if err != nil {
		panic(err)
	}

	n, err := node.New(s, node.Config{NodeID: "node-1", AllBuckets: true})
	if err != nil {
		panic(err)
	}
	n.Register("email", func(context.Context, *task.Task) error { return nil })
	if err := n.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = n.Shutdown(ctx) }()

	t, err := c.Submit(ctx, flotilla.TaskRequest{
		Kind: "email", Key: "user-1", MaxAttempts: 5, Timeout: time.Minute,
	})
	if err != nil {
		panic(err)
	}
	fmt.Printf("task %d: kind %s, key %s, bucket %d, %d attempts of %v\n",
		t.ID, t.Kind, t.Key, t.Bucket, t.MaxAttempts, t.Timeout)

	// No node runs kind sms in the key's bucket: the task would wait
	// unserved, so it is refused.
	_, err = c.Submit(ctx, flotilla.TaskRequest{Kind: "sms", Key: "user-1"})
	fmt.Println("refused:", errors.Is(err, flotilla.ErrRefused), err)

	for {
		got, err := c.Get(ctx, t.ID)
		if err != nil {
			panic(err)
		}
		if got.Status.Terminal() {
			fmt.Println("ended:", got.Status)
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Output:
	// task 1: kind email, key user-1, bucket 8, 5 attempts of 1m0s
	// refused: true node node-1 holds bucket 8 but does not run kind "sms" (it runs: email); submit with flotilla.AllowUnknownKind() to let the task wait for a node that does
	// ended: succeeded
}

// SubmitSQLiteTx writes tasks in the caller's own transaction on the SQLite
// store's file: they exist only if it commits. On PostgreSQL, SubmitTx
// takes a pgx.Tx from the store's database.
func ExampleClient_SubmitSQLiteTx() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "flotilla-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "fleet.db")
	s, err := sqlite.New(ctx, path)
	if err != nil {
		panic(err)
	}
	defer s.Close()
	if _, err := s.Migrate(ctx, 16); err != nil {
		panic(err)
	}
	c, err := flotilla.NewClient(ctx, s)
	if err != nil {
		panic(err)
	}
	// The application's own handle on the file; its transactions begin
	// IMMEDIATE, as a writer's must on SQLite (appDB opens it so).
	db := appDB("sqlite:" + path)
	defer db.Close()
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT)`); err != nil {
		panic(err)
	}

	place := func(item string, commit bool) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			panic(err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders (item) VALUES (?)`, item); err != nil {
			panic(err)
		}
		if _, err := c.SubmitSQLiteTx(ctx, tx, flotilla.TaskRequest{Kind: "ship", Key: item}); err != nil {
			panic(err)
		}
		if commit {
			err = tx.Commit()
		} else {
			err = tx.Rollback()
		}
		if err != nil {
			panic(err)
		}
	}
	place("umbrella", false)
	place("teapot", true)

	tasks, err := c.List(ctx, store.TaskFilter{Kind: "ship"})
	if err != nil {
		panic(err)
	}
	for _, t := range tasks {
		fmt.Printf("task %d: ship %s, %s\n", t.ID, t.Key, t.Status)
	}
	// Output:
	// task 1: ship teapot, queued
}
