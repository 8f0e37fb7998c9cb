//go:build failover

package testdb_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flotilla-dev/flotilla/internal/testdb"
)

// primaryPort connects through the multi-host URI and returns the port of
// the server that answered, which must not be in recovery.
func primaryPort(t *testing.T, uri string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, uri)
	if err != nil {
		t.Fatalf("connect to %s: %v", testdb.Redact(uri), err)
	}
	defer conn.Close(ctx)
	var port int
	var inRecovery bool
	if err := conn.QueryRow(ctx, "SELECT current_setting('port')::int, pg_is_in_recovery()").Scan(&port, &inRecovery); err != nil {
		t.Fatal(err)
	}
	if inRecovery {
		t.Fatalf("the multi-host URI reached port %d, a standby", port)
	}
	return port
}

func TestHAClusterFailsOverAndTheURIFollowsThePrimary(t *testing.T) {
	c := testdb.StartHACluster(t)
	uri := c.URI()
	if !strings.Contains(uri, ",") || !strings.Contains(uri, "target_session_attrs=read-write") {
		t.Fatalf("URI %q is not a multi-host read-write URI", uri)
	}
	first := c.Primary()
	if got := primaryPort(t, uri); got != first.Port {
		t.Fatalf("the URI reached port %d, want the primary %s on %d", got, first.Name, first.Port)
	}

	second := c.Failover()
	if second.Name == first.Name {
		t.Fatalf("failover left %s primary", first.Name)
	}
	if got := primaryPort(t, uri); got != second.Port {
		t.Fatalf("after a failover the URI reached port %d, want the new primary %s on %d", got, second.Name, second.Port)
	}

	killed := c.KillPrimary()
	t.Logf("killed the postmaster of %s", killed.Name)
	c.WaitForWritable()
	c.WaitForPrimaryAndSecondary()
	t.Logf("after the kill, %s is primary", c.Primary().Name)
	if got, want := primaryPort(t, uri), c.Primary().Port; got != want {
		t.Fatalf("after the kill the URI reached port %d, want the primary on %d", got, want)
	}
}

// TestHAClusterPromotesTheStandbyWhenThePrimaryNodeIsLost kills every
// process of the primary's node, keeper included, and waits for the
// monitor to promote the standby.
func TestHAClusterPromotesTheStandbyWhenThePrimaryNodeIsLost(t *testing.T) {
	c := testdb.StartHACluster(t)
	uri := c.URI()
	lost := c.KillPrimaryNode()
	began := time.Now()
	promoted := c.WaitForPrimary(lost)
	t.Logf("killed every process of %s; %s promoted after %v", lost.Name, promoted.Name, time.Since(began))
	c.WaitForWritable()
	if got := primaryPort(t, uri); got != promoted.Port {
		t.Fatalf("the URI reached port %d, want the promoted %s on %d", got, promoted.Name, promoted.Port)
	}
}
