package testdb

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) {
	VerifyNoLeaks(m)
}

// needsServer skips database tests under -short, which runs unit tests only.
func needsServer(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs PostgreSQL; skipped by -short")
	}
}

// connect opens a connection to dsn that is closed when the test ends.
func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect to %s: %v", Redact(dsn), err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func queryRow[T any](t *testing.T, conn *pgx.Conn, sql string, args ...any) T {
	t.Helper()
	var v T
	if err := conn.QueryRow(t.Context(), sql, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

func TestNewGivesEmptyConnectableDatabase(t *testing.T) {
	needsServer(t)
	conn := connect(t, New(t))

	name := queryRow[string](t, conn, "SELECT current_database()")
	if !strings.HasPrefix(name, NamePrefix) || len(name) != len(NamePrefix)+16 {
		t.Errorf("database name = %q, want %s followed by 16 hex digits", name, NamePrefix)
	}
	relations := queryRow[int](t, conn, `
		SELECT count(*)::int FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'`)
	if relations != 0 {
		t.Errorf("new database has %d relations outside the system schemas, want 0", relations)
	}
	if _, err := conn.Exec(t.Context(), "CREATE TABLE t (id bigint PRIMARY KEY)"); err != nil {
		t.Errorf("create a table in the new database: %v", err)
	}
}

func TestNewGivesDifferentDatabases(t *testing.T) {
	needsServer(t)
	dsn1, dsn2 := New(t), New(t)
	if dsn1 == dsn2 {
		t.Fatalf("two calls to New returned the same DSN %s", Redact(dsn1))
	}
	name1 := queryRow[string](t, connect(t, dsn1), "SELECT current_database()")
	name2 := queryRow[string](t, connect(t, dsn2), "SELECT current_database()")
	if name1 == name2 {
		t.Errorf("two calls to New gave the same database %s", name1)
	}
}

func TestNewInParallel(t *testing.T) {
	needsServer(t)
	var (
		mu    sync.Mutex
		names = map[string]bool{}
	)
	for i := range 4 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			name := queryRow[string](t, connect(t, New(t)), "SELECT current_database()")
			mu.Lock()
			defer mu.Unlock()
			if names[name] {
				t.Errorf("database %s given twice", name)
			}
			names[name] = true
		})
	}
}

func TestDatabaseDroppedAfterTest(t *testing.T) {
	needsServer(t)
	var (
		name string
		open *pgx.Conn
	)
	t.Run("uses a database", func(t *testing.T) {
		dsn := New(t)
		var err error
		// Left open on purpose: the drop must not wait for it.
		open, err = pgx.Connect(t.Context(), dsn)
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		name = queryRow[string](t, open, "SELECT current_database()")
	})
	if open != nil {
		defer func() { _ = open.Close(context.Background()) }() // its database is gone
	}
	if name == "" {
		t.Fatal("subtest failed before creating its database")
	}

	admin, err := adminDSN()
	if err != nil {
		t.Fatal(err)
	}
	n := queryRow[int](t, connect(t, admin), "SELECT count(*)::int FROM pg_database WHERE datname = $1", name)
	if n != 0 {
		t.Errorf("database %s still exists after its test ended", name)
	}
}

func TestMissingNamesADatabaseToCreateAndDropsIt(t *testing.T) {
	needsServer(t)
	admin, err := adminDSN()
	if err != nil {
		t.Fatal(err)
	}
	conn := connect(t, admin)
	exists := func(name string) bool {
		return queryRow[int](t, conn, "SELECT count(*)::int FROM pg_database WHERE datname = $1", name) == 1
	}
	var name string
	t.Run("creates it", func(t *testing.T) {
		dsn := Missing(t)
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		name = cfg.Database
		if !strings.HasPrefix(name, NamePrefix) || exists(name) {
			t.Fatalf("Missing gave database %q, want a new name starting with %s that does not exist", name, NamePrefix)
		}
		if _, err := conn.Exec(t.Context(), "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
			t.Fatal(err)
		}
	})
	if name == "" {
		t.Fatal("subtest failed before naming its database")
	}
	if exists(name) {
		t.Errorf("database %s still exists after its test ended", name)
	}
}

// TestNoServerFails checks that New fails, and does not skip, when
// FLOTILLA_TEST_DSN is unset and Docker cannot be reached. It runs
// TestNoServerHelper in a child process with DOCKER_HOST pointing nowhere.
func TestNoServerFails(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a child test process")
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestNoServerHelper$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(),
		EnvDSN+"=",
		"DOCKER_HOST=unix:///nonexistent/docker.sock",
		"TESTDB_NO_SERVER_HELPER=1",
	)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("child test passed, want it to fail; output:\n%s", out)
	}
	if !strings.Contains(string(out), noServerMessage) {
		t.Errorf("child output lacks %q:\n%s", noServerMessage, out)
	}
	if strings.Contains(string(out), "--- SKIP") {
		t.Errorf("child test skipped, want it to fail:\n%s", out)
	}
}

func TestNoServerHelper(t *testing.T) {
	if os.Getenv("TESTDB_NO_SERVER_HELPER") != "1" {
		return // only runs as the child of TestNoServerFails
	}
	New(t)
	t.Error("New returned without a server")
}
