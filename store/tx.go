package store

import (
	"context"

	"github.com/flotilla-dev/flotilla/task"
)

// TxCreator is implemented by stores that can create tasks and pipelines
// inside a transaction the caller opened and commits: they exist, and nodes
// hear of them, only if it commits. Each store takes its own driver's
// transaction, passed as tx: the PostgreSQL store a pgx.Tx on its database,
// the SQLite store a *sql.Tx (database/sql, driver modernc.org/sqlite) on
// its file. Any other tx is refused with ErrInvalid, naming its type and
// the one wanted. The tasks are validated as CreateTasks validates them,
// and a pipeline as CreatePipeline validates it.
type TxCreator interface {
	CreateTasksInTx(ctx context.Context, tx any, tasks []NewTask) ([]*task.Task, error)
	CreatePipelineInTx(ctx context.Context, tx any, np NewPipeline) (Pipeline, error)
}
