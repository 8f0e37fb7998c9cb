package testdb

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// needsServerBinaries skips private-server tests under -short, which
// starts no process.
func needsServerBinaries(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a PostgreSQL server; skipped by -short")
	}
}

// identity is what tells one life of a server from the next.
type identity struct {
	pid       int
	startedAt time.Time
}

func identityOf(t *testing.T, conn *pgx.Conn) identity {
	t.Helper()
	var id identity
	var pidLine string
	err := conn.QueryRow(t.Context(),
		`SELECT split_part(pg_read_file('postmaster.pid'), E'\n', 1), pg_postmaster_start_time()`).Scan(&pidLine, &id.startedAt)
	if err != nil {
		t.Fatalf("read the server's identity: %v", err)
	}
	if id.pid, err = strconv.Atoi(pidLine); err != nil {
		t.Fatalf("postmaster.pid starts with %q", pidLine)
	}
	return id
}

func TestServerIsPrivateAndGoneAfterItsTest(t *testing.T) {
	t.Parallel()
	needsServerBinaries(t)
	var (
		pid  int
		dir  string
		addr string
	)
	t.Run("runs a server", func(t *testing.T) {
		s := StartServer(t)
		pid, dir, addr = s.PID(), s.DataDir(), s.Addr()
		if !strings.HasPrefix(addr, "127.0.0.1:") || s.Port() == 5432 {
			t.Errorf("the server listens on %s, want a free loopback port", addr)
		}
		conn := connect(t, s.DSN())
		if got := identityOf(t, conn).pid; got != pid {
			t.Errorf("the server says its postmaster is pid %d, the helper says %d", got, pid)
		}
		if got := queryRow[string](t, conn, "SHOW data_directory"); got != dir {
			t.Errorf("data_directory = %s, want %s", got, dir)
		}
		if got := queryRow[string](t, conn, "SHOW unix_socket_directories"); got != "" {
			t.Errorf("unix_socket_directories = %q, want none: the server is reached by TCP only", got)
		}
		// Root may not run PostgreSQL: the server runs as postgres then.
		if os.Geteuid() == 0 {
			status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
			if err != nil {
				t.Fatal(err)
			}
			cred, err := serverCredential()
			if err != nil {
				t.Fatal(err)
			}
			want := "\nUid:\t" + strconv.Itoa(int(cred.Uid)) + "\t"
			if !strings.Contains(string(status), want) {
				t.Errorf("the postmaster does not run as the %s user:\n%s", serverUser, status)
			}
		}
		// A database of the test's own on it, as on the shared server.
		name := queryRow[string](t, connect(t, s.New(t)), "SELECT current_database()")
		if !strings.HasPrefix(name, NamePrefix) {
			t.Errorf("Server.New gave database %q, want one starting with %s", name, NamePrefix)
		}
	})
	if pid == 0 {
		t.Fatal("the subtest started no server")
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("the postmaster (pid %d) is still there after its test: kill 0 says %v", pid, err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the data directory %s is still there after its test (%v)", dir, err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if conn, err := pgx.Connect(ctx, "postgres://postgres@"+addr+"/postgres?sslmode=disable"); err == nil {
		_ = conn.Close(ctx)
		t.Errorf("%s still accepts connections after its test", addr)
	}
}

func TestServerRestartBreaksConnectionsAndKeepsDataAndPort(t *testing.T) {
	t.Parallel()
	needsServerBinaries(t)
	s := StartServer(t)
	conn := connect(t, s.DSN())
	if _, err := conn.Exec(t.Context(), "CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)"); err != nil {
		t.Fatal(err)
	}
	before := identityOf(t, conn)
	port := s.Port()

	s.Restart()
	if _, err := conn.Exec(t.Context(), "SELECT 1"); err == nil {
		t.Error("a connection made before the restart still works after it")
	}
	if s.Port() != port {
		t.Errorf("port %d after the restart, %d before", s.Port(), port)
	}
	again := connect(t, s.DSN())
	after := identityOf(t, again)
	if after.pid != s.PID() || after.pid == before.pid || !after.startedAt.After(before.startedAt) {
		t.Errorf("identity before the restart %+v, after %+v (helper's pid %d): want a new postmaster", before, after, s.PID())
	}
	if v := queryRow[int](t, again, "SELECT v FROM kept"); v != 42 {
		t.Errorf("after the restart the table holds %d, want 42", v)
	}
}

func TestServerStopAndStart(t *testing.T) {
	t.Parallel()
	needsServerBinaries(t)
	s := StartServer(t)
	s.Stop()
	if s.PID() != 0 {
		t.Errorf("PID = %d while stopped, want 0", s.PID())
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if conn, err := pgx.Connect(ctx, s.DSN()); err == nil {
		_ = conn.Close(ctx)
		t.Fatal("a stopped server accepts connections")
	}
	s.Start()
	queryRow[int](t, connect(t, s.DSN()), "SELECT 1")
}

func TestServerKillIsACrashThatStartRecoversFrom(t *testing.T) {
	t.Parallel()
	needsServerBinaries(t)
	s := StartServer(t)
	conn := connect(t, s.DSN())
	// Committed just before the crash, with nothing made durable by
	// fsync: a kill -9 of the server must not lose it.
	if _, err := conn.Exec(t.Context(), "CREATE TABLE kept (v int); INSERT INTO kept SELECT generate_series(1, 1000)"); err != nil {
		t.Fatal(err)
	}
	pid := s.PID()
	s.Kill()
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("the killed postmaster (pid %d) is still there: %v", pid, err)
	}
	if left := s.processes(); len(left) > 0 {
		t.Errorf("processes %v of the killed server are left", left)
	}
	if _, err := conn.Exec(t.Context(), "SELECT 1"); err == nil {
		t.Error("a connection made before the kill still works after it")
	}
	s.Start()
	if !strings.Contains(s.Log(), "database system was interrupted") &&
		!strings.Contains(s.Log(), "was not properly shut down") {
		t.Errorf("the start after the kill did not recover from a crash; server log:\n%s", s.Log())
	}
	if n := queryRow[int](t, connect(t, s.DSN()), "SELECT count(*)::int FROM kept"); n != 1000 {
		t.Errorf("after the crash the table holds %d rows, want the 1000 committed", n)
	}
}

func TestCompareVersions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		a, b string
		want int // its sign
	}{
		{"15", "9.6", 1},
		{"9.6", "10", -1},
		{"16", "16", 0},
		{"15", "x", 1},
	}
	for _, tt := range tests {
		got := compareVersions(tt.a, tt.b)
		if (got > 0) != (tt.want > 0) || (got < 0) != (tt.want < 0) {
			t.Errorf("compareVersions(%s, %s) = %d, want the sign of %d", tt.a, tt.b, got, tt.want)
		}
	}
}
