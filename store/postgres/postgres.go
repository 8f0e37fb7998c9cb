package postgres

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flotilla-dev/flotilla/store"
)

// Defaults of the options.
const (
	// DefaultMaxConns is the pool size when WithMaxConns is not given and
	// the DSN has no pool_max_conns. A node's claims, outcome writes,
	// renewals and command reads, and submissions at 1,000 a second, keep
	// four or five busy at once; a node warms all of them at start (see
	// WithWarmConns), and a pool that cannot grow past them cannot open a
	// burst of cold connections when a moment's stall queues its callers.
	DefaultMaxConns = 8
	// DefaultApplicationName is reported to PostgreSQL (pg_stat_activity)
	// unless the DSN or WithApplicationName names another.
	DefaultApplicationName = "flotilla"
	// DefaultConnectTimeout bounds each connection attempt when the DSN
	// sets no connect_timeout, so that an unreachable database fails fast
	// instead of waiting for the operating system to give up.
	DefaultConnectTimeout = 10 * time.Second
	// LeaseConns is the size of the pool that bucket leases and node
	// heartbeats have to themselves (see Store).
	LeaseConns = 2
)

// Store is the PostgreSQL store. It is safe for concurrent use; Close it
// when done.
type Store struct {
	pool *pgxpool.Pool
	// leases serves the statements that keep a node's standing: acquiring,
	// renewing and releasing bucket leases, and the node's heartbeat. A
	// renewal must answer within its timeout or the node gives up its
	// buckets; an application whose queries fill the main pool (a store
	// shared with it, or a burst of submits) must not make it wait for a
	// connection.
	leases *pgxpool.Pool

	mu     sync.Mutex
	subs   map[*subscription]struct{}
	closed bool

	// warmConns is how many connections of the main pool Warm opens; 0
	// when the warm-up is off (WithWarmConns(0)).
	warmConns int
	// warmed is set by the first Warm: from then on every connection the
	// pools open readies their hot statements before it is handed out. A
	// store no node warms (a command that submits a task, the console)
	// prepares only what it runs.
	warmed *atomic.Bool

	// numBuckets caches the fleet's bucket count once read, to refuse tasks
	// for buckets the fleet does not have. It never changes once set.
	numBuckets int
}

var (
	_ store.Store    = (*Store)(nil)
	_ store.Notifier = (*Store)(nil)
	_ store.Warmer   = (*Store)(nil)
)

// Option configures New.
type Option func(*options)

type options struct {
	maxConns         int32
	statementTimeout time.Duration
	applicationName  string
	warmConns        *int
}

// WithMaxConns sets the largest number of pooled connections (default
// DefaultMaxConns, or the DSN's pool_max_conns). Subscriptions (Listen) use
// connections of their own on top of these.
func WithMaxConns(n int) Option {
	return func(o *options) { o.maxConns = int32(n) }
}

// WithStatementTimeout makes PostgreSQL cancel any statement of this store
// that runs longer than d (the statement_timeout setting, per connection).
// Zero, the default, sets no timeout of its own.
func WithStatementTimeout(d time.Duration) Option {
	return func(o *options) { o.statementTimeout = d }
}

// WithApplicationName sets the application_name the connections report
// (default DefaultApplicationName, unless the DSN names one).
func WithApplicationName(name string) Option {
	return func(o *options) { o.applicationName = name }
}

// WithWarmConns sets how many connections of the main pool a node opens and
// readies before its first claim (Warm): by default all of them, the pool's
// largest size; never more. Each readied connection has the claim, the
// outcome write, the renewals, the command reads and the submission
// prepared, with the generic plans of those that run on one, and so does
// every connection the pool opens once the store is warm, before it is
// handed out. n = 0 turns the warm-up off: no connection is opened ahead
// and each statement is prepared at its first use, as on a store no node
// runs on (a command that submits a task, the console), which never warms.
// A negative n is refused by New.
//
// The cost: the warmed connections stay open, idle when the node is (one
// PostgreSQL backend each), and a node's start waits for them (tens of
// milliseconds of the server's CPU per connection); see docs/benchmarks.md,
// "Warm start".
func WithWarmConns(n int) Option {
	return func(o *options) { o.warmConns = &n }
}

// New connects to the PostgreSQL database named by dsn (a URL or key=value
// connection string) and pings it. It does not migrate: call Migrate, or Meta
// to check that the schema is the one this binary knows.
//
// Errors never contain the DSN's password.
func New(ctx context.Context, dsn string, opts ...Option) (*Store, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}

	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, parseError(dsn, err)
	}
	switch {
	case o.maxConns > 0:
		cfg.MaxConns = o.maxConns
	case !hasSetting(dsn, "pool_max_conns"):
		cfg.MaxConns = DefaultMaxConns
	}
	cc := cfg.ConnConfig
	if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = DefaultConnectTimeout
	}
	// Prepared statements are cached per connection (pgx's default
	// QueryExecModeCacheStatement). After five executions PostgreSQL may
	// switch a prepared statement to a generic plan, chosen without the
	// parameter values and with the statistics of the moment: a statement
	// prepared while the table is empty can get a sorted full scan, and
	// PostgreSQL keeps using it once the table holds millions of rows. A
	// custom plan per execution is the default, and it lets the optional
	// filters of ListTasks (`$1 IS NULL OR ...`) fold away. The hot path's
	// statements (the claim, the outcome write, a small limited claim, a
	// command, a small submission) ask for their generic plans in their own
	// transactions, under settings that leave the planner no bad plan to
	// choose, since planning them at each call cost as much as running them.
	cc.RuntimeParams["plan_cache_mode"] = "force_custom_plan"
	// No statement of the store gains from being compiled: each reads and
	// writes rows by index, and once the planner's estimate passes
	// jit_above_cost (a release of 100,000 pipeline steps, a scan a setting
	// turned off but the planner could not avoid) PostgreSQL compiles the
	// statement at each run, 0.1-0.3 s spent before the first row: a node
	// heartbeat on a table with no index to use took 245 ms so. Both pools'
	// connections run without it (TestConnectionsRunWithoutJIT).
	cc.RuntimeParams["jit"] = "off"
	if o.applicationName != "" {
		cc.RuntimeParams["application_name"] = o.applicationName
	} else if cc.RuntimeParams["application_name"] == "" {
		cc.RuntimeParams["application_name"] = DefaultApplicationName
	}
	if o.statementTimeout > 0 {
		// In milliseconds, PostgreSQL's unit; at least 1, since 0 means none.
		cc.RuntimeParams["statement_timeout"] = strconv.FormatInt(max(1, o.statementTimeout.Milliseconds()), 10)
	}

	leaseCfg := cfg.Copy()
	leaseCfg.MaxConns, leaseCfg.MinConns = LeaseConns, 0
	// Once a node has warmed the store, each connection readies its
	// pool's hot statements before its first use (see Warm); until then,
	// and always with the warm-up off, it prepares only what it runs: a
	// command that writes one task should not prepare a node's statements.
	warmConns := int(cfg.MaxConns)
	if o.warmConns != nil {
		if *o.warmConns < 0 {
			return nil, fmt.Errorf("postgres.WithWarmConns(%d): give the number of connections to warm, from 0 (no warm-up) to the pool's size: %w",
				*o.warmConns, store.ErrInvalid)
		}
		warmConns = min(*o.warmConns, int(cfg.MaxConns))
	}
	warmed := &atomic.Bool{}
	if warmConns > 0 {
		cfg.AfterConnect = afterConnect(poolHot, warmed)
		leaseCfg.AfterConnect = afterConnect(leasesHot, warmed)
	}

	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("cannot reach PostgreSQL at %s: %w", where(cfg), err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("cannot reach PostgreSQL at %s: %w", where(cfg), err)
	}
	// Its connections open when first used: a client that never takes a
	// lease never opens one.
	leases, err := pgxpool.NewWithConfig(ctx, leaseCfg)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("cannot reach PostgreSQL at %s: %w", where(cfg), err)
	}
	return &Store{pool: pool, leases: leases, subs: map[*subscription]struct{}{}, warmConns: warmConns, warmed: warmed}, nil
}

// where names the servers and database of cfg for messages:
// host:port/db, or every host of a multi-host DSN (h1:5432,h2:5432/db),
// never the user's password.
func where(cfg *pgxpool.Config) string {
	cc := cfg.ConnConfig
	if strings.HasPrefix(cc.Host, "/") {
		// A Unix socket directory.
		return fmt.Sprintf("%s/.s.PGSQL.%d/%s", cc.Host, cc.Port, cc.Database)
	}
	hosts := []string{net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port)))}
	// pgx adds a fallback per host, and one more per host for each TLS
	// setting sslmode allows: name each host once.
	for _, fb := range cc.Fallbacks {
		if h := net.JoinHostPort(fb.Host, strconv.Itoa(int(fb.Port))); !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	return strings.Join(hosts, ",") + "/" + cc.Database
}

// parseError describes a DSN that pgx could not parse, without its password.
func parseError(dsn string, err error) error {
	msg := err.Error()
	// pgx's message repeats the DSN (as pgx redacts it); the message names
	// it once, redacted here.
	if rest, ok := strings.CutPrefix(msg, "cannot parse `"); ok {
		if i := strings.Index(rest, "`: "); i >= 0 {
			msg = rest[i+len("`: "):]
		}
	}
	// pgx redacts what it recognises as a password; remove what redact
	// finds too, in case pgx could not tell.
	for _, pw := range passwords(dsn) {
		if pw != "" {
			msg = strings.ReplaceAll(msg, pw, "xxxxx")
		}
	}
	return fmt.Errorf("invalid PostgreSQL DSN %s: %s: %w", redact(dsn), msg, store.ErrInvalid)
}

// hasSetting reports whether a DSN names a setting, in either syntax.
func hasSetting(dsn, name string) bool {
	return strings.Contains(dsn, name+"=") || strings.Contains(dsn, name+" =")
}

// Pool returns the store's connection pool, for tests and benchmarks that
// look at the tables directly, and for callers that open the transactions
// given to CreateTasksTx. Bucket leases and heartbeats do not use it: they
// have LeaseConns connections of their own.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Close ends every subscription and closes the pool. It waits for
// statements in progress to finish.
func (s *Store) Close() {
	s.mu.Lock()
	s.closed = true
	subs := make([]*subscription, 0, len(s.subs))
	for sub := range s.subs {
		subs = append(subs, sub)
	}
	s.mu.Unlock()
	for _, sub := range subs {
		_ = sub.Close()
	}
	s.pool.Close()
	s.leases.Close()
}

const nowSQL = `SELECT statement_timestamp()`

// Now returns the database's clock.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	var now time.Time
	if err := s.pool.QueryRow(ctx, nowSQL).Scan(&now); err != nil {
		return time.Time{}, wrap(err, "read the database clock")
	}
	return now.UTC(), nil
}

// errClosed is returned by Listen after Close.
var errClosed = errors.New("the store is closed")

// batchedTx runs fn on one connection of the pool, for a transaction that
// fn sends in batches (BEGIN with its first statements, COMMIT with its
// last), in fewer round trips than pgx.BeginFunc's one per statement. A
// transaction fn leaves open, by an error or with nothing to write, is
// rolled back here, so that the connection goes back to the pool clean.
func (s *Store) batchedTx(ctx context.Context, fn func(conn *pgx.Conn) error) error {
	return batchedTxOn(ctx, s.pool, fn)
}

// batchedTxOn is batchedTx on a connection of pool.
func batchedTxOn(ctx context.Context, pool *pgxpool.Pool, fn func(conn *pgx.Conn) error) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return wrap(err, "begin a transaction")
	}
	defer conn.Release()
	err = fn(conn.Conn())
	if conn.Conn().PgConn().TxStatus() != 'I' {
		// Without a deadline of its own: the caller's may be what ended fn.
		// A connection this cannot reach is closed by the pool on release.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = conn.Exec(rctx, "ROLLBACK")
	}
	return err
}

// readOnItsPlan runs one read in a transaction of its own under setting,
// which asks for the read's generic plan (genericPlanSQL, or one that also
// turns scans off), sent with its BEGIN and COMMIT in one round trip; read
// consumes the rows. Each such read is one a node sends on a timer, which
// planning afresh at each call cost more than running, and each has a
// test of the plan its connection makes once.
func (s *Store) readOnItsPlan(ctx context.Context, setting, sql string, args []any, read func(pgx.Rows) error) error {
	return settledTxOn(ctx, s.pool, setting, sql, args, read)
}

// settledTxOn runs one statement in a transaction of its own on a
// connection of pool, after setting (its plan settings), sent with its
// BEGIN and COMMIT in one round trip; read consumes its rows.
func settledTxOn(ctx context.Context, pool *pgxpool.Pool, setting, sql string, args []any, read func(pgx.Rows) error) error {
	return batchedTxOn(ctx, pool, func(conn *pgx.Conn) error {
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		b.Queue(setting)
		b.Queue(sql, args...).Query(read)
		b.Queue("COMMIT")
		return conn.SendBatch(ctx, b).Close()
	})
}
