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
