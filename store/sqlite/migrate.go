package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
)

// SchemaVersion is the schema version this binary knows: the number of the
// last embedded migration.
const SchemaVersion = 9

//go:embed migrations/*.sql
var migrationFiles embed.FS

type migration struct {
	version int
	name    string
	sql     string
}

// migrations returns the embedded migrations in order, checking that they
// are numbered 1..SchemaVersion without a gap.
func migrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	var out []migration
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("migration file %s is not named NNNN_name.sql", e.Name())
		}
		body, err := migrationFiles.ReadFile("migrations/" + e.Name())
		if err != nil {
			return nil, err
		}
		out = append(out, migration{version: v, name: e.Name(), sql: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	for i, m := range out {
		if m.version != i+1 {
			return nil, fmt.Errorf("migration %s: want version %d", m.name, i+1)
		}
	}
	if len(out) != SchemaVersion {
		return nil, fmt.Errorf("%d migrations are embedded but SchemaVersion is %d", len(out), SchemaVersion)
	}
	return out, nil
}

const (
	createMigrationsTableSQL = `CREATE TABLE IF NOT EXISTS flotilla_schema_migrations (
    version    INTEGER PRIMARY KEY,
    applied_at INTEGER NOT NULL DEFAULT (` + nowSQL + `)
)`
	schemaVersionSQL   = `SELECT coalesce(max(version), 0) FROM flotilla_schema_migrations`
	recordMigrationSQL = `INSERT INTO flotilla_schema_migrations (version) VALUES (?)`
	readMetaSQL        = `SELECT num_buckets, created_at FROM flotilla_meta`
)

// Migrate brings the schema to SchemaVersion and, on a new file, fixes the
// fleet's bucket count (0 means bucket.DefaultCount). It runs as one write
// transaction: two processes migrating at once take turns at the write
// lock, and a failure leaves the file as it was. A migration may hold the
// lock for longer than the busy timeout (one copies the task table), so a
// Migrate that finds the file locked tries again until ctx ends, rather
// than failing a node that merely started beside another.
func (s *Store) Migrate(ctx context.Context, numBuckets int) (store.Meta, error) {
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		meta, err := s.migrate(ctx, numBuckets, SchemaVersion)
		if !errors.Is(err, store.ErrBusy) {
			return meta, err
		}
		select {
		case <-ctx.Done():
			return store.Meta{}, fmt.Errorf("%w; gave up waiting for another process's migration: %w", err, context.Cause(ctx))
		case <-time.After(wait):
		}
	}
}

// migrationBudget bounds the statements of a migration, which may copy a
// whole table (migration 6): far more than a batch of ordinary writes.
const migrationBudget = time.Hour

// migrate is Migrate up to version upTo, which tests set below
// SchemaVersion to make a file as an older binary left it.
func (s *Store) migrate(ctx context.Context, numBuckets, upTo int) (store.Meta, error) {
	if numBuckets < 0 || numBuckets > bucket.MaxCount {
		return store.Meta{}, fmt.Errorf("bucket count %d: a fleet has between %d and %d buckets: %w",
			numBuckets, bucket.MinCount, bucket.MaxCount, store.ErrInvalid)
	}
	all, err := migrations()
	if err != nil {
		return store.Meta{}, err
	}
	var meta store.Meta
	err = s.send(ctx, &op{ctx: ctx, budget: migrationBudget, fn: func(tx *wtx) error {
		if err := tx.execScript(createMigrationsTableSQL); err != nil {
			return wrap(err, "create flotilla_schema_migrations")
		}
		var current int
		if err := tx.queryRow(schemaVersionSQL).Scan(&current); err != nil {
			return wrap(err, "read the schema version")
		}
		if current > SchemaVersion {
			return &store.SchemaError{Database: current, Binary: SchemaVersion}
		}
		for _, m := range all[min(current, upTo):upTo] {
			if err := tx.execScript(m.sql); err != nil {
				return wrap(err, "apply migration %s", m.name)
			}
			if _, err := tx.exec(recordMigrationSQL, m.version); err != nil {
				return wrap(err, "record migration %s", m.name)
			}
		}
		var (
			fleet     int
			createdAt sql.NullInt64
		)
		err := tx.queryRow(readMetaSQL).Scan(&fleet, &createdAt)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			fleet = numBuckets
			if fleet == 0 {
				fleet = bucket.DefaultCount
			}
			createdAt = sql.NullInt64{Int64: tx.now.UnixMicro(), Valid: true}
			if _, err := tx.exec(`INSERT INTO flotilla_meta (singleton, num_buckets, created_at) VALUES (1, ?, ?)`,
				fleet, createdAt.Int64); err != nil {
				return wrap(err, "create the fleet")
			}
			if _, err := tx.exec(`WITH RECURSIVE b(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM b WHERE n + 1 < ?)
				INSERT INTO flotilla_bucket_leases (bucket) SELECT n FROM b`, fleet); err != nil {
				return wrap(err, "create the bucket leases")
			}
		case err != nil:
			return wrap(err, "read the fleet's metadata")
		case numBuckets != 0 && numBuckets != fleet:
			return &store.BucketCountError{Fleet: fleet, Requested: numBuckets}
		}
		meta = store.Meta{SchemaVersion: max(current, upTo), NumBuckets: fleet, CreatedAt: fromMicros(createdAt)}
		return nil
	}})
	if err != nil {
		return store.Meta{}, err
	}
	s.setNumBuckets(meta.NumBuckets)
	return meta, nil
}

// Meta reads the fleet's metadata, refusing a schema that is not
// SchemaVersion.
func (s *Store) Meta(ctx context.Context) (store.Meta, error) {
	if err := s.checkOpen(); err != nil {
		return store.Meta{}, err
	}
	var current int
	if err := s.rdb.QueryRowContext(ctx, schemaVersionSQL).Scan(&current); err != nil {
		if isNoSuchTable(err) {
			return store.Meta{}, &store.SchemaError{Database: 0, Binary: SchemaVersion}
		}
		return store.Meta{}, wrap(err, "read the schema version")
	}
	if current != SchemaVersion {
		return store.Meta{}, &store.SchemaError{Database: current, Binary: SchemaVersion}
	}
	var (
		fleet     int
		createdAt sql.NullInt64
	)
	if err := s.rdb.QueryRowContext(ctx, readMetaSQL).Scan(&fleet, &createdAt); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return store.Meta{}, &store.SchemaError{Database: 0, Binary: SchemaVersion}
		}
		return store.Meta{}, wrap(err, "read the fleet's metadata")
	}
	s.setNumBuckets(fleet)
	return store.Meta{SchemaVersion: current, NumBuckets: fleet, CreatedAt: fromMicros(createdAt)}, nil
}

// requireSchema refuses a file that has not been migrated, as every other
// store does before its tables exist.
func requireSchema(err error) error {
	if isNoSuchTable(err) {
		return &store.SchemaError{Database: 0, Binary: SchemaVersion}
	}
	return err
}
