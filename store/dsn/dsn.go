// Package dsn picks and opens a store from a data source name: a
// PostgreSQL URL (postgres://... or postgresql://...) opens the PostgreSQL
// store, sqlite:PATH or a path ending in .db the SQLite store. It is the
// one place that knows the forms, so that the client, the node and every
// command accept the same ones.
package dsn

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/postgres"
	"github.com/flotilla-dev/flotilla/store/sqlite"
)

// Default is the store used when none is named: the SQLite file
// flotilla.db in the working directory.
const Default = "sqlite:flotilla.db"

// Forms describes the accepted forms, for messages.
const Forms = "a PostgreSQL URL (postgres://user@host:5432/db or postgresql://...), " +
	"or an SQLite file (sqlite:PATH, or a path ending in .db)"

// Kind is the store a DSN names.
type Kind string

const (
	PostgreSQL Kind = "postgres"
	SQLite     Kind = "sqlite"
)

// Target is a parsed DSN.
type Target struct {
	Kind Kind
	// Path is the SQLite file's absolute path; "" for PostgreSQL.
	Path string
	url  string // the PostgreSQL URL, password and all: never print it
}

// InvalidError names a DSN of no accepted form (its password removed).
type InvalidError struct{ DSN string }

func (e *InvalidError) Error() string {
	return fmt.Sprintf("database %q is neither %s", e.DSN, Forms)
}

func (e *InvalidError) Is(target error) bool { return target == store.ErrInvalid }

// Parse reads a DSN. An SQLite path is made absolute against the working
// directory, so that every process started in one directory shares the
// file and logs say which file it is.
func Parse(s string) (Target, error) {
	switch {
	case strings.HasPrefix(s, "postgres://"), strings.HasPrefix(s, "postgresql://"):
		return Target{Kind: PostgreSQL, url: s}, nil
	case strings.HasPrefix(s, "sqlite:"):
		path := strings.TrimPrefix(s, "sqlite:")
		// sqlite:///abs/path and sqlite://rel are URL spellings of the same.
		if rest, ok := strings.CutPrefix(path, "//"); ok {
			path = rest
		}
		if path == "" {
			return Target{}, fmt.Errorf("database %q names no file: give sqlite:PATH, e.g. %s: %w", s, Default, store.ErrInvalid)
		}
		return sqliteTarget(path)
	case strings.HasSuffix(s, ".db") && !strings.Contains(s, "://") && !strings.Contains(s, "="):
		return sqliteTarget(s)
	}
	return Target{}, &InvalidError{DSN: redact(s)}
}

// redact removes a password from a DSN of any form, for messages.
func redact(s string) string {
	switch {
	case strings.Contains(s, "://"):
		u, err := url.Parse(s)
		if err != nil {
			return "[unparseable DSN]"
		}
		if u.User != nil {
			u.User = url.User(u.User.Username())
		}
		q := u.Query()
		if q.Has("password") {
			q.Del("password")
			u.RawQuery = q.Encode()
		}
		return u.String()
	case strings.Contains(s, "="):
		return postgres.Redact(s) // key=value
	}
	return s
}

func sqliteTarget(path string) (Target, error) {
	if strings.ContainsAny(path, "?#") {
		return Target{}, fmt.Errorf("SQLite file %q: a path with ? or # is not supported: give a plain file path: %w", path, store.ErrInvalid)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return Target{}, fmt.Errorf("SQLite file %q: %w", path, err)
	}
	return Target{Kind: SQLite, Path: abs}, nil
}

// String names the target for logs and messages, without a password.
func (t Target) String() string {
	if t.Kind == SQLite {
		return "sqlite:" + t.Path
	}
	return postgres.Redact(t.url)
}

// Ensure makes sure the database exists, and reports whether it created
// it: on PostgreSQL the database the URL names (see
// postgres.EnsureDatabase); on SQLite the file, whose directory must exist.
func (t Target) Ensure(ctx context.Context) (created bool, err error) {
	if t.Kind == PostgreSQL {
		return postgres.EnsureDatabase(ctx, t.url)
	}
	_, err = os.Stat(t.Path)
	switch {
	case err == nil:
		return false, nil
	case !errors.Is(err, os.ErrNotExist):
		return false, fmt.Errorf("SQLite file %s: %w", t.Path, err)
	}
	s, err := sqlite.New(ctx, t.Path)
	if err != nil {
		return false, err
	}
	s.Close()
	return true, nil
}

// Open opens the store. It does not migrate.
func (t Target) Open(ctx context.Context) (store.Store, error) {
	switch t.Kind {
	case PostgreSQL:
		return postgres.New(ctx, t.url)
	case SQLite:
		return sqlite.New(ctx, t.Path)
	}
	return nil, fmt.Errorf("%w: no database named", store.ErrInvalid)
}

// OpenReadOnly opens the store for a reader that writes nothing: on SQLite
// the file is opened read-only and never created (a missing one is a
// *sqlite.NoFileError, which matches store.ErrSchema); on PostgreSQL it is
// Open. It does not migrate.
func (t Target) OpenReadOnly(ctx context.Context) (store.Store, error) {
	if t.Kind == SQLite {
		return sqlite.New(ctx, t.Path, sqlite.ReadOnly())
	}
	return t.Open(ctx)
}

// Exists reports whether the database is there to open, without creating
// it: on SQLite whether the file exists; PostgreSQL answers when connected,
// so it is taken to exist.
func (t Target) Exists() (bool, error) {
	if t.Kind != SQLite {
		return true, nil
	}
	_, err := os.Stat(t.Path)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, os.ErrNotExist):
		return false, nil
	}
	return false, fmt.Errorf("SQLite file %s: %w", t.Path, err)
}

// Open parses s and opens its store.
func Open(ctx context.Context, s string) (store.Store, error) {
	t, err := Parse(s)
	if err != nil {
		return nil, err
	}
	return t.Open(ctx)
}
