// Package testdb gives tests their own PostgreSQL database.
//
// Each call to [New] creates a fresh, empty database named
// flotilla_test_<random hex> and drops it (WITH (FORCE)) when the test ends,
// so tests and test packages can run in parallel against one server.
//
// The server is taken from the FLOTILLA_TEST_DSN environment variable, for
// example
//
//	FLOTILLA_TEST_DSN='postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable'
//
// It may name any database of the server: the databases are created and
// dropped from its maintenance database, postgres, which every server has.
// The role in that DSN must be allowed to create databases. When the
// variable is unset (or empty), the first call to New starts one PostgreSQL
// container per test process with testcontainers-go; that needs a reachable
// Docker engine. With neither, New fails the test: it never skips.
//
// A package whose tests use New should let testdb own its TestMain, so that
// a container, if one was started, is terminated when the tests finish:
//
//	func TestMain(m *testing.M) {
//		testdb.VerifyNoLeaks(m) // runs the tests, terminates the container, checks for goroutine leaks
//	}
//
// or, without the goroutine leak check,
//
//	func TestMain(m *testing.M) {
//		os.Exit(testdb.Run(m))
//	}
//
// Tests must close every pool and connection they open (for example with
// t.Cleanup(pool.Close) registered after New, so it runs before the drop).
// Under -short, which runs the unit tests only, New, Missing and
// StartServer skip the test: `go test -short ./...` needs no PostgreSQL.
//
// A test that stops, restarts, kills, partitions or fills a server does
// not do it to that one, which others use: it starts a server of its own
// with [StartServer].
package testdb

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvDSN names the environment variable holding the DSN of the PostgreSQL
// server that tests create their databases on.
const EnvDSN = "FLOTILLA_TEST_DSN"

// NamePrefix starts the name of every database that New creates.
const NamePrefix = "flotilla_test_"

// adminTimeout bounds each admin connection: connect, one statement, close.
// DROP DATABASE checkpoints, and on a loaded 2-core machine, with a dozen
// test databases being dropped at once, one has been seen to take longer
// than 10 s.
const adminTimeout = 60 * time.Second

// noServerMessage is the failure reported when there is no server to use.
const noServerMessage = "set " + EnvDSN + " to a PostgreSQL server " +
	"(e.g. postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable), " +
	"or run Docker so the tests can start one"

// New creates a fresh, empty database for the test and returns its DSN.
// The database is dropped, even if connections to it remain open, when the
// test and its subtests have finished (t.Cleanup).
func New(t testing.TB) string {
	t.Helper()
	skipIfShort(t)
	admin, err := adminDSN()
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	name, dsn := reserve(t, admin)
	create(t, admin, name)
	return dsn
}

// create creates the database name on the server of admin.
func create(t testing.TB, admin, name string) {
	t.Helper()
	ident := pgx.Identifier{name}.Sanitize()
	if err := adminExec(admin, "CREATE DATABASE "+ident+" TEMPLATE template0"); err != nil {
		t.Fatalf("testdb: create database %s on %s: %v", name, Redact(admin), err)
	}
}

// Missing returns the DSN of a database with a fresh name that does not
// exist yet, for tests of what creates it. Whatever creates it, it is
// dropped when the test has finished, like one of New.
func Missing(t testing.TB) string {
	t.Helper()
	skipIfShort(t)
	admin, err := adminDSN()
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	_, dsn := reserve(t, admin)
	return dsn
}

// skipIfShort skips the test under -short, which starts no server and
// reaches none.
func skipIfShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs PostgreSQL; skipped by -short")
	}
}

// reserve draws a database name, registers its drop on the server of
// admin, and returns the name and the DSN that names it.
func reserve(t testing.TB, admin string) (name, dsn string) {
	t.Helper()
	name, dsn = draw(t, admin)
	ident := pgx.Identifier{name}.Sanitize()
	t.Cleanup(func() {
		if err := adminExec(admin, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
			t.Errorf("testdb: drop database %s on %s: %v", name, Redact(admin), err)
		}
	})
	return name, dsn
}

// draw returns a fresh database name and the DSN of admin that names it.
func draw(t testing.TB, admin string) (name, dsn string) {
	t.Helper()
	name = NamePrefix + randomHex(8)
	dsn, err := withDatabase(admin, name)
	if err != nil {
		t.Fatalf("testdb: %s: %v", Redact(admin), err)
	}
	return name, dsn
}

// adminDSN returns the DSN of the maintenance database of the server to
// create databases on: the one FLOTILLA_TEST_DSN names, or else this
// process's container.
func adminDSN() (string, error) {
	dsn := os.Getenv(EnvDSN)
	if dsn == "" {
		var err error
		if dsn, err = containerDSN(); err != nil {
			return "", err
		}
	}
	admin, err := withDatabase(dsn, maintenanceDatabase)
	if err != nil {
		return "", fmt.Errorf("%s=%s: %w", EnvDSN, Redact(dsn), err)
	}
	return admin, nil
}

// maintenanceDatabase is the database every PostgreSQL server has, which
// createdb connects to as well.
const maintenanceDatabase = "postgres"

// adminExec runs one statement on a connection of its own to dsn.
func adminExec(dsn, sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()

	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	_, err = conn.Exec(ctx, sql)
	if cerr := conn.Close(ctx); err == nil && cerr != nil {
		err = fmt.Errorf("close: %w", cerr)
	}
	return err
}
