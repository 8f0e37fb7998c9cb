package flotilla

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// SubmitTx creates tasks inside the caller's PostgreSQL transaction, tx, on
// the client's database: they exist, and nodes hear of them, only if tx
// commits. On SQLite, SubmitSQLiteTx takes the transaction instead; each
// takes only its database's kind, so that passing the other does not
// compile. It does not check that the tasks
// will be served, since the caller's transaction decides when they exist;
// a task without a key still goes to a bucket a live node holds, when one
// does.
func (c *Client) SubmitTx(ctx context.Context, tx pgx.Tx, rs ...TaskRequest) ([]*task.Task, error) {
	return c.submitInTx(ctx, tx, "SubmitTx", rs, nil)
}

// SubmitSQLiteTx is SubmitTx on the SQLite store: tx is a transaction on the
// client's file, opened with database/sql through modernc.org/sqlite, with
// _txlock=immediate (see sqlite.Store.CreateTasksInTx).
func (c *Client) SubmitSQLiteTx(ctx context.Context, tx *sql.Tx, rs ...TaskRequest) ([]*task.Task, error) {
	return c.submitInTx(ctx, tx, "SubmitSQLiteTx", rs, nil)
}

func (c *Client) submitInTx(ctx context.Context, tx any, call string, rs []TaskRequest, opts []SubmitOption) ([]*task.Task, error) {
	txs, err := c.txCreator(call)
	if err != nil {
		return nil, err
	}
	o := newSubmitOptions(opts)
	o.allowUnowned, o.allowUnknownKind = true, true
	return c.submitWith(ctx, o, rs, func(ctx context.Context, nts []store.NewTask) ([]*task.Task, error) {
		return txs.CreateTasksInTx(ctx, tx, nts)
	})
}

// SubmitPipelineTx creates a pipeline inside the caller's PostgreSQL
// transaction: it exists, and nodes hear of its first steps, only if tx
// commits (SubmitPipelineSQLiteTx on SQLite). Invalid steps are refused as
// SubmitPipeline refuses them, with nothing written. It does not check that
// the steps will be served, since the caller's transaction decides when
// they exist.
func (c *Client) SubmitPipelineTx(ctx context.Context, tx pgx.Tx, r PipelineRequest) (store.Pipeline, error) {
	return c.submitPipelineInTx(ctx, tx, "SubmitPipelineTx", r)
}

// SubmitPipelineSQLiteTx is SubmitPipelineTx on the SQLite store, in a
// transaction on the client's file (see SubmitSQLiteTx).
func (c *Client) SubmitPipelineSQLiteTx(ctx context.Context, tx *sql.Tx, r PipelineRequest) (store.Pipeline, error) {
	return c.submitPipelineInTx(ctx, tx, "SubmitPipelineSQLiteTx", r)
}

func (c *Client) submitPipelineInTx(ctx context.Context, tx any, call string, r PipelineRequest) (store.Pipeline, error) {
	txs, err := c.txCreator(call)
	if err != nil {
		return store.Pipeline{}, err
	}
	if _, err := store.CheckNewPipeline(store.NewPipeline{Name: r.Name, Key: r.Key, Steps: r.Steps}); err != nil {
		return store.Pipeline{}, err
	}
	return txs.CreatePipelineInTx(ctx, tx, store.NewPipeline{Name: r.Name, Key: r.Key, Steps: r.Steps})
}

// txCreator is the client's store as one that writes in the caller's
// transaction; the memory store does not.
func (c *Client) txCreator(call string) (store.TxCreator, error) {
	txs, ok := c.store.(store.TxCreator)
	if !ok {
		return nil, fmt.Errorf("%w: %s needs a store that writes in the caller's transaction "+
			"(PostgreSQL or SQLite), not %T", store.ErrInvalid, call, c.store)
	}
	return txs, nil
}
