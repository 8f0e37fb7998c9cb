// Package testenv says what the test suite needs from the machine, and
// whether the machine's PostgreSQL server is the one it was.
//
// `make test` asks it first ([Missing]) and stops with one message that
// lists everything missing and how to get it, rather than failing test by
// test. Around the run it reads the identity of the server FLOTILLA_TEST_DSN
// names ([ReadIdentity]) before and after, and fails if it changed: the
// suite creates and drops databases there and does nothing else to it (a
// test that restarts or reconfigures a server starts its own, see
// testdb.StartServer).
package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/flotilla-dev/flotilla/internal/testdb"
)

// BrowserPaths are where a Chromium may be, Debian's first.
var BrowserPaths = []string{"/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome", "google-chrome-stable"}

// Browser returns the path of a Chromium, or an error that says how to
// install one.
func Browser() (string, error) {
	for _, p := range BrowserPaths {
		if path, err := exec.LookPath(p); err == nil {
			return path, nil
		}
	}
	return "", fmt.Errorf("no Chromium for the dashboard's browser test (looked for %s): apt-get install chromium",
		strings.Join(BrowserPaths, ", "))
}

// connectTimeout bounds the check that the server answers.
const connectTimeout = 10 * time.Second

// Missing returns everything the whole suite needs that this machine lacks,
// each with how to get it; none when the suite can run:
//
//   - a PostgreSQL server: the one FLOTILLA_TEST_DSN names, answering, or,
//     with it unset, Docker, for the tests to start one in a container;
//   - the PostgreSQL server binaries, for the tests that start servers of
//     their own (testdb.StartServer), and when run as root the postgres user
//     to run them as;
//   - Chromium, for the dashboard's browser test.
func Missing(ctx context.Context) []string {
	var missing []string
	if dsn := os.Getenv(testdb.EnvDSN); dsn != "" {
		if err := ping(ctx, dsn); err != nil {
			missing = append(missing, fmt.Sprintf("PostgreSQL: %s=%s does not answer (%v): start that server, "+
				"or set %s to one that runs (Debian: apt-get install postgresql)", testdb.EnvDSN, testdb.Redact(dsn), err, testdb.EnvDSN))
		}
	} else if err := dockerReachable(); err != nil {
		missing = append(missing, fmt.Sprintf("PostgreSQL: %s is unset and Docker is not reachable (%v): "+
			"run a PostgreSQL server that trusts the postgres user on 127.0.0.1:5432 (Debian: apt-get install postgresql), "+
			"set %s to a server you have (e.g. postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable), "+
			"or start Docker so the tests can run PostgreSQL in a container", testdb.EnvDSN, err, testdb.EnvDSN))
	}
	missing = append(missing, testdb.ServerPrerequisites()...)
	if _, err := Browser(); err != nil {
		missing = append(missing, err.Error())
	}
	return missing
}

func ping(ctx context.Context, dsn string) error {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

// dockerReachable is a cheap look for a Docker engine: DOCKER_HOST set, or
// the default socket there. testcontainers asks the engine itself when the
// tests start.
func dockerReachable() error {
	if os.Getenv("DOCKER_HOST") != "" {
		return nil
	}
	if _, err := os.Stat("/var/run/docker.sock"); err != nil {
		return errors.New("DOCKER_HOST is unset and there is no /var/run/docker.sock")
	}
	return nil
}

// Identity tells one life of a PostgreSQL server from another: a restart
// changes the postmaster and its start time, a reload of its configuration
// the time that was loaded.
type Identity struct {
	// PostmasterPID is 0 when the role may not read postmaster.pid (only
	// superusers and pg_read_server_files may).
	PostmasterPID int
	StartedAt     time.Time
	ConfLoadedAt  time.Time
}

func (id Identity) String() string {
	return fmt.Sprintf("postmaster pid %d, started %s, configuration loaded %s",
		id.PostmasterPID, id.StartedAt.UTC().Format(time.RFC3339Nano), id.ConfLoadedAt.UTC().Format(time.RFC3339Nano))
}

// Changes says how after differs from id, "" when it does not.
func (id Identity) Changes(after Identity) string {
	switch {
	case id.PostmasterPID != after.PostmasterPID || !id.StartedAt.Equal(after.StartedAt):
		return "the server was restarted (before: " + id.String() + "; after: " + after.String() + ")"
	case !id.ConfLoadedAt.Equal(after.ConfLoadedAt):
		return "the server's configuration was reloaded (before: " + id.String() + "; after: " + after.String() + ")"
	}
	return ""
}

// insufficientPrivilege is PostgreSQL's SQLSTATE for a function the role
// may not call.
const insufficientPrivilege = "42501"

// ReadIdentity reads the identity of the server dsn names.
func ReadIdentity(ctx context.Context, dsn string) (Identity, error) {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return Identity{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var id Identity
	err = conn.QueryRow(ctx, `SELECT split_part(pg_read_file('postmaster.pid'), E'\n', 1)::int,
		pg_postmaster_start_time(), pg_conf_load_time()`).Scan(&id.PostmasterPID, &id.StartedAt, &id.ConfLoadedAt)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == insufficientPrivilege {
		id.PostmasterPID = 0
		err = conn.QueryRow(ctx, `SELECT pg_postmaster_start_time(), pg_conf_load_time()`).Scan(&id.StartedAt, &id.ConfLoadedAt)
	}
	if err != nil {
		return Identity{}, fmt.Errorf("read the identity of %s: %w", testdb.Redact(dsn), err)
	}
	return id, nil
}
