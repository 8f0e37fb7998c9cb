package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/schedule"
	"github.com/flotilla-dev/flotilla/store/postgres"
	"github.com/flotilla-dev/flotilla/task"
)

// The fault scenarios run a fleet of test workers (./testworker) on one
// database, inject faults into it (kill -9, SIGSTOP, a proxy that cuts the
// node off, a PostgreSQL restart, SIGTERM) while it works through probe
// tasks, and then check what DESIGN §5 promises: every task terminal,
// none succeeded twice, no two attempts of a task overlapping, every audit
// trail complete and in order, and at most one task per schedule tick.
//
// A rig is one scenario's fleet: the database, the nodes by name (each
// name may have several processes over the scenario: a node killed and
// restarted is a new process under the same node id), the faults injected,
// and the tasks submitted.

// ledgerSchema is the probe's ledger: one row per execution of a probe
// task, written by the test worker (see testworker/probe.go).
const ledgerSchema = `
CREATE TABLE probe_ledger (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id     bigint      NOT NULL,
    attempt     int         NOT NULL,
    claim_seq   bigint      NOT NULL,
    epoch       bigint      NOT NULL,
    node        text        NOT NULL,
    incarnation text        NOT NULL,
    pid         int         NOT NULL,
    started_at  timestamptz NOT NULL,
    ended_at    timestamptz,
    outcome     text,
    current     boolean
);
CREATE UNIQUE INDEX probe_ledger_attempt_idx ON probe_ledger (task_id, claim_seq);`

// Lease timing of every scenario on a quiet machine: short, so that
// failovers take seconds, with the heartbeat at the default TTL/3. The task
// lease is a few heartbeats, so that a task whose attempt was dropped
// without a write is rescued within seconds. Each rig stretches both with
// the machine's load (leaseTTL).
const (
	scenarioLeaseTTL     = 3 * time.Second
	scenarioTaskLeaseTTL = 6 * time.Second
)

// Bounds for outcomes against real PostgreSQL on a loaded machine; a
// passing scenario waits only as long as the fleet needs.
const (
	failoverWithin = 45 * time.Second // a successor holds a dead or cut-off holder's buckets
	settleWithin   = 4 * time.Minute  // every task submitted is terminal
)

// nodeSpec is one node of a scenario.
type nodeSpec struct {
	id      string
	buckets string
	// viaProxy connects the node to PostgreSQL through the rig's proxy,
	// which the scenario can cut.
	viaProxy bool
	// http serves /healthz and /readyz on a free port.
	http  bool
	extra []string // more flags
}

// rigNode is a node of the rig and its current process.
type rigNode struct {
	spec  nodeSpec
	proc  *proc
	lives int // processes started under this node id
}

// rig is one scenario's fleet and what was done to it.
type rig struct {
	*fleet
	pool *pgxpool.Pool // the client's, for the checks' SQL
	// proxyDSN, when set, is the fleet's DSN through a proxy.
	proxyDSN string
	// leaseTTL and taskLeaseTTL are the nodes' lease TTLs: the scenario's,
	// stretched for the machine when the rig was made; misfire is how late
	// a schedule tick may fire and still count as on time, stretched alike,
	// since a loaded holder fires late without any fault.
	leaseTTL, taskLeaseTTL, misfire time.Duration

	mu    sync.Mutex
	nodes map[string]*rigNode
	// deaths maps the pid of every process killed with SIGKILL to when it
	// was gone: the end of any execution it left unrecorded.
	deaths map[int]time.Time
	// frozen maps the pid of every process stopped with SIGSTOP to the
	// windows it spent stopped.
	frozen map[int][]window
	// faults are the windows in which the fleet was allowed to miss a
	// schedule tick: from a fault until the fleet had recovered.
	faults []window
	// submitted are the ids of the probe tasks submitted.
	submitted []int64
	schedules []string
}

// window is a span of wall-clock time.
type window struct{ from, to time.Time }

func (w window) contains(t time.Time) bool { return !t.Before(w.from) && !t.After(w.to) }

// newRig creates the scenario's database, migrated, with the ledger, on a
// PostgreSQL server of the scenario's own: a fleet under faults opens many
// connections (each node's pool and its ledger's), and scenarios run side
// by side; on their own servers they never use up the shared server's
// max_connections, and a scenario may partition or restart its server.
func newRig(t *testing.T) *rig {
	t.Helper()
	needsPostgres(t)
	takeFleetSlot(t)
	return newRigOn(t, newFleetOn(t, testdb.StartServer(t).New(t)))
}

// newRigOn is newRig on a fleet of the test's.
func newRigOn(t *testing.T, f *fleet) *rig {
	t.Helper()
	pg, ok := f.client.Store().(*postgres.Store)
	if !ok {
		t.Fatalf("the client's store is %T, not PostgreSQL", f.client.Store())
	}
	ctx, cancel := context.WithTimeout(t.Context(), queryTimeout)
	defer cancel()
	if _, err := pg.Pool().Exec(ctx, ledgerSchema); err != nil {
		t.Fatalf("create the probe ledger: %v", err)
	}
	return &rig{
		fleet: f, pool: pg.Pool(),
		leaseTTL: leaseTTL(scenarioLeaseTTL), taskLeaseTTL: leaseTTL(scenarioTaskLeaseTTL),
		misfire: leaseTTL(schedule.DefaultMisfire),
		nodes:   map[string]*rigNode{}, deaths: map[int]time.Time{}, frozen: map[int][]window{},
	}
}

// withHost returns the URL DSN with its host and port replaced by addr.
func withHost(t *testing.T, dsn, addr string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil || u.Host == "" {
		t.Fatalf("the fault scenarios need a URL DSN with one host, not %s", redactDSN(dsn))
	}
	u.Host = addr
	return u.String()
}

// hostOf returns the host:port of a URL DSN.
func hostOf(t *testing.T, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil || u.Host == "" {
		t.Fatalf("the fault scenarios need a URL DSN with one host, not %s", redactDSN(dsn))
	}
	if u.Port() == "" {
		return u.Host + ":5432"
	}
	return u.Host
}

func redactDSN(dsn string) string {
	if u, err := url.Parse(dsn); err == nil {
		return u.Redacted()
	}
	return "(a DSN that does not parse)"
}

// start starts a node's first process, or its next one after a kill; it
// does not wait for it to hold anything.
func (r *rig) start(spec nodeSpec) *rigNode {
	r.t.Helper()
	dsn := r.dsn
	if spec.viaProxy {
		if r.proxyDSN == "" {
			r.t.Fatalf("node %s: no proxy in this scenario", spec.id)
		}
		dsn = r.proxyDSN
	}
	args := []string{
		"--node-id", spec.id, "--buckets", spec.buckets, "--ledger-dsn", r.dsn,
		"--bucket-lease-ttl", r.leaseTTL.String(), "--task-lease-ttl", r.taskLeaseTTL.String(),
		"--schedule-misfire", r.misfire.String(),
		"--concurrency", "32", "--poll-interval", "250ms", "--command-poll", "500ms",
		"--shutdown-timeout", "10s", "--stop-grace", "2s",
		// The scenarios stand standbys by for the buckets of the nodes they
		// break, as nodes that do not balance do (elastic_test.go breaks a
		// balanced fleet).
		"--no-balance",
	}
	if spec.http {
		args = append(args, "--http", "127.0.0.1:0")
	}
	args = append(args, spec.extra...)
	p := startBinary(r.t, testWorkerBinary, dsn, args...)
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.nodes[spec.id]
	if n == nil {
		n = &rigNode{spec: spec}
		r.nodes[spec.id] = n
	}
	n.proc = p
	n.lives++
	return n
}

// rigNode returns the rig's node by id.
func (r *rig) rigNode(id string) *rigNode {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.nodes[id]
	if n == nil {
		r.t.Fatalf("no node %s in this scenario", id)
	}
	return n
}

func (n *rigNode) pid() int { return n.proc.cmd.Process.Pid }

// startHolding starts a node and waits until it holds all its buckets.
func (r *rig) startHolding(spec nodeSpec) *rigNode {
	r.t.Helper()
	n := r.start(spec)
	r.waitUntilHeld(spec.id, mustSet(r.t, spec.buckets), startWithin)
	return n
}

// startStandby starts a node for buckets another node holds, and waits
// until it stands by for all of them.
func (r *rig) startStandby(spec nodeSpec) *rigNode {
	r.t.Helper()
	n := r.start(spec)
	r.waitUntilStandingBy(spec.id, mustSet(r.t, spec.buckets))
	return n
}

// kill9 kills the node's process with SIGKILL and records when it was
// gone. It returns the time of the signal.
func (r *rig) kill9(id string) time.Time {
	r.t.Helper()
	n := r.rigNode(id)
	pid := n.pid()
	at := time.Now()
	n.proc.kill9()
	r.mu.Lock()
	r.deaths[pid] = time.Now()
	r.mu.Unlock()
	return at
}

// killAndRestart kills a node chosen at random with SIGKILL, starts it
// again under its id once its registration has expired, and waits until it
// holds its buckets again. The time from the kill to that is a fault window
// for the schedule check, and is returned.
func (r *rig) killAndRestart(nodes []nodeSpec, within time.Duration) time.Duration {
	r.t.Helper()
	s := nodes[rand.IntN(len(nodes))]
	killed := r.kill9(s.id)
	r.waitUntilGone(s.id)
	r.start(s)
	r.waitUntilHeld(s.id, mustSet(r.t, s.buckets), within)
	r.fault(killed, time.Now())
	return time.Since(killed)
}

// freeze stops the node's process with SIGSTOP, and returns once every
// thread of it has stopped: the time it returns is after the process's
// last step. thaw resumes it, and returns the time before the signal: the
// process may run from then on.
func (r *rig) freeze(id string) time.Time {
	r.t.Helper()
	n := r.rigNode(id)
	pid := n.pid()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		r.t.Fatalf("SIGSTOP %s: %v", id, err)
	}
	var lastErr error
	if !poll(startWithin, func() bool {
		var ok bool
		ok, lastErr = stopped(pid)
		return ok
	}) {
		r.t.Fatalf("%s (pid %d) did not stop within %v of SIGSTOP (last error: %v)", id, pid, startWithin, lastErr)
	}
	at := time.Now()
	r.mu.Lock()
	r.frozen[pid] = append(r.frozen[pid], window{from: at})
	r.mu.Unlock()
	return at
}

func (r *rig) thaw(id string) time.Time {
	r.t.Helper()
	n := r.rigNode(id)
	at := time.Now()
	if err := syscall.Kill(n.pid(), syscall.SIGCONT); err != nil {
		r.t.Fatalf("SIGCONT %s: %v", id, err)
	}
	r.mu.Lock()
	ws := r.frozen[n.pid()]
	ws[len(ws)-1].to = at
	r.mu.Unlock()
	return at
}

// fault records a window in which the fleet may miss schedule ticks.
func (r *rig) fault(from, to time.Time) {
	r.mu.Lock()
	r.faults = append(r.faults, window{from: from, to: to})
	r.mu.Unlock()
}

// waitUntilGone waits until the node's registration has expired, so that
// a new process under its id is not refused as a second live one.
func (r *rig) waitUntilGone(id string) {
	r.t.Helper()
	eventually(r.t, failoverWithin, "node "+id+" is no longer alive", func() bool {
		ctx, cancel := context.WithTimeout(r.t.Context(), queryTimeout)
		defer cancel()
		ns, err := r.client.Nodes(ctx)
		if err != nil {
			return false
		}
		for _, n := range ns {
			if n.ID == id {
				return !n.Alive
			}
		}
		return true
	})
}

// healthAddr reads the address a node serves its health checks on from
// its log.
var healthAddrRE = regexp.MustCompile(`"msg":"serving health checks","addr":"([^"]+)"`)

func (r *rig) healthAddr(id string) string {
	r.t.Helper()
	n := r.rigNode(id)
	var addr string
	eventually(r.t, startWithin, id+" logs its health address", func() bool {
		m := healthAddrRE.FindStringSubmatch(n.proc.output())
		if m != nil {
			addr = m[1]
		}
		return m != nil
	})
	return addr
}

// probeLoad describes the probe tasks a scenario submits.
type probeLoad struct {
	tasks int
	// minWork and maxWork bound each probe's work, drawn uniformly.
	minWork, maxWork time.Duration
	// over spreads the submissions over this time, in batches, so that the
	// load is held while faults are injected; zero submits at once.
	over  time.Duration
	batch int
}

// probeMaxAttempts is every probe task's attempt budget: enough that no
// run of faults can use it up, so that a task that ends anywhere but
// succeeded is a fault of the fleet, not of the budget.
const probeMaxAttempts = 25

// submit submits the load in batches; it returns once all are in.
func (r *rig) submit(ctx context.Context, l probeLoad, prefix string) error {
	batch := max(l.batch, 1)
	batches := (l.tasks + batch - 1) / batch
	var pace *time.Ticker
	if l.over > 0 && batches > 1 {
		pace = time.NewTicker(l.over / time.Duration(batches))
		defer pace.Stop()
	}
	for b := range batches {
		n := min(batch, l.tasks-b*batch)
		reqs := make([]flotilla.TaskRequest, n)
		for i := range reqs {
			work := l.minWork
			if l.maxWork > l.minWork {
				work += rand.N(l.maxWork - l.minWork)
			}
			payload, _ := json.Marshal(map[string]string{"duration": work.String()})
			reqs[i] = flotilla.TaskRequest{
				Kind: "probe", Key: fmt.Sprintf("%s-%d", prefix, b*batch+i), Payload: payload,
				MaxAttempts: probeMaxAttempts,
			}
		}
		var tasks []*task.Task
		// The database may be restarting, or a holder dead: the batch is
		// retried until it is in (all or nothing, so never twice).
		for {
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			created, err := r.client.SubmitMany(cctx, reqs, flotilla.AllowUnowned())
			cancel()
			if err == nil {
				tasks = created
				break
			}
			if ctx.Err() != nil {
				return fmt.Errorf("submitting batch %d of %d: %w", b+1, batches, err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
		r.mu.Lock()
		for _, tk := range tasks {
			r.submitted = append(r.submitted, tk.ID)
		}
		r.mu.Unlock()
		if pace != nil && b < batches-1 {
			select {
			case <-pace.C:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return nil
}

// submission is a load being submitted in the background.
type submission struct {
	r      *rig
	done   chan struct{} // closed once every batch is in, or submitting failed
	err    error         // set before done is closed
	cancel context.CancelFunc
}

// submitInBackground starts submitting the load. Wait for it with wait.
func (r *rig) submitInBackground(l probeLoad, prefix string) *submission {
	ctx, cancel := context.WithTimeout(context.Background(), max(settleWithin, 3*l.over))
	s := &submission{r: r, done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(s.done)
		s.err = r.submit(ctx, l, prefix)
	}()
	// If the test fails before waiting, the submissions still end first.
	r.t.Cleanup(func() { cancel(); <-s.done })
	return s
}

// wait waits until the load is all in, and fails the test if it could not
// be.
func (s *submission) wait() {
	s.r.t.Helper()
	<-s.done
	s.cancel()
	if s.err != nil {
		s.r.t.Fatalf("submitting the load: %v", s.err)
	}
}

// counts returns the number of tasks per status.
func (r *rig) counts(ctx context.Context) (map[string]int, error) {
	rows, err := r.pool.Query(ctx, `SELECT status, count(*) FROM flotilla_tasks GROUP BY status`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			return nil, err
		}
		out[s] = n
	}
	return out, rows.Err()
}

// waitUntilSettled waits until at least want tasks exist and none of them
// is unfinished. Tasks a schedule fired are left out: they keep coming.
func (r *rig) waitUntilSettled(want int, within time.Duration) map[string]int {
	r.t.Helper()
	var last map[string]int
	var lastErr error
	ok := poll(within, func() bool {
		ctx, cancel := context.WithTimeout(r.t.Context(), queryTimeout)
		defer cancel()
		var n, open int
		lastErr = r.pool.QueryRow(ctx, `
SELECT count(*), count(*) FILTER (WHERE status NOT IN ('succeeded','failed','timed_out','stopped','cancelled','lost','skipped'))
FROM flotilla_tasks WHERE schedule IS NULL`).Scan(&n, &open)
		if lastErr != nil {
			return false
		}
		last, lastErr = r.counts(ctx)
		return lastErr == nil && n >= want && open == 0
	})
	if !ok {
		r.t.Fatalf("after %v, the %d tasks are not all finished: %v (last error: %v)", within, want, last, lastErr)
	}
	return last
}

// logLinesOf returns the process's JSON log lines that contain msg.
func logLinesOf(p *proc, msg string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(p.output(), "\n") {
		if !strings.Contains(line, msg) {
			continue
		}
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// logTime is the time of a JSON log line.
func logTime(m map[string]any) time.Time {
	s, _ := m["ts"].(string)
	t, _ := time.Parse(time.RFC3339Nano, s)
	return t
}

// heldBy returns the buckets of set that node holds now.
func heldBy(bs []flotilla.BucketReport, set bucket.Set, node string) int {
	n := 0
	for _, b := range bs {
		if set.Contains(b.Bucket) && b.Holder == node {
			n++
		}
	}
	return n
}
