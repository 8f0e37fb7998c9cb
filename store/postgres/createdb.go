package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// EnsureDatabase creates the database dsn names if it does not exist yet,
// connecting to the server's "postgres" database to do so, and reports
// whether it created it. It is for `worker migrate`, so that setting up a
// fleet on a fresh server is one command; it needs the CREATEDB privilege
// only when the database is missing.
func EnsureDatabase(ctx context.Context, dsn string) (created bool, err error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return false, parseError(dsn, err)
	}
	name := cfg.Database
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err == nil {
		return false, conn.Close(ctx)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "3D000" { // invalid_catalog_name
		return false, fmt.Errorf("cannot reach PostgreSQL at %s/%s: %w", cfg.Host, name, err)
	}
	admin := cfg.Copy()
	admin.Database = "postgres"
	conn, err = pgx.ConnectConfig(ctx, admin)
	if err != nil {
		return false, fmt.Errorf("database %q does not exist, and creating it needs a connection to the "+
			"server's postgres database, which failed: %w", name, err)
	}
	defer conn.Close(ctx)
	// Nodes started together on a fresh server all find the database
	// missing and all create it: one succeeds, and the others learn that
	// it exists from their error (see createdMeanwhile).
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	if createdMeanwhile(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("creating database %q: %w", name, wrapCreate(err))
	}
	return true, nil
}

// createdMeanwhile reports whether CREATE DATABASE failed because another
// session created the database first. PostgreSQL answers duplicate_database
// only when the other creation had committed before this one looked; when
// both were under way at once, the loser fails on pg_database's unique index
// with a unique violation (seen with 4 or 5 of 6 nodes started together).
func createdMeanwhile(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return pgErr.Code == "42P04" || // duplicate_database
		(pgErr.Code == "23505" && pgErr.ConstraintName == "pg_database_datname_index") // unique_violation
}

func wrapCreate(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
		return fmt.Errorf("%w (the user may not create databases: create it, or grant CREATEDB)", err)
	}
	return err
}
