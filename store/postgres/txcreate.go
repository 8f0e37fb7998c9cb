package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

var _ store.TxCreator = (*Store)(nil)

// CreateTasksInTx is CreateTasksTx behind the store-neutral seam: tx must
// be a pgx.Tx on this store's database.
func (s *Store) CreateTasksInTx(ctx context.Context, tx any, tasks []store.NewTask) ([]*task.Task, error) {
	ptx, ok := tx.(pgx.Tx)
	if !ok {
		return nil, fmt.Errorf("%w: the PostgreSQL store creates tasks in a pgx.Tx, not a %T", store.ErrInvalid, tx)
	}
	return s.CreateTasksTx(ctx, ptx, tasks)
}

// CreatePipelineInTx is CreatePipelineTx behind the store-neutral seam: tx
// must be a pgx.Tx on this store's database.
func (s *Store) CreatePipelineInTx(ctx context.Context, tx any, np store.NewPipeline) (store.Pipeline, error) {
	ptx, ok := tx.(pgx.Tx)
	if !ok {
		return store.Pipeline{}, fmt.Errorf("%w: the PostgreSQL store creates pipelines in a pgx.Tx, not a %T", store.ErrInvalid, tx)
	}
	return s.CreatePipelineTx(ctx, ptx, np)
}
