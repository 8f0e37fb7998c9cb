package postgres

import (
	"errors"
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/flotilla-dev/flotilla/store"
)

// SQLSTATE codes this store reacts to.
const (
	codeUniqueViolation  = "23505"
	codeUndefinedTable   = "42P01"
	codeLockNotAvailable = "55P03"
)

// Names of the unique indexes whose violations mean something to callers.
const (
	uniqueKeyIndex    = "flotilla_tasks_unique_key_idx"
	scheduleTickIndex = "flotilla_tasks_schedule_tick_idx"
)

// uniqueValue finds the conflicting value in a unique violation's detail:
// "Key (unique_key)=(report-2026-11) already exists."
var uniqueValue = regexp.MustCompile(`\)=\((.*)\) already exists`)

// wrap translates a driver error into the store's vocabulary and adds what
// was being done: pgx.ErrNoRows becomes store.ErrNotFound and a unique
// violation store.ErrDuplicate. Other errors keep their cause for
// errors.Is/As (context.Canceled, net errors) but callers need not know pgx.
func wrap(err error, what string, args ...any) error {
	if err == nil {
		return nil
	}
	doing := fmt.Sprintf(what, args...)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%s: %w", doing, store.ErrNotFound)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if pgErr.Code == codeUniqueViolation {
			return fmt.Errorf("%s: %w (%s)", doing, store.ErrDuplicate, pgErr.Detail)
		}
		if pgErr.Code == codeLockNotAvailable {
			return fmt.Errorf("%s: %w", doing, store.ErrBusy)
		}
		// The PgError itself stays out of the chain: its fields are
		// PostgreSQL's, and the message says everything a person needs.
		return fmt.Errorf("%s: %s (SQLSTATE %s)", doing, pgErr.Message, pgErr.Code)
	}
	return fmt.Errorf("%s: %w", doing, err)
}

// pgCode returns the SQLSTATE of a PostgreSQL error, or "".
func pgCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// uniqueViolation returns the index a unique violation is on and the
// conflicting value as PostgreSQL reports it, or ok false.
func uniqueViolation(err error) (index, value string, ok bool) {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != codeUniqueViolation {
		return "", "", false
	}
	if m := uniqueValue.FindStringSubmatch(pgErr.Detail); m != nil {
		value = m[1]
	}
	return pgErr.ConstraintName, value, true
}
