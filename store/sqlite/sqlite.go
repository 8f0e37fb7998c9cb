package sqlite

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"time"

	sqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/flotilla-dev/flotilla/store"
)

// Defaults of the options.
const (
	// DefaultBusyTimeout is how long a write waits for another process's
	// write lock before it fails with store.ErrBusy. It is a backstop: one
	// writer per process and short transactions keep real waits to
	// milliseconds, and a node whose writes fail this long steps down as a
	// partitioned node would.
	DefaultBusyTimeout = 5 * time.Second
	// DefaultReadConns is the size of the read pool.
	DefaultReadConns = 4
	// MaxBatch is the most write operations one group commit carries.
	MaxBatch = 128
)

// ErrClosed is returned by every method after Close.
var ErrClosed = errors.New("sqlite store: closed")

var (
	_ store.Store    = (*Store)(nil)
	_ store.Notifier = (*Store)(nil)
)

// Store is the SQLite store: one handle per process on one database file.
// It is safe for concurrent use; Close it when done.
type Store struct {
	path   string
	origin string // names this handle's rows in the outbox

	wdb *sql.DB // one connection, the writer's
	rdb *sql.DB // the read pool
	w   *writer

	mu         sync.Mutex
	numBuckets int
	closed     bool
	subs       map[*subscription]struct{}
	poller     *poller
	locked     map[int64]int // see LockTask
}

// Option configures New.
type Option func(*options)

type options struct {
	busyTimeout time.Duration
	readConns   int
	pollEvery   time.Duration
}

// WithBusyTimeout sets how long a write waits for another process's write
// lock (default DefaultBusyTimeout).
func WithBusyTimeout(d time.Duration) Option { return func(o *options) { o.busyTimeout = d } }

// WithReadConns sets the size of the read pool (default DefaultReadConns).
func WithReadConns(n int) Option { return func(o *options) { o.readConns = n } }

// WithOutboxPoll sets how often listeners read other processes'
// notifications from the outbox (default DefaultOutboxPoll).
func WithOutboxPoll(d time.Duration) Option { return func(o *options) { o.pollEvery = d } }

// New opens (creating it if need be) the database file at path. It does not
// migrate: call Migrate, as with every store.
func New(ctx context.Context, path string, opts ...Option) (*Store, error) {
	o := options{busyTimeout: DefaultBusyTimeout, readConns: DefaultReadConns, pollEvery: DefaultOutboxPoll}
	for _, opt := range opts {
		opt(&o)
	}
	switch {
	case path == "":
		return nil, fmt.Errorf("%w: the SQLite store needs a file path", store.ErrInvalid)
	case strings.ContainsAny(path, "?#"):
		return nil, fmt.Errorf("%w: SQLite file path %q has a ? or #: give a plain file path", store.ErrInvalid, path)
	case o.busyTimeout < time.Millisecond:
		return nil, fmt.Errorf("%w: busy timeout %v: give at least 1ms", store.ErrInvalid, o.busyTimeout)
	case o.readConns < 1:
		return nil, fmt.Errorf("%w: read connections %d: give at least 1", store.ErrInvalid, o.readConns)
	case o.pollEvery <= 0:
		return nil, fmt.Errorf("%w: outbox poll interval %v is not positive", store.ErrInvalid, o.pollEvery)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("SQLite file %s: %w", path, err)
	}
	wdb, err := openDB(abs, o.busyTimeout, false)
	if err != nil {
		return nil, err
	}
	// One writer connection: SQLite has one writer at a time anyway, and
	// within the process the writer goroutine orders the writes, so none
	// of them waits on the file lock for another of the same process.
	wdb.SetMaxOpenConns(1)
	wdb.SetMaxIdleConns(1)
	wdb.SetConnMaxLifetime(0)
	wdb.SetConnMaxIdleTime(0)
	rdb, err := openDB(abs, o.busyTimeout, true)
	if err != nil {
		_ = wdb.Close()
		return nil, err
	}
	rdb.SetMaxOpenConns(o.readConns)
	rdb.SetMaxIdleConns(o.readConns)
	rdb.SetConnMaxIdleTime(0)

	conn, err := wdb.Conn(ctx)
	if err == nil {
		// WAL is a property of the file: set once, by the writer, it holds
		// for every connection and every process.
		var mode string
		err = conn.QueryRowContext(ctx, `PRAGMA journal_mode = WAL`).Scan(&mode)
		if err == nil && !strings.EqualFold(mode, "wal") {
			err = fmt.Errorf("journal mode is %s, not WAL", mode)
		}
		if err == nil {
			err = rdb.PingContext(ctx)
		}
	}
	if err != nil {
		if conn != nil {
			_ = conn.Close()
		}
		_ = wdb.Close()
		_ = rdb.Close()
		return nil, fmt.Errorf("open SQLite file %s: %w", abs, translate(err))
	}
	s := &Store{path: abs, origin: newOrigin(), wdb: wdb, rdb: rdb, subs: map[*subscription]struct{}{}}
	s.poller = newPoller(s, o.pollEvery)
	s.w = startWriter(s, conn, o.busyTimeout)
	return s, nil
}

// openDB opens a pool on the file with the pragmas every connection needs.
func openDB(path string, busy time.Duration, readOnly bool) (*sql.DB, error) {
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busy.Milliseconds()))
	// NORMAL is durable in WAL mode up to the last checkpoint-free commit
	// on power loss, and crash-safe for a killed process, which is what a
	// worker needs; FULL would add an fsync of the WAL to every commit.
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Add("_pragma", "foreign_keys(OFF)")
	if readOnly {
		q.Add("_pragma", "query_only(1)")
	}
	// A write begins IMMEDIATE: a deferred transaction that upgrades to a
	// write lock gets SQLITE_BUSY at once, whatever the busy timeout says.
	q.Set("_txlock", "immediate")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("open SQLite file %s: %w", path, err)
	}
	return db, nil
}

func newOrigin() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Path is the absolute path of the database file.
func (s *Store) Path() string { return s.path }

// DB is the read pool, for tests and tools that inspect the file. Writing
// through it fails: its connections are query_only.
func (s *Store) DB() *sql.DB { return s.rdb }

// Close stops the writer and the listeners and closes the connections.
// Closing twice is harmless.
func (s *Store) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	subs := make([]*subscription, 0, len(s.subs))
	for sub := range s.subs {
		subs = append(subs, sub)
	}
	s.mu.Unlock()
	for _, sub := range subs {
		_ = sub.Close()
	}
	s.poller.stop()
	s.w.stop()
	_ = s.wdb.Close()
	_ = s.rdb.Close()
}

func (s *Store) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// nowSQL is the database clock: SQLite's own time, read inside the
// statement, in microseconds since the Unix epoch. SQLite's clock has
// millisecond resolution; unixepoch('subsec') gives all of it.
const nowSQL = `CAST(round(unixepoch('subsec') * 1000) AS INTEGER) * 1000`

// Now is the database clock.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	if s.isClosed() {
		return time.Time{}, ErrClosed
	}
	var us int64
	if err := s.rdb.QueryRowContext(ctx, `SELECT `+nowSQL).Scan(&us); err != nil {
		return time.Time{}, wrap(err, "read the clock")
	}
	return time.UnixMicro(us).UTC(), nil
}

// micros is a time as the store keeps it; nil for the zero time.
func micros(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixMicro()
}

// fromMicros reads a time column.
func fromMicros(v sql.NullInt64) time.Time {
	if !v.Valid {
		return time.Time{}
	}
	return time.UnixMicro(v.Int64).UTC()
}

// dbTime brings a time to what the store keeps: UTC, microseconds.
func dbTime(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.UTC().Truncate(time.Microsecond)
}

// wrap names what failed and translates the driver's error.
func wrap(err error, format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), translate(err))
}

// translate turns SQLite's conditions into the store's sentinels, keeping
// the driver's message.
func translate(err error) error {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return err
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
		return fmt.Errorf("%w (%v)", store.ErrBusy, err)
	case sqlite3.SQLITE_CONSTRAINT:
		if se.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE || se.Code() == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY {
			return fmt.Errorf("%w (%v)", store.ErrDuplicate, err)
		}
	}
	return err
}

// isNoSuchTable reports SQLite's "no such table", which is how an
// unmigrated file answers.
func isNoSuchTable(err error) bool {
	return err != nil && strings.Contains(err.Error(), "no such table")
}

// checkOpen refuses a closed store.
func (s *Store) checkOpen() error {
	if s.isClosed() {
		return ErrClosed
	}
	return nil
}

// fleetSize returns the fleet's bucket count, reading it once.
func (s *Store) fleetSize(ctx context.Context) (int, error) {
	s.mu.Lock()
	n := s.numBuckets
	s.mu.Unlock()
	if n > 0 {
		return n, nil
	}
	meta, err := s.Meta(ctx)
	if err != nil {
		return 0, err
	}
	return meta.NumBuckets, nil
}

func (s *Store) setNumBuckets(n int) {
	s.mu.Lock()
	s.numBuckets = n
	s.mu.Unlock()
}

// limitOr returns limit, or fallback when limit is not positive.
func limitOr(limit, fallback int) int {
	if limit <= 0 {
		return fallback
	}
	return limit
}
