package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// A file made by the schema before migration 6 (task ids handed out as one
// more than the largest in the table) is migrated to AUTOINCREMENT with
// every row and column as it was, the task table's indexes as they were,
// and ids that go on above every id the file knows of.
func TestMigrationToTaskIDsNeverReusedKeepsEveryRow(t *testing.T) {
	ctx, s := openAtVersion5(t)
	if ddl := tableSQL(t, s.rdb, "flotilla_tasks"); strings.Contains(ddl, "AUTOINCREMENT") {
		t.Fatalf("the schema of version 5 already has AUTOINCREMENT:\n%s", ddl)
	}

	// Tasks of every kind of row: with payloads, unique keys, limits and
	// resources, finished with events, stopped with a command, a pipeline.
	_, err := s.CreateTasks(ctx, []store.NewTask{
		{Kind: "noop", Key: "a", Bucket: 1, Payload: []byte(`{"n":1}`), UniqueKey: "u1", Priority: 3},
		{Kind: "fetch", Key: "b", Bucket: 1, LimitKey: "tenant", Resources: store.Resources{"gpu": 1}, Timeout: 1500 * time.Millisecond},
		{Kind: "noop", Key: "c", Bucket: 1, MaxAttempts: 1},
		{Kind: "noop", Key: "d", Bucket: 2, Delay: time.Hour},
	})
	if err != nil {
		t.Fatal(err)
	}
	leases, err := s.AcquireBuckets(ctx, store.AcquireRequest{Owner: "o", Node: "n", Buckets: bucket.Of(1), TTL: time.Hour})
	if err != nil || !leases[0].Held {
		t.Fatalf("acquire: %v %v", leases, err)
	}
	held := []store.HeldBucket{{Bucket: 1, Epoch: leases[0].Epoch}}
	claimed, err := s.ClaimTasks(ctx, store.ClaimRequest{Owner: "o", Node: "n", Buckets: held, Kinds: []string{"noop"},
		Limit: 2, LeaseTTL: time.Hour})
	if err != nil || len(claimed) != 2 {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	if out, err := s.AdvanceActive(ctx, "o", []store.ActiveTransition{{Ref: claimed[0].Ref(), To: task.Succeeded,
		Result: []byte(`{"ok":true}`), Node: "n"}}); err != nil || out[0].Err != nil {
		t.Fatalf("advance: %v %v", out, err)
	}
	if _, err := s.IssueCommand(ctx, store.NewCommand{TaskID: claimed[1].ID, Kind: store.CommandStop, IssuedBy: "op"}); err != nil {
		t.Fatalf("stop: %v", err)
	}
	p, err := s.CreatePipeline(ctx, store.NewPipeline{Name: "etl", Key: "p", Steps: []task.Step{
		{Name: "extract", Kind: "noop"},
		{Name: "load", Kind: "noop", DependsOn: []task.Dependency{{Step: "extract"}}},
	}})
	if err != nil {
		t.Fatalf("pipeline: %v", err)
	}
	newest, err := s.CreateTasks(ctx, []store.NewTask{{Kind: "noop", Key: "z", Bucket: 4}})
	if err != nil {
		t.Fatal(err)
	}

	before := dump(t, s.rdb)
	indexes := tableIndexes(t, s.rdb, "flotilla_tasks")
	columns := tableColumns(t, s.rdb, "flotilla_tasks")

	dropLaterColumns(t, ctx, s)
	meta, err := s.Migrate(ctx, 0)
	if err != nil {
		t.Fatalf("Migrate from version 5: %v", err)
	}
	if meta.SchemaVersion != SchemaVersion || meta.NumBuckets != 8 {
		t.Errorf("Migrate: %+v", meta)
	}
	if ddl := tableSQL(t, s.rdb, "flotilla_tasks"); !strings.Contains(ddl, "AUTOINCREMENT") {
		t.Errorf("the task table after migration 6 has no AUTOINCREMENT:\n%s", ddl)
	}
	if after := dump(t, s.rdb); !reflect.DeepEqual(before, after) {
		for table := range before {
			if !reflect.DeepEqual(before[table], after[table]) {
				t.Errorf("%s changed in the migration:\nbefore %v\nafter  %v", table, before[table], after[table])
			}
		}
	}
	if got := tableIndexes(t, s.rdb, "flotilla_tasks"); !reflect.DeepEqual(got, indexes) {
		t.Errorf("the task table's indexes changed:\nbefore %v\nafter  %v", indexes, got)
	}
	if got := tableColumns(t, s.rdb, "flotilla_tasks"); !reflect.DeepEqual(got, columns) {
		t.Errorf("the task table's columns changed:\nbefore %v\nafter  %v", columns, got)
	}
	if got, err := s.GetPipeline(ctx, p.ID); err != nil || len(got.Steps) != 2 {
		t.Errorf("the pipeline after the migration: %v %v", got, err)
	}

	// Ids go on above the largest, and are not handed out again once the
	// newest task is gone.
	if _, err := s.wdbExec(ctx, `DELETE FROM flotilla_tasks WHERE id = ?`, newest[0].ID); err != nil {
		t.Fatal(err)
	}
	next, err := s.CreateTasks(ctx, []store.NewTask{{Kind: "noop", Key: "z", Bucket: 4}})
	if err != nil {
		t.Fatal(err)
	}
	if next[0].ID <= newest[0].ID {
		t.Errorf("after the migration a new task got id %d, not above %d", next[0].ID, newest[0].ID)
	}
	if again, err := s.Migrate(ctx, 0); err != nil || again.SchemaVersion != SchemaVersion {
		t.Errorf("Migrate again: %+v %v", again, err)
	}
}

// The sequence starts above every task id the file names, though the task
// itself is gone: an event, a command or a dependency of a removed task.
func TestMigrationStartsTaskIDsAboveEveryIDTheFileNames(t *testing.T) {
	ctx, s := openAtVersion5(t)
	for _, q := range []string{
		`INSERT INTO flotilla_task_events (task_id, seq, from_status, to_status, at) VALUES (40, 2, 'queued', 'running', 0)`,
		`INSERT INTO flotilla_commands (task_id, kind, issued_at) VALUES (41, 'stop', 0)`,
		`INSERT INTO flotilla_task_deps (task_id, dep_id, dep_step, on_policy, ord) VALUES (42, 43, 's', 'success', 0)`,
	} {
		if _, err := s.wdbExec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	dropLaterColumns(t, ctx, s)
	if _, err := s.Migrate(ctx, 0); err != nil {
		t.Fatal(err)
	}
	created, err := s.CreateTasks(ctx, []store.NewTask{{Kind: "noop", Key: "k", Bucket: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if created[0].ID != 44 {
		t.Errorf("the first task after the migration has id %d, want 44: above the 43 the file names", created[0].ID)
	}
}

// openAtVersion5 is a store on a file of its own made as the schema before
// migration 6 left it (migrations are never edited: these are the files
// that made it), closed when the test ends. Today's code writes the columns
// that later migrations add, so they are added here for the test's writes;
// dropLaterColumns takes them away again before the file is migrated.
func openAtVersion5(t *testing.T) (context.Context, *Store) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	s, err := New(ctx, filepath.Join(t.TempDir(), "flotilla.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if _, err := s.migrate(ctx, 8, 5); err != nil {
		t.Fatal(err)
	}
	for _, c := range laterColumns {
		if _, err := s.wdbExec(ctx, `ALTER TABLE `+c.table+` ADD COLUMN `+c.column); err != nil {
			t.Fatal(err)
		}
	}
	return ctx, s
}

// laterColumns are the columns that migrations after 6 add, with their
// tables and types.
var laterColumns = []struct{ table, column string }{
	{"flotilla_tasks", "metadata TEXT"},
	{"flotilla_bucket_leases", "successor TEXT"},
	{"flotilla_bucket_leases", "successor_node TEXT"},
	{"flotilla_bucket_leases", "handoff_at INTEGER"},
	{"flotilla_bucket_leases", "handed_by TEXT"},
	{"flotilla_bucket_leases", "handoff_epoch INTEGER"},
	{"flotilla_bucket_leases", "pinned_to TEXT"},
	{"flotilla_nodes", "balance INTEGER NOT NULL DEFAULT 0"},
	{"flotilla_nodes", "leaving INTEGER NOT NULL DEFAULT 0"},
}

// dropLaterColumns leaves the file of openAtVersion5 as the schema of
// version 5 made it, with the rows written meanwhile.
func dropLaterColumns(t *testing.T, ctx context.Context, s *Store) {
	t.Helper()
	for _, c := range laterColumns {
		name, _, _ := strings.Cut(c.column, " ")
		if _, err := s.wdbExec(ctx, `ALTER TABLE `+c.table+` DROP COLUMN `+name); err != nil {
			t.Fatal(err)
		}
	}
}

// wdbExec runs one statement through the writer.
func (s *Store) wdbExec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	var res sql.Result
	err := s.write(ctx, func(tx *wtx) error {
		var err error
		res, err = tx.exec(query, args...)
		return err
	})
	return res, err
}

func tableSQL(t *testing.T, db *sql.DB, table string) string {
	t.Helper()
	var ddl string
	if err := db.QueryRow(`SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?`, table).Scan(&ddl); err != nil {
		t.Fatal(err)
	}
	return ddl
}

// tableIndexes maps each index of table to its definition, spaces folded.
func tableIndexes(t *testing.T, db *sql.DB, table string) map[string]string {
	t.Helper()
	rows, err := db.Query(`SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql IS NOT NULL`, table)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var name, ddl string
		if err := rows.Scan(&name, &ddl); err != nil {
			t.Fatal(err)
		}
		out[name] = strings.Join(strings.Fields(ddl), " ")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// tableColumns lists table's columns as PRAGMA table_info gives them.
func tableColumns(t *testing.T, db *sql.DB, table string) []string {
	t.Helper()
	rows, err := db.Query(`SELECT name, type, "notnull", coalesce(dflt_value, 'NULL'), pk FROM pragma_table_info(?)`, table)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var name, typ, dflt string
		var notNull, pk int
		if err := rows.Scan(&name, &typ, &notNull, &dflt, &pk); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s %s notnull=%d default=%s pk=%d", name, typ, notNull, dflt, pk))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// dump reads every row of the tables a task has rows in, each row as the
// text of its values.
func dump(t *testing.T, db *sql.DB) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for table, order := range map[string]string{
		"flotilla_tasks": "id", "flotilla_task_events": "task_id, seq", "flotilla_commands": "id",
		"flotilla_task_deps": "task_id, dep_id", "flotilla_pipelines": "id",
	} {
		rows, err := db.Query(`SELECT * FROM ` + table + ` ORDER BY ` + order)
		if err != nil {
			t.Fatal(err)
		}
		cols, err := rows.Columns()
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			parts := make([]string, len(cols))
			for i, v := range vals {
				if b, ok := v.([]byte); ok {
					v = string(b)
				}
				parts[i] = fmt.Sprintf("%s=%v", cols[i], v)
			}
			out[table] = append(out[table], strings.Join(parts, " "))
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		_ = rows.Close()
	}
	return out
}
