package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/internal/tcpproxy"
	"github.com/flotilla-dev/flotilla/internal/testdb"
)

// TestFaultPostgresRestart restarts the PostgreSQL server under a working
// fleet. It breaks every connection to the server, other tests' included,
// so it runs alone, in a step of its own after all the others: `make
// test` skips it in its first `go test` and runs it in a second one (see
// the Makefile). It must never be skipped otherwise.
func TestFaultPostgresRestart(t *testing.T) {
	needsIntegration(t)
	restart := postgresRestarter(t)
	dsn := testdb.New(t)
	// Everything reaches the server through a proxy, so that a container
	// that comes back on another port is reached again: the proxy is
	// pointed at the new one. A local server keeps its address.
	proxy, err := tcpproxy.New(hostOf(t, dsn))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	r := newRigOn(t, newFleetOn(t, withHost(t, dsn, proxy.Addr())))
	r.schedule()
	a := nodeSpec{id: "a", buckets: "0-31"}
	b := nodeSpec{id: "b", buckets: "32-63"}
	r.startHolding(a)
	r.startHolding(b)

	const tasks = 3_000
	submitted := r.submitInBackground(probeLoad{
		tasks: tasks, minWork: 20 * time.Millisecond, maxWork: 500 * time.Millisecond, over: 20 * time.Second, batch: 50,
	}, "restart")
	r.waitUntilRunning("a", 5)
	r.waitUntilRunning("b", 5)

	restartedAt := time.Now()
	if addr := restart(); addr != proxy.Target() {
		proxy.SetTarget(addr)
	}
	restartTook := time.Since(restartedAt)
	// Both nodes are back: they hold their buckets again, renewed after
	// the restart.
	r.waitUntilHeld("a", mustSet(t, a.buckets), failoverWithin)
	r.waitUntilHeld("b", mustSet(t, b.buckets), failoverWithin)
	r.waitForRenewal("a", mustSet(t, a.buckets))
	r.waitForRenewal("b", mustSet(t, b.buckets))
	back := time.Since(restartedAt)
	r.fault(restartedAt, time.Now())
	for _, id := range []string{"a", "b"} {
		if r.rigNode(id).proc.exited() {
			t.Fatalf("node %s exited across the restart", id)
		}
	}

	submitted.wait()
	r.waitUntilSettled(tasks, settleWithin)
	fig := r.verify()
	t.Logf("figures: scenario=postgres-restart restart_took=%v nodes_serving_again_after=%v %s",
		restartTook.Round(time.Millisecond), back.Round(time.Millisecond), fig)
}

// restartLog is where every restart of a shared server is noted, with the
// time, so that a test that failed on another's machine at that moment
// can be explained.
const restartLog = "/tmp/flotilla-pg-restarts.log"

// postgresRestarter returns a function that restarts the test server and
// returns its address (host:port) afterwards. With FLOTILLA_TEST_DSN set,
// the server must be a local Debian cluster (pg_ctlcluster), as on CI;
// otherwise it is this process's container. Anything else fails the test:
// it cannot restart a server it does not control.
func postgresRestarter(t *testing.T) func() string {
	t.Helper()
	admin := os.Getenv(testdb.EnvDSN)
	if admin == "" {
		return func() string {
			t.Helper()
			note(t, "container")
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			dsn, err := testdb.RestartContainer(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return hostOf(t, dsn)
		}
	}
	addr := hostOf(t, admin)
	host, port, _ := net.SplitHostPort(addr)
	if host != "127.0.0.1" && host != "localhost" && host != "::1" {
		t.Fatalf("%s names %s: this test restarts the server, so it must be a local cluster (pg_ctlcluster) or, with %s unset, a container",
			testdb.EnvDSN, addr, testdb.EnvDSN)
	}
	ctl, err := exec.LookPath("pg_ctlcluster")
	if err != nil {
		t.Fatalf("pg_ctlcluster is not installed: this test restarts the local server with it")
	}
	version := clusterVersion(t, port)
	return func() string {
		t.Helper()
		note(t, "cluster "+version+"/main")
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, ctl, "--skip-systemctl-redirect", version, "main", "restart").CombinedOutput()
		if err != nil {
			t.Fatalf("pg_ctlcluster %s main restart: %v\n%s", version, err, out)
		}
		return addr
	}
}

// clusterVersion finds the version of the Debian cluster "main" that
// listens on port, from /etc/postgresql/<version>/main/postgresql.conf.
func clusterVersion(t *testing.T, port string) string {
	t.Helper()
	confs, _ := filepath.Glob("/etc/postgresql/*/main/postgresql.conf")
	portRE := regexp.MustCompile(`(?m)^\s*port\s*=\s*(\d+)`)
	var seen []string
	for _, conf := range confs {
		version := filepath.Base(filepath.Dir(filepath.Dir(conf)))
		b, err := os.ReadFile(conf)
		if err != nil {
			continue
		}
		p := "5432"
		if m := portRE.FindSubmatch(b); m != nil {
			p = string(m[1])
		}
		seen = append(seen, version+" (port "+p+")")
		if p == port {
			return version
		}
	}
	t.Fatalf("no cluster main in /etc/postgresql listens on port %s (found: %s)", port, strings.Join(seen, ", "))
	return ""
}

// note appends the restart's time to restartLog.
func note(t *testing.T, what string) {
	t.Helper()
	f, err := os.OpenFile(restartLog, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Logf("cannot note the restart in %s: %v", restartLog, err)
		return
	}
	defer f.Close()
	_, _ = fmt.Fprintf(f, "%s restart of PostgreSQL (%s) by %s\n", time.Now().UTC().Format(time.RFC3339), what, t.Name())
}
