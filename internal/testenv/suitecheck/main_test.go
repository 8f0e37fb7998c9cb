package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flotilla-dev/flotilla/internal/patience"
	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/internal/testenv"
)

func TestMain(m *testing.M) { testdb.VerifyNoLeaks(m) }

func runCheck(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(t.Context(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestSameFailsAfterARestartOrAReload plays `make test` against a server of
// the test's own, standing for the machine's: the check passes when the
// server was left alone, and fails when it was restarted or its
// configuration reloaded during the run.
func TestSameFailsAfterARestartOrAReload(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL server; skipped by -short")
	}
	server := testdb.StartServer(t)
	t.Setenv(testdb.EnvDSN, server.New(t)) // any database of the server
	noted := filepath.Join(t.TempDir(), "identity.json")

	if code, _, stderr := runCheck(t, "identity", noted); code != 0 {
		t.Fatalf("identity exited %d: %s", code, stderr)
	}
	if code, stdout, stderr := runCheck(t, "same", noted); code != 0 || !strings.Contains(stdout, "pid "+strconv.Itoa(server.PID())) {
		t.Fatalf("same on an untouched server exited %d: %s%s", code, stdout, stderr)
	}

	server.Restart()
	code, _, stderr := runCheck(t, "same", noted)
	if code != 1 || !strings.Contains(stderr, "the server was restarted") {
		t.Errorf("same after a restart exited %d: %s; want 1, saying it was restarted", code, stderr)
	}

	if code, _, stderr := runCheck(t, "identity", noted); code != 0 {
		t.Fatalf("identity exited %d: %s", code, stderr)
	}
	reload(t, server.DSN())
	code, _, stderr = runCheck(t, "same", noted)
	if code != 1 || !strings.Contains(stderr, "configuration was reloaded") {
		t.Errorf("same after a reload exited %d: %s; want 1, saying the configuration was reloaded", code, stderr)
	}
}

// reload asks the server to reload its configuration and waits until it
// has (pg_reload_conf only signals the postmaster).
func reload(t *testing.T, dsn string) {
	t.Helper()
	before, err := testenv.ReadIdentity(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(t.Context(), "SELECT pg_reload_conf()"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(patience.Scale(30 * time.Second))
	for {
		after, err := testenv.ReadIdentity(t.Context(), dsn)
		if err == nil && !after.ConfLoadedAt.Equal(before.ConfLoadedAt) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server had not reloaded its configuration by the deadline (last error: %v)", err)
		}
		time.Sleep(50 * time.Millisecond) // polling, with the deadline above
	}
}

func TestSameWithoutAServerOfTheMachines(t *testing.T) {
	t.Setenv(testdb.EnvDSN, "")
	noted := filepath.Join(t.TempDir(), "identity.json")
	if code, _, stderr := runCheck(t, "identity", noted); code != 0 {
		t.Fatalf("identity exited %d: %s", code, stderr)
	}
	if code, _, stderr := runCheck(t, "same", noted); code != 0 {
		t.Errorf("same with no server noted exited %d: %s", code, stderr)
	}
	t.Setenv(testdb.EnvDSN, "postgres://postgres@127.0.0.1:1/postgres")
	if code, _, _ := runCheck(t, "same", noted); code != 1 {
		t.Errorf("same after %s changed exited %d, want 1", testdb.EnvDSN, code)
	}
}

func TestNeedsListsEverythingMissingInOneMessage(t *testing.T) {
	t.Setenv(testdb.EnvDSN, "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=5")
	t.Setenv(testdb.EnvServerBin, t.TempDir())
	code, _, stderr := runCheck(t, "needs")
	if code != 1 {
		t.Fatalf("needs exited %d, want 1:\n%s", code, stderr)
	}
	for _, want := range []string{"nothing was run", testdb.EnvDSN + "=", "does not answer", "lacks initdb, pg_ctl, postgres", "apt-get install postgresql"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("the message lacks %q:\n%s", want, stderr)
		}
	}
	if _, err := testenv.Browser(); err != nil && !strings.Contains(stderr, "apt-get install chromium") {
		t.Errorf("this machine has no browser, and the message does not say so:\n%s", stderr)
	}
	if n := strings.Count(stderr, "\n  - "); n < 2 {
		t.Errorf("%d items listed, want the server and its binaries at least:\n%s", n, stderr)
	}
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"what"}, {"same"}, {"identity", "a", "b"}} {
		if code, _, stderr := runCheck(t, args...); code != 2 || !strings.Contains(stderr, "usage:") {
			t.Errorf("suitecheck %v exited %d: %s; want 2 and the usage", args, code, stderr)
		}
	}
}
