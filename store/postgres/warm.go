package postgres

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// hotSet is the statements a pool runs on a node's hot path, readied on
// each of its connections when the connection opens, so that a node's
// first claim, outcome write and renewals pay neither the parse nor the
// plan of a new backend (6-10 ms to parse, 7-18 ms to plan the first time,
// on a backend whose catalog caches are empty: nearly all of the slowest
// starts of a node's first second).
type hotSet struct {
	// prepared are prepared by their text, which is what pgx looks a
	// statement up by: a later Exec, Query or batch of the same text runs
	// the prepared statement.
	prepared []string
	// planned are statements that run on their generic plans, each under
	// the setting statement (and its arguments) that its transaction runs
	// first: the plan made here, under the same settings, is the one the
	// statement keeps for the connection's life.
	planned []plannedGroup
}

type plannedGroup struct {
	setting string
	args    []string
	sql     []string
}

// poolHot is the main pool's: the claim, the outcome write, the task lease
// renewal, the command reads, and a submission (its insert and its
// announcement), which a node's own handlers and an application sharing
// its store make.
var poolHot = hotSet{
	prepared: []string{"BEGIN", "COMMIT", renewSQL, ackCommandSQL, getCommandSQL, notifyTasksSQL},
	planned: []plannedGroup{
		{setting: claimSettingSQL, args: []string{"0"}, sql: []string{claimSQL}},
		{setting: advanceSettingSQL, sql: []string{lockTasksSQL, advanceSQL}},
		{setting: genericPlanSQL, sql: []string{pendingCommandsSQL, insertTasksQuietSQL}},
	},
}

// leasesHot is the lease pool's: acquiring and renewing bucket leases, and
// the node's heartbeat. Their plans are custom ones, made at each run.
var leasesHot = hotSet{
	prepared: []string{"BEGIN", "COMMIT", acquireSettingSQL, acquireSQL, heartbeatNodeSQL},
}

// statements lists every statement of h, in the order they are prepared.
func (h hotSet) statements() []string {
	out := append([]string(nil), h.prepared...)
	for _, g := range h.planned {
		out = append(out, g.setting)
		out = append(out, g.sql...)
	}
	return out
}

// afterConnect readies h on every connection the pool opens once the store
// is warmed, before the pool hands it out. A connection that cannot (a
// database not migrated yet) is handed out cold: a statement it runs cold
// prepares itself as it always has.
func afterConnect(h hotSet, warmed *atomic.Bool) func(context.Context, *pgx.Conn) error {
	return func(ctx context.Context, conn *pgx.Conn) error {
		if !warmed.Load() {
			return nil
		}
		if err := h.ready(ctx, conn); err != nil && conn.IsClosed() {
			return err
		}
		return nil
	}
}

// ready prepares h's statements on conn and makes the generic plans of
// those that run on one. Preparing a statement conn has already prepared
// costs nothing; its plan is made once.
func (h hotSet) ready(ctx context.Context, conn *pgx.Conn) error {
	named := map[string]*pgconn.StatementDescription{}
	for _, sql := range h.statements() {
		sd, err := conn.Prepare(ctx, sql, sql)
		if err != nil {
			return err
		}
		named[sql] = sd
	}
	for _, g := range h.planned {
		if err := plan(ctx, conn.PgConn(), g, named); err != nil {
			return err
		}
	}
	return nil
}

// plan makes the generic plans of g's statements, under g's setting, in a
// transaction of their own: EXPLAIN EXECUTE plans a prepared statement as
// its execution would, and keeps the generic plan, without running it.
func plan(ctx context.Context, pc *pgconn.PgConn, g plannedGroup, named map[string]*pgconn.StatementDescription) error {
	if err := pc.Exec(ctx, "BEGIN").Close(); err != nil {
		return err
	}
	err := func() error {
		args := make([][]byte, len(g.args))
		for i, a := range g.args {
			args[i] = []byte(a)
		}
		// The unnamed statement: the setting is prepared as its own text
		// above, for the hot path's transactions.
		if _, err := pc.ExecParams(ctx, g.setting, args, nil, nil, nil).Close(); err != nil {
			return err
		}
		var q strings.Builder
		for _, sql := range g.sql {
			sd := named[sql]
			q.WriteString("EXPLAIN EXECUTE " + pgx.Identifier{sd.Name}.Sanitize())
			if n := len(sd.ParamOIDs); n > 0 {
				q.WriteString("(NULL" + strings.Repeat(", NULL", n-1) + ")")
			}
			q.WriteString(";\n")
		}
		return pc.Exec(ctx, q.String()).Close()
	}()
	if err != nil {
		_ = pc.Exec(ctx, "ROLLBACK").Close()
		return err
	}
	return pc.Exec(ctx, "COMMIT").Close()
}

// Warm opens the WithWarmConns connections of the main pool (by default
// the whole pool) and one of the lease pool, all at once, and readies the
// hot statements on each in turn, handing each back to its pool as soon as
// it is ready: a node's first statements wait for the first ready
// connection, not for the last. The connections stay open, idle, for the
// node's claims and submissions. It readies too the connections opened
// before, and from then on every connection the pools open is readied
// before its first use. With the warm-up off (WithWarmConns(0)) it does
// nothing.
func (s *Store) Warm(ctx context.Context) error {
	if s.warmConns == 0 {
		return nil
	}
	// Held at once, so that they are different connections; opened cold,
	// which takes a connection's start-up only.
	var wg sync.WaitGroup
	var pool, leases []*pgxpool.Conn
	var poolErr, leasesErr error
	wg.Go(func() { pool, poolErr = hold(ctx, s.pool, s.warmConns) })
	wg.Go(func() { leases, leasesErr = hold(ctx, s.leases, 1) })
	wg.Wait()
	// From here on a connection the pools open is readied before it is
	// handed out.
	s.warmed.Store(true)
	// One after the other, the first of the main pool first, then the
	// lease connection: readied all at once, the backends would share the
	// database's cores and all be ready at about the end, and the node's
	// first statements would wait for the last of them.
	errs := []error{poolErr, leasesErr}
	ready := func(c *pgxpool.Conn, h hotSet) {
		errs = append(errs, h.ready(ctx, c.Conn()))
		// A connection left in a failed transaction is closed, not reused.
		c.Release()
	}
	first := min(1, len(pool)) // the node's start reads the fleet before it takes its leases
	for _, step := range []struct {
		conns []*pgxpool.Conn
		h     hotSet
	}{{pool[:first], poolHot}, {leases, leasesHot}, {pool[first:], poolHot}} {
		for _, c := range step.conns {
			ready(c, step.h)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return wrap(err, "warm the pools")
	}
	return nil
}

// hold acquires n connections of pool at once and returns those it got.
func hold(ctx context.Context, pool *pgxpool.Pool, n int) ([]*pgxpool.Conn, error) {
	conns := make([]*pgxpool.Conn, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { conns[i], errs[i] = pool.Acquire(ctx) })
	}
	wg.Wait()
	var got []*pgxpool.Conn
	for _, c := range conns {
		if c != nil {
			got = append(got, c)
		}
	}
	return got, errors.Join(errs...)
}
