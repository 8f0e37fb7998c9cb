package benchmark

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// DBStats are PostgreSQL's cumulative counters of one database
// (pg_stat_database), and of its tables (pg_stat_user_tables): the
// difference of two readings tells the commits and row writes of what ran
// in between, whichever system made them, without pg_stat_statements.
//
// PostgreSQL publishes a backend's counters when its transaction ends at
// most once a second, and at the latest when the backend exits: read the
// second snapshot after the pools of the measured run are closed.
type DBStats struct {
	Commits, Rollbacks         int64
	Inserted, Updated, Deleted int64
	Tables                     map[string]TableStats
}

// TableStats are the row writes of one table.
type TableStats struct {
	Inserted, Updated, HotUpdated, Deleted int64
}

// Sub returns s - o, counter by counter.
func (s DBStats) Sub(o DBStats) DBStats {
	d := DBStats{
		Commits: s.Commits - o.Commits, Rollbacks: s.Rollbacks - o.Rollbacks,
		Inserted: s.Inserted - o.Inserted, Updated: s.Updated - o.Updated, Deleted: s.Deleted - o.Deleted,
		Tables: map[string]TableStats{},
	}
	for name, t := range s.Tables {
		b := o.Tables[name]
		d.Tables[name] = TableStats{
			Inserted: t.Inserted - b.Inserted, Updated: t.Updated - b.Updated,
			HotUpdated: t.HotUpdated - b.HotUpdated, Deleted: t.Deleted - b.Deleted,
		}
	}
	return d
}

// ReadDBStats reads the counters of the database dsn names, on a
// connection of its own (whose one read is in the next reading's commits).
func ReadDBStats(ctx context.Context, dsn string) (DBStats, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return DBStats{}, fmt.Errorf("database statistics: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	var st DBStats
	err = conn.QueryRow(ctx, `
		SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted
		FROM pg_stat_database WHERE datname = current_database()`).
		Scan(&st.Commits, &st.Rollbacks, &st.Inserted, &st.Updated, &st.Deleted)
	if err != nil {
		return DBStats{}, fmt.Errorf("database statistics: %w", err)
	}
	rows, err := conn.Query(ctx, `
		SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables`)
	if err != nil {
		return DBStats{}, fmt.Errorf("table statistics: %w", err)
	}
	defer rows.Close()
	st.Tables = map[string]TableStats{}
	for rows.Next() {
		var (
			name string
			t    TableStats
		)
		if err := rows.Scan(&name, &t.Inserted, &t.Updated, &t.HotUpdated, &t.Deleted); err != nil {
			return DBStats{}, fmt.Errorf("table statistics: %w", err)
		}
		st.Tables[name] = t
	}
	if err := rows.Err(); err != nil {
		return DBStats{}, fmt.Errorf("table statistics: %w", err)
	}
	return st, nil
}
