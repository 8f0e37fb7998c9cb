package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

var _ store.TxCreator = (*Store)(nil)

// txOrigin marks outbox rows written in a caller's transaction: this
// handle's listeners hear of them from the outbox too, since only the
// caller knows when they commit.
const txOrigin = "tx"

// CreateTasksInTx creates tasks inside the caller's transaction: tx must be
// a *sql.Tx on this store's file, opened through modernc.org/sqlite. Open
// that database with _txlock=immediate (sql.Open("sqlite",
// "file:PATH?_txlock=immediate")): a deferred transaction that becomes a
// writer while another holds the lock fails at once with SQLITE_BUSY. The
// announcement of the tasks is written to the outbox in tx, so that
// listeners hear of them when, and only if, it commits.
func (s *Store) CreateTasksInTx(ctx context.Context, tx any, tasks []store.NewTask) ([]*task.Task, error) {
	stx, err := callersTx(tx, "tasks")
	if err != nil {
		return nil, err
	}
	if len(tasks) == 0 {
		return nil, nil
	}
	n, err := s.fleetSize(ctx)
	if err != nil {
		return nil, err
	}
	if err := store.CheckNewTasks(tasks, n); err != nil {
		return nil, err
	}
	var out []*task.Task
	err = s.inCallersTx(ctx, stx, func(w *wtx) error {
		var err error
		out, err = insertTasks(w, tasks, false)
		return err
	})
	if err != nil {
		return nil, requireSchema(err)
	}
	return out, nil
}

// inCallersTx runs fn in the caller's transaction stx as the writer runs
// an op in its own (wtx.run), its announcements marked txOrigin. A
// transaction on another file is refused.
func (s *Store) inCallersTx(ctx context.Context, stx *sql.Tx, fn func(w *wtx) error) error {
	if err := s.sameFile(ctx, stx); err != nil {
		return err
	}
	return (&wtx{conn: stx, ctx: ctx}).run(fn, txOrigin)
}

// callersTx is tx as the SQLite store's kind of transaction, or the
// refusal that names what tx is and what it should be; what names what the
// caller creates.
func callersTx(tx any, what string) (*sql.Tx, error) {
	stx, ok := tx.(*sql.Tx)
	if !ok {
		return nil, fmt.Errorf("%w: the SQLite store creates %s in a *sql.Tx on its file, not a %T", store.ErrInvalid, what, tx)
	}
	return stx, nil
}

// sameFile refuses a transaction on another database file than the store's.
func (s *Store) sameFile(ctx context.Context, tx *sql.Tx) error {
	var (
		seq        int
		name, file string
	)
	if err := tx.QueryRowContext(ctx, `SELECT seq, name, file FROM pragma_database_list WHERE name = 'main'`).Scan(&seq, &name, &file); err != nil {
		return wrap(err, "read the transaction's database file")
	}
	if filepath.Clean(file) != s.path {
		return fmt.Errorf("%w: the transaction is on %s, not on the store's file %s", store.ErrInvalid, file, s.path)
	}
	return nil
}
