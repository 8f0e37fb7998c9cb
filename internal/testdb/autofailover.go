package testdb

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flotilla-dev/flotilla/internal/patience"
)

// An HACluster is a highly available PostgreSQL of one test's own, run by
// pg_auto_failover: a monitor and two nodes (a primary and its standby, in
// synchronous replication) on free loopback ports, in a temporary directory
// owned by the server's user (see [StartServer]). Everything it started is
// ended, and its files removed, when the test ends.
//
// Its methods must be called from the test's goroutine: they fail the test.
type HACluster struct {
	t       testing.TB
	bin     string // the PostgreSQL binaries pg_autoctl runs
	autoctl string // pg_autoctl
	dir     string
	cred    *syscall.Credential
	monitor HANode
	nodes   []HANode
	runs    []*exec.Cmd // each `pg_autoctl ... --run`, to stop at the end
}

// An HANode is one PostgreSQL instance of an [HACluster].
type HANode struct {
	Name string
	Port int
	Data string // its data directory
}

// haStateWithin bounds how long the cluster may take to reach the state a
// method waits for (a first primary and standby, or a failover's end),
// before patience.Scale. pg_auto_failover's own timeouts (20 s before a
// node unseen is failed over, 60 s for `perform failover`) fit inside.
const haStateWithin = 3 * time.Minute

// AutoctlPath returns pg_autoctl, or an error saying how to install it.
func AutoctlPath() (string, error) {
	if p, err := exec.LookPath("pg_autoctl"); err == nil {
		return p, nil
	}
	bin, err := ServerBinDir()
	if err == nil {
		if p := filepath.Join(bin, "pg_autoctl"); fileExists(p) {
			return p, nil
		}
	}
	return "", errors.New("pg_autoctl is not installed: on Debian, apt-get install postgresql-15-auto-failover " +
		"(the version of the installed PostgreSQL)")
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// StartHACluster starts a monitor and two nodes and returns once one node
// is primary and the other its secondary.
func StartHACluster(t testing.TB) *HACluster {
	t.Helper()
	skipIfShort(t)
	c := &HACluster{t: t}
	var err error
	if c.autoctl, err = AutoctlPath(); err != nil {
		t.Fatalf("testdb: %v", err)
	}
	if c.bin, err = ServerBinDir(); err != nil {
		t.Fatalf("testdb: %v", err)
	}
	if c.cred, err = serverCredential(); err != nil {
		t.Fatalf("testdb: %v", err)
	}
	c.dir = ServerDir(t)
	// Registered after ServerDir: the cluster ends before its files go.
	t.Cleanup(c.cleanup)

	c.monitor = HANode{Name: "monitor", Port: FreePort(t), Data: filepath.Join(c.dir, "monitor")}
	c.run("create", "monitor", "--pgdata", c.monitor.Data, "--pgport", strconv.Itoa(c.monitor.Port),
		"--hostname", "127.0.0.1", "--listen", "127.0.0.1", "--auth", "trust", "--no-ssl", "--run")
	c.waitFor("the monitor accepts connections", func() (bool, string) {
		err := pingDSN(c.MonitorURI())
		return err == nil, fmt.Sprint(err)
	})
	for i := 1; i <= 2; i++ {
		n := HANode{Name: fmt.Sprintf("node%d", i), Port: FreePort(t)}
		n.Data = filepath.Join(c.dir, n.Name)
		c.nodes = append(c.nodes, n)
		c.run("create", "postgres", "--pgdata", n.Data, "--pgport", strconv.Itoa(n.Port), "--name", n.Name,
			"--hostname", "127.0.0.1", "--listen", "127.0.0.1", "--auth", "trust", "--no-ssl",
			"--dbname", "postgres", "--monitor", c.MonitorURI(), "--run")
		if i == 1 {
			// The first node must be primary before the second joins as
			// its standby.
			c.waitFor("node1 is a single primary", func() (bool, string) {
				states, err := c.states()
				return err == nil && len(states) == 1 && states[0].settled("single"), fmt.Sprint(states, err)
			})
		}
	}
	c.WaitForPrimaryAndSecondary()
	return c
}

// MonitorURI is the monitor's database URL.
func (c *HACluster) MonitorURI() string {
	return fmt.Sprintf("postgres://autoctl_node@127.0.0.1:%d/pg_auto_failover?sslmode=disable", c.monitor.Port)
}

// URI is the multi-host URL of the formation's postgres database, as
// `pg_autoctl show uri` gives it: every node, with
// target_session_attrs=read-write, so that a client connects to whichever
// is primary; as the superuser postgres.
func (c *HACluster) URI() string {
	c.t.Helper()
	out, err := c.autoctlOutput("show", "uri", "--formation", "default", "--monitor", c.MonitorURI())
	if err != nil {
		c.t.Fatalf("testdb: pg_autoctl show uri: %v", err)
	}
	uri := strings.TrimSpace(string(out))
	// pg_autoctl names no user; the nodes' superuser is the server's user.
	if rest, ok := strings.CutPrefix(uri, "postgres://"); ok && !strings.Contains(rest, "@") {
		uri = "postgres://postgres@" + rest
	}
	return uri
}

// Nodes are the cluster's PostgreSQL nodes (not the monitor).
func (c *HACluster) Nodes() []HANode { return append([]HANode(nil), c.nodes...) }

// Primary returns the node the monitor has as primary.
func (c *HACluster) Primary() HANode {
	c.t.Helper()
	states, err := c.states()
	if err != nil {
		c.t.Fatalf("testdb: %v", err)
	}
	for _, s := range states {
		if s.Reported == "primary" && s.Assigned == "primary" {
			return c.node(s.Name)
		}
	}
	c.t.Fatalf("testdb: no node is primary: %v", states)
	return HANode{}
}

// WaitForPrimaryAndSecondary waits until one node is primary and the other
// its secondary, each as assigned by the monitor and reported by the node.
func (c *HACluster) WaitForPrimaryAndSecondary() {
	c.t.Helper()
	c.waitFor("a primary and a secondary", func() (bool, string) {
		states, err := c.states()
		if err != nil || len(states) != 2 {
			return false, fmt.Sprint(states, err)
		}
		p, s := 0, 0
		for _, st := range states {
			switch {
			case st.settled("primary"):
				p++
			case st.settled("secondary"):
				s++
			}
		}
		return p == 1 && s == 1, fmt.Sprint(states)
	})
}

// Failover performs a planned failover (`pg_autoctl perform failover`):
// the standby is promoted and the old primary follows it. It returns the
// new primary once both nodes have settled again.
func (c *HACluster) Failover() HANode {
	c.t.Helper()
	old := c.Primary()
	if out, err := c.autoctlOutput("perform", "failover", "--formation", "default", "--monitor", c.MonitorURI(),
		"--wait", strconv.Itoa(int(patience.Scale(haStateWithin)/time.Second))); err != nil {
		c.t.Fatalf("testdb: pg_autoctl perform failover: %v\n%s", err, out)
	}
	c.WaitForPrimaryAndSecondary()
	if p := c.Primary(); p.Name != old.Name {
		return p
	}
	c.t.Fatalf("testdb: after a failover %s is still primary", old.Name)
	return HANode{}
}

// SetAsynchronous takes every node out of the replication quorum
// (`pg_autoctl set node replication-quorum false`): the primary then
// commits without waiting for its standby, and a failover may lose the
// last commits the primary acknowledged.
func (c *HACluster) SetAsynchronous() {
	c.t.Helper()
	for _, n := range c.nodes {
		if out, err := c.autoctlOutput("set", "node", "replication-quorum", "false", "--pgdata", n.Data); err != nil {
			c.t.Fatalf("testdb: pg_autoctl set node replication-quorum false on %s: %v\n%s", n.Name, err, out)
		}
	}
	c.WaitForPrimaryAndSecondary()
}

// KillPrimary ends the primary's postmaster with SIGKILL, as a crash of its
// server would, and returns the node it was. Its pg_autoctl keeper lives
// on and restarts it; the monitor decides whether to promote the standby.
func (c *HACluster) KillPrimary() HANode {
	c.t.Helper()
	p := c.Primary()
	pid, err := postmasterPID(p.Data)
	if err != nil {
		c.t.Fatalf("testdb: %v", err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		c.t.Fatalf("testdb: kill -9 the postmaster of %s (pid %d): %v", p.Name, pid, err)
	}
	return p
}

// KillPrimaryNode ends every process of the primary's node with SIGKILL:
// its pg_autoctl keeper and its PostgreSQL, as the loss of its machine
// would. It returns the node it was.
func (c *HACluster) KillPrimaryNode() HANode {
	c.t.Helper()
	p := c.Primary()
	pid, err := postmasterPID(p.Data)
	if err != nil {
		c.t.Fatalf("testdb: %v", err)
	}
	for i, n := range c.nodes {
		if n.Name == p.Name {
			// runs[0] is the monitor's; each pg_autoctl leads a process
			// group of its own services.
			_ = syscall.Kill(-c.runs[i+1].Process.Pid, syscall.SIGKILL)
		}
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		c.t.Fatalf("testdb: kill -9 the postmaster of %s (pid %d): %v", p.Name, pid, err)
	}
	return p
}

// WaitForPrimary waits until the monitor has a node other than not as
// primary, however the other node stands, and returns it.
func (c *HACluster) WaitForPrimary(not HANode) HANode {
	c.t.Helper()
	var primary HANode
	c.waitFor("a primary other than "+not.Name, func() (bool, string) {
		states, err := c.states()
		if err != nil {
			return false, err.Error()
		}
		for _, s := range states {
			if s.Name != not.Name && s.settled("primary") || s.Name != not.Name && s.settled("wait_primary") {
				primary = c.node(s.Name)
				return true, ""
			}
		}
		return false, fmt.Sprint(states)
	})
	return primary
}

// WaitForWritable waits until the multi-host URI connects to a server
// that takes writes: after [HACluster.KillPrimary], either the restarted
// primary or a promoted standby.
func (c *HACluster) WaitForWritable() {
	c.t.Helper()
	uri := c.URI()
	c.waitFor("writable primary through "+Redact(uri), func() (bool, string) {
		err := pingDSN(uri)
		return err == nil, fmt.Sprint(err)
	})
}

// postmasterPID reads the postmaster's pid from the first line of its
// data directory's postmaster.pid.
func postmasterPID(data string) (int, error) {
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("the postmaster of %s: %w", data, err)
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	pid, err := strconv.Atoi(strings.TrimSpace(string(line)))
	if err != nil {
		return 0, fmt.Errorf("%s/postmaster.pid: first line %q is not a pid: %w", data, line, err)
	}
	return pid, nil
}

// nodeState is one row of `pg_autoctl show state --json`.
type nodeState struct {
	Name     string `json:"nodename"`
	Port     int    `json:"nodeport"`
	Reported string `json:"current_group_state"`
	Assigned string `json:"assigned_group_state"`
}

func (s nodeState) settled(state string) bool { return s.Reported == state && s.Assigned == state }

func (s nodeState) String() string {
	return fmt.Sprintf("%s:%d %s/%s", s.Name, s.Port, s.Reported, s.Assigned)
}

func (c *HACluster) states() ([]nodeState, error) {
	out, err := c.autoctlOutput("show", "state", "--formation", "default", "--monitor", c.MonitorURI(), "--json")
	if err != nil {
		return nil, fmt.Errorf("pg_autoctl show state: %v: %s", err, out)
	}
	var states []nodeState
	if err := json.Unmarshal(out, &states); err != nil {
		return nil, fmt.Errorf("pg_autoctl show state --json: %v: %s", err, out)
	}
	return states, nil
}

func (c *HACluster) node(name string) HANode {
	for _, n := range c.nodes {
		if n.Name == name {
			return n
		}
	}
	c.t.Fatalf("testdb: the monitor names a node %q that the cluster did not start", name)
	return HANode{}
}

// command prepares pg_autoctl to run as the server's user, in the
// cluster's directory, with its configuration and state kept there too.
func (c *HACluster) command(args ...string) *exec.Cmd {
	cmd := serverCommand(c.autoctl, c.dir, c.cred, args...)
	env := cmd.Env[:0:0]
	for _, kv := range cmd.Env {
		if !strings.HasPrefix(kv, "PATH=") && !strings.HasPrefix(kv, "HOME=") && !strings.HasPrefix(kv, "XDG_") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, "PATH="+c.bin+":/usr/bin:/bin", "HOME="+c.dir,
		"XDG_CONFIG_HOME="+filepath.Join(c.dir, "config"), "XDG_DATA_HOME="+filepath.Join(c.dir, "share"))
	return cmd
}

func (c *HACluster) autoctlOutput(args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), patience.Scale(haStateWithin))
	defer cancel()
	cmd := c.command(args...)
	out := &bytes.Buffer{}
	cmd.Stdout = out
	cmd.Stderr = out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return out.Bytes(), err
		}
	case <-ctx.Done():
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		return out.Bytes(), fmt.Errorf("pg_autoctl %s had not ended after %v", strings.Join(args, " "), patience.Scale(haStateWithin))
	}
	// Warnings go to stderr; the answer is what stdout holds, and the
	// commands used here print it last.
	return lastJSONOrLine(out.Bytes()), nil
}

// lastJSONOrLine returns a JSON document at the end of out if there is one,
// else out's last non-empty line: pg_autoctl writes its log lines to the
// same stream.
func lastJSONOrLine(out []byte) []byte {
	if i := bytes.LastIndex(out, []byte("\n[")); i >= 0 {
		return out[i+1:]
	}
	if bytes.HasPrefix(out, []byte("[")) {
		return out
	}
	lines := bytes.Split(bytes.TrimSpace(out), []byte("\n"))
	return lines[len(lines)-1]
}

// run starts a long-running pg_autoctl (create ... --run), logging to a
// file in the cluster's directory.
func (c *HACluster) run(args ...string) {
	c.t.Helper()
	logPath := filepath.Join(c.dir, fmt.Sprintf("autoctl-%d.log", len(c.runs)))
	f, err := os.Create(logPath)
	if err != nil {
		c.t.Fatalf("testdb: %v", err)
	}
	defer f.Close()
	cmd := c.command(args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("testdb: pg_autoctl %s: %v", strings.Join(args, " "), err)
	}
	c.runs = append(c.runs, cmd)
	go func() { _ = cmd.Wait() }()
}

func (c *HACluster) waitFor(what string, cond func() (bool, string)) {
	c.t.Helper()
	within := patience.Scale(haStateWithin)
	deadline := time.Now().Add(within)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("testdb: pg_auto_failover: no %s within %v; last seen: %s\n%s", what, within, state, c.logTail())
		}
		time.Sleep(250 * time.Millisecond) // polling, with the deadline above
	}
}

// logTail is the end of each pg_autoctl's log, for a failing test.
func (c *HACluster) logTail() string {
	var b strings.Builder
	for i := range c.runs {
		p := filepath.Join(c.dir, fmt.Sprintf("autoctl-%d.log", i))
		data, _ := os.ReadFile(p)
		if len(data) > 3000 {
			data = data[len(data)-3000:]
		}
		fmt.Fprintf(&b, "--- %s\n%s\n", p, data)
	}
	return b.String()
}

// timelineLine picks the lines of the keepers' and servers' logs that say
// how a failover went: the state machine's transitions, the monitor's
// view of health, synchronous replication waits cut short, shutdowns and
// promotions. A failing failover test needs them with their timestamps to
// tell the cluster's doing from the fleet's.
var timelineLine = regexp.MustCompile(`(?i)FSM transition|Transition complete|unhealthy|healthy secondary|` +
	`synchronous_standby_names|synchronous replication|demote|promot|shutdown|shutting down|terminating connection|` +
	`selected new timeline|pg_rewind|FATAL|PANIC`)

// TimelineEnv, set to anything, logs the cluster's timeline at the end of
// a test that passed too.
const TimelineEnv = "FLOTILLA_HA_TIMELINE"

// timelineLimit bounds the lines kept per log, the last ones.
const timelineLimit = 400

// timeline is the picked lines of every pg_autoctl's log and of every
// node's server log (pg_auto_failover keeps those in each data
// directory's log/).
func (c *HACluster) timeline() string {
	var files []string
	for i := range c.runs {
		files = append(files, filepath.Join(c.dir, fmt.Sprintf("autoctl-%d.log", i)))
	}
	for _, n := range append([]HANode{c.monitor}, c.nodes...) {
		logs, _ := filepath.Glob(filepath.Join(n.Data, "log", "*"))
		files = append(files, logs...)
	}
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintf(&b, "--- %s: %v\n", f, err)
			continue
		}
		var picked []string
		for line := range strings.SplitSeq(string(data), "\n") {
			if timelineLine.MatchString(line) {
				picked = append(picked, line)
			}
		}
		if len(picked) > timelineLimit {
			picked = picked[len(picked)-timelineLimit:]
		}
		fmt.Fprintf(&b, "--- %s (%d lines picked)\n%s\n", f, len(picked), strings.Join(picked, "\n"))
	}
	return b.String()
}

// cleanup stops every pg_autoctl (each stops its PostgreSQL), and kills
// whatever of the cluster is left after the stop deadline.
func (c *HACluster) cleanup() {
	if c.t.Failed() {
		c.t.Logf("testdb: %s", c.logTail())
	}
	if c.t.Failed() || os.Getenv(TimelineEnv) != "" {
		c.t.Logf("testdb: the cluster's timeline:\n%s", c.timeline())
	}
	for i := len(c.runs) - 1; i >= 0; i-- {
		_ = c.runs[i].Process.Signal(syscall.SIGTERM)
	}
	deadline := time.Now().Add(patience.Scale(serverStopWithin))
	if pollUntil(deadline, func() bool { return len(c.processes()) == 0 }) {
		return
	}
	for _, pid := range c.processes() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline = time.Now().Add(patience.Scale(serverStopWithin))
	if !pollUntil(deadline, func() bool { return len(c.processes()) == 0 }) {
		c.t.Errorf("testdb: processes %v of the pg_auto_failover cluster in %s outlived SIGKILL", c.processes(), c.dir)
	}
}

// processes returns the live processes of the cluster: those whose working
// directory is in the cluster's directory (pg_autoctl runs in it, and every
// PostgreSQL process in its data directory).
func (c *HACluster) processes() []int {
	return liveProcesses(func(proc string) bool {
		cwd, err := os.Readlink(filepath.Join(proc, "cwd"))
		return err == nil && (cwd == c.dir || strings.HasPrefix(cwd, c.dir+"/"))
	})
}

// pingDSN connects to dsn and disconnects.
func pingDSN(dsn string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}
