// Outbox submits tasks inside the application's own database transaction
// (flotilla.SubmitArgsTx on PostgreSQL, SubmitArgsSQLiteTx on SQLite), as an
// outbox: the order row and the task that ships it
// are written together, so there is never an order without its task, nor
// a task for an order that was rolled back. Nodes hear of the task only if
// the transaction commits.
//
// It runs on PostgreSQL when FLOTILLA_DSN is set (a postgres:// URL; the
// example creates a table example_orders there), and on an SQLite file in a
// temporary directory, removed at exit, otherwise:
//
//	go run ./examples/outbox
//	FLOTILLA_DSN=postgres://postgres@127.0.0.1:5432/app go run ./examples/outbox
package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "modernc.org/sqlite" // the database/sql driver of the application's own handle

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/examples/internal/tempfleet"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/postgres"
	"github.com/flotilla-dev/flotilla/task"
)

// Ship is the payload of the task that ships an order.
type Ship struct {
	Order int64  `json:"order"`
	Item  string `json:"item"`
}

func (Ship) Kind() string { return "ship" }

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "outbox:", err)
		os.Exit(1)
	}
}

// orders is the application's table of orders, on the fleet's database.
type orders interface {
	// place inserts an order and submits its ship task in one
	// transaction, and commits it or rolls it back.
	place(ctx context.Context, c *flotilla.Client, item string, commit bool) (*task.Task, error)
	count(ctx context.Context, item string) (int, error)
	close()
}

func run(ctx context.Context) error {
	s, db, cleanup, err := open(ctx)
	if err != nil {
		return err
	}
	defer cleanup()
	defer db.close()
	c, err := flotilla.NewClient(ctx, s)
	if err != nil {
		return err
	}

	n, err := node.New(s, node.Config{NodeID: "node-1", AllBuckets: true})
	if err != nil {
		return err
	}
	err = flotilla.Handle(n, func(ctx context.Context, job *flotilla.Job[Ship]) (struct{}, error) {
		fmt.Printf("ship: shipping order %d, %s (task %d)\n", job.Args.Order, job.Args.Item, job.ID)
		return struct{}{}, nil
	})
	if err != nil {
		return err
	}
	if err := n.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = n.Shutdown(context.WithoutCancel(ctx)) }()

	// Item names of their own, so that a database used before holds no
	// order or task of this run.
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	rolledBack, committed := "umbrella-"+run, "teapot-"+run

	t, err := db.place(ctx, c, rolledBack, false)
	if err != nil {
		return err
	}
	fmt.Printf("rolled back: order for an umbrella with task %d\n", t.ID)
	if err := report(ctx, c, db, rolledBack); err != nil {
		return err
	}

	t, err = db.place(ctx, c, committed, true)
	if err != nil {
		return err
	}
	fmt.Printf("committed: order for a teapot with task %d\n", t.ID)
	if err := report(ctx, c, db, committed); err != nil {
		return err
	}
	done, err := c.Wait(ctx, t.ID)
	if err != nil {
		return err
	}
	fmt.Printf("task %d %s\n", done.ID, done.Status)
	return n.Shutdown(ctx)
}

// report prints how many orders and ship tasks exist for item.
func report(ctx context.Context, c *flotilla.Client, db orders, item string) error {
	nOrders, err := db.count(ctx, item)
	if err != nil {
		return err
	}
	tasks, err := c.List(ctx, store.TaskFilter{Kind: "ship", Key: item})
	if err != nil {
		return err
	}
	fmt.Printf("  orders: %d, ship tasks: %d\n", nOrders, len(tasks))
	return nil
}

// open opens the fleet's store and the application's handle on the same
// database: PostgreSQL when FLOTILLA_DSN is set, a temporary SQLite file
// otherwise.
func open(ctx context.Context) (store.Store, orders, func(), error) {
	if dsn := os.Getenv("FLOTILLA_DSN"); dsn != "" {
		s, err := postgres.New(ctx, dsn)
		if err != nil {
			return nil, nil, nil, err
		}
		if _, err := s.Migrate(ctx, 0); err != nil {
			s.Close()
			return nil, nil, nil, err
		}
		db := &pgOrders{pool: s.Pool()}
		if _, err := db.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_orders (id bigserial PRIMARY KEY, item text NOT NULL)`); err != nil {
			s.Close()
			return nil, nil, nil, err
		}
		fmt.Println("store: PostgreSQL (FLOTILLA_DSN)")
		return s, db, s.Close, nil
	}
	fleet, err := tempfleet.Open(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	// The application's own handle on the file. Its transactions begin
	// IMMEDIATE: one that became a writer later would fail at once with
	// SQLITE_BUSY while the store writes.
	sdb, err := sql.Open("sqlite", "file:"+fleet.Path+"?_txlock=immediate&_pragma=busy_timeout(10000)")
	if err == nil {
		_, err = sdb.ExecContext(ctx, `CREATE TABLE example_orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)`)
	}
	if err != nil {
		if sdb != nil {
			_ = sdb.Close()
		}
		fleet.Close()
		return nil, nil, nil, err
	}
	fmt.Println("store: SQLite (a temporary file; set FLOTILLA_DSN for PostgreSQL)")
	return fleet.Store, &sqliteOrders{db: sdb}, fleet.Close, nil
}

type pgOrders struct{ pool *pgxpool.Pool }

func (o *pgOrders) place(ctx context.Context, c *flotilla.Client, item string, commit bool) (*task.Task, error) {
	tx, err := o.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(ctx) }() // a no-op once committed
	var id int64
	if err := tx.QueryRow(ctx, `INSERT INTO example_orders (item) VALUES ($1) RETURNING id`, item).Scan(&id); err != nil {
		return nil, err
	}
	t, err := flotilla.SubmitArgsTx(ctx, c, tx, Ship{Order: id, Item: item}, flotilla.WithKey(item))
	if err != nil {
		return nil, err
	}
	if commit {
		return t, tx.Commit(ctx)
	}
	return t, tx.Rollback(ctx)
}

func (o *pgOrders) count(ctx context.Context, item string) (int, error) {
	var n int
	err := o.pool.QueryRow(ctx, `SELECT count(*) FROM example_orders WHERE item = $1`, item).Scan(&n)
	return n, err
}

func (o *pgOrders) close() {}

type sqliteOrders struct{ db *sql.DB }

func (o *sqliteOrders) place(ctx context.Context, c *flotilla.Client, item string, commit bool) (*task.Task, error) {
	tx, err := o.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback() }() // a no-op once committed
	var id int64
	if err := tx.QueryRowContext(ctx, `INSERT INTO example_orders (item) VALUES (?) RETURNING id`, item).Scan(&id); err != nil {
		return nil, err
	}
	t, err := flotilla.SubmitArgsSQLiteTx(ctx, c, tx, Ship{Order: id, Item: item}, flotilla.WithKey(item))
	if err != nil {
		return nil, err
	}
	if commit {
		return t, tx.Commit()
	}
	return t, tx.Rollback()
}

func (o *sqliteOrders) count(ctx context.Context, item string) (int, error) {
	var n int
	err := o.db.QueryRowContext(ctx, `SELECT count(*) FROM example_orders WHERE item = ?`, item).Scan(&n)
	return n, err
}

func (o *sqliteOrders) close() { _ = o.db.Close() }
