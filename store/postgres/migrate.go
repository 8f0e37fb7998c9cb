package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
)

// SchemaVersion is the schema version this binary knows: the number of the
// last file in migrations/.
const SchemaVersion = 11

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrationLock is the pg_advisory_xact_lock key that serialises Migrate
// across processes ("flotilla" in ASCII, as a number).
const migrationLock int64 = 0x666c6f74696c6c61

type migration struct {
	version int
	name    string
	sql     string
}

// migrations returns the embedded migrations in version order. Their names
// are NNNN_description.sql, numbered from 1 without gaps.
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
			return nil, fmt.Errorf("migration %s: the name must start with its number", e.Name())
		}
		body, err := migrationFiles.ReadFile(path.Join("migrations", e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, migration{version: v, name: e.Name(), sql: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	for i, m := range out {
		if m.version != i+1 {
			return nil, fmt.Errorf("migration %s: expected number %d", m.name, i+1)
		}
	}
	if len(out) != SchemaVersion {
		return nil, fmt.Errorf("%d migrations are embedded but SchemaVersion is %d", len(out), SchemaVersion)
	}
	return out, nil
}

const (
	noStatementTimeoutSQL = `SET LOCAL statement_timeout = 0`

	lockMigrationsSQL = `SELECT pg_advisory_xact_lock($1)`

	createMigrationsTableSQL = `
CREATE TABLE IF NOT EXISTS flotilla_schema_migrations (
    version    int         PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT statement_timestamp()
)`

	schemaVersionSQL = `SELECT coalesce(max(version), 0) FROM flotilla_schema_migrations`

	recordMigrationSQL = `INSERT INTO flotilla_schema_migrations (version) VALUES ($1)`

	readMetaSQL = `SELECT num_buckets, created_at FROM flotilla_meta`

	// createFleetSQL writes the fleet's metadata and one free lease row per
	// bucket, in one statement.
	createFleetSQL = `
WITH meta AS (
    INSERT INTO flotilla_meta (num_buckets) VALUES ($1)
    RETURNING num_buckets, created_at
), leases AS (
    INSERT INTO flotilla_bucket_leases (bucket)
    SELECT generate_series(0, $1 - 1)
)
SELECT num_buckets, created_at FROM meta`
)

// Migrate brings the schema to SchemaVersion and, on a new database, fixes
// the fleet's bucket count (0 means bucket.DefaultCount). Everything happens
// in one transaction under an advisory lock: two processes migrating at once
// wait for each other, and a failure leaves the database as it was.
func (s *Store) Migrate(ctx context.Context, numBuckets int) (store.Meta, error) {
	if numBuckets < 0 || numBuckets > bucket.MaxCount {
		return store.Meta{}, fmt.Errorf("bucket count %d: a fleet has between %d and %d buckets: %w",
			numBuckets, bucket.MinCount, bucket.MaxCount, store.ErrInvalid)
	}
	all, err := migrations()
	if err != nil {
		return store.Meta{}, err
	}

	var (
		meta    store.Meta
		applied bool
	)
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// A migration may rewrite large tables: the store's statement
		// timeout, meant for the hot path, does not apply to it.
		if _, err := tx.Exec(ctx, noStatementTimeoutSQL); err != nil {
			return wrap(err, "lift the statement timeout")
		}
		if _, err := tx.Exec(ctx, lockMigrationsSQL, migrationLock); err != nil {
			return wrap(err, "take the migration lock")
		}
		if _, err := tx.Exec(ctx, createMigrationsTableSQL); err != nil {
			return wrap(err, "create flotilla_schema_migrations")
		}
		var current int
		if err := tx.QueryRow(ctx, schemaVersionSQL).Scan(&current); err != nil {
			return wrap(err, "read the schema version")
		}
		if current > SchemaVersion {
			return &store.SchemaError{Database: current, Binary: SchemaVersion}
		}
		for _, m := range all[current:] {
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return wrap(err, "apply migration %s", m.name)
			}
			if _, err := tx.Exec(ctx, recordMigrationSQL, m.version); err != nil {
				return wrap(err, "record migration %s", m.name)
			}
			applied = true
		}

		var (
			fleet     int
			createdAt time.Time
		)
		err := tx.QueryRow(ctx, readMetaSQL).Scan(&fleet, &createdAt)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			count := numBuckets
			if count == 0 {
				count = bucket.DefaultCount
			}
			if err := tx.QueryRow(ctx, createFleetSQL, count).Scan(&fleet, &createdAt); err != nil {
				return wrap(err, "create the fleet")
			}
		case err != nil:
			return wrap(err, "read the fleet's metadata")
		case numBuckets != 0 && numBuckets != fleet:
			return &store.BucketCountError{Fleet: fleet, Requested: numBuckets}
		}
		meta = store.Meta{SchemaVersion: SchemaVersion, NumBuckets: fleet, CreatedAt: createdAt.UTC()}
		return nil
	})
	if err != nil {
		return store.Meta{}, err
	}
	s.setNumBuckets(meta.NumBuckets)
	if applied {
		// The open connections prepared their hot statements against the
		// schema as it was, or could not: their successors prepare them
		// against this one.
		s.pool.Reset()
		s.leases.Reset()
	}
	return meta, nil
}

// Meta reads the fleet's metadata, refusing a schema that is not
// SchemaVersion.
func (s *Store) Meta(ctx context.Context) (store.Meta, error) {
	var current int
	if err := s.pool.QueryRow(ctx, schemaVersionSQL).Scan(&current); err != nil {
		if pgCode(err) == codeUndefinedTable {
			return store.Meta{}, &store.SchemaError{Database: 0, Binary: SchemaVersion}
		}
		return store.Meta{}, wrap(err, "read the schema version")
	}
	if current != SchemaVersion {
		return store.Meta{}, &store.SchemaError{Database: current, Binary: SchemaVersion}
	}
	var (
		fleet     int
		createdAt time.Time
	)
	if err := s.pool.QueryRow(ctx, readMetaSQL).Scan(&fleet, &createdAt); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			// Migrations ran but the fleet row is missing: only a
			// half-restored database looks like this.
			return store.Meta{}, &store.SchemaError{Database: 0, Binary: SchemaVersion}
		}
		return store.Meta{}, wrap(err, "read the fleet's metadata")
	}
	s.setNumBuckets(fleet)
	return store.Meta{SchemaVersion: current, NumBuckets: fleet, CreatedAt: createdAt.UTC()}, nil
}

func (s *Store) setNumBuckets(n int) {
	s.mu.Lock()
	s.numBuckets = n
	s.mu.Unlock()
}

// fleetSize returns the fleet's bucket count, reading it once.
func (s *Store) fleetSize(ctx context.Context) (int, error) {
	s.mu.Lock()
	n := s.numBuckets
	s.mu.Unlock()
	if n > 0 {
		return n, nil
	}
	meta, err := s.Meta(ctx)
	if err != nil {
		return 0, err
	}
	return meta.NumBuckets, nil
}
