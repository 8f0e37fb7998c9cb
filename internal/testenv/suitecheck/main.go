// Command suitecheck is what `make test` runs around the test suite:
//
//	suitecheck needs           # list what the suite needs and the machine lacks; exit 1 if anything
//	suitecheck identity FILE   # note the identity of the server FLOTILLA_TEST_DSN names in FILE
//	suitecheck same FILE       # exit 1 if that server is no longer the one FILE notes
//
// The last two prove that the suite left the machine's server alone: no
// restart, no reload of its configuration (see package testenv).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/internal/testenv"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

const usage = "usage: suitecheck needs | suitecheck identity FILE | suitecheck same FILE"

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	switch {
	case len(args) == 1 && args[0] == "needs":
		return needs(ctx, stdout, stderr)
	case len(args) == 2 && args[0] == "identity":
		return note(ctx, args[1], stderr)
	case len(args) == 2 && args[0] == "same":
		return same(ctx, args[1], stdout, stderr)
	}
	fmt.Fprintln(stderr, usage)
	return 2
}

func needs(ctx context.Context, stdout, stderr io.Writer) int {
	missing := testenv.Missing(ctx)
	if len(missing) == 0 {
		fmt.Fprintln(stdout, "suitecheck: the machine has everything the test suite needs")
		return 0
	}
	fmt.Fprintln(stderr, "make test needs what this machine lacks; nothing was run:")
	for _, m := range missing {
		fmt.Fprintln(stderr, "  - "+m)
	}
	return 1
}

// noted is what FILE holds: the server's DSN, redacted, and its identity;
// nothing when FLOTILLA_TEST_DSN is unset (the tests start a container of
// their own).
type noted struct {
	Server   string            `json:"server"`
	Identity *testenv.Identity `json:"identity"`
}

func note(ctx context.Context, path string, stderr io.Writer) int {
	var n noted
	if dsn := os.Getenv(testdb.EnvDSN); dsn != "" {
		id, err := testenv.ReadIdentity(ctx, dsn)
		if err != nil {
			fmt.Fprintf(stderr, "suitecheck: %v\n", err)
			return 1
		}
		n = noted{Server: testdb.Redact(dsn), Identity: &id}
	}
	b, _ := json.Marshal(n)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		fmt.Fprintf(stderr, "suitecheck: %v\n", err)
		return 1
	}
	return 0
}

func same(ctx context.Context, path string, stdout, stderr io.Writer) int {
	b, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintf(stderr, "suitecheck: %v\n", err)
		return 1
	}
	var before noted
	if err := json.Unmarshal(b, &before); err != nil {
		fmt.Fprintf(stderr, "suitecheck: %s: %v\n", path, err)
		return 1
	}
	dsn := os.Getenv(testdb.EnvDSN)
	if before.Identity == nil || testdb.Redact(dsn) != before.Server {
		if before.Identity != nil || dsn != "" {
			fmt.Fprintf(stderr, "suitecheck: %s noted server %q, and %s now names %q\n", path, before.Server, testdb.EnvDSN, testdb.Redact(dsn))
			return 1
		}
		return 0 // no server of the machine's: the tests used a container
	}
	after, err := testenv.ReadIdentity(ctx, dsn)
	if err != nil {
		fmt.Fprintf(stderr, "suitecheck: after the tests, %v\n", err)
		return 1
	}
	if change := before.Identity.Changes(after); change != "" {
		fmt.Fprintf(stderr, "make test: the PostgreSQL server %s is not the one the tests started with: %s. "+
			"The suite may only create and drop databases of its own there; "+
			"a test that restarts or reconfigures a server must start its own (testdb.StartServer).\n", before.Server, change)
		return 1
	}
	fmt.Fprintf(stdout, "suitecheck: the PostgreSQL server %s is the one the tests started with (%s)\n", before.Server, after)
	return 0
}
