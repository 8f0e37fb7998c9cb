package sqlite

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
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

// ErrReadOnly is returned by every write of a store opened ReadOnly.
var ErrReadOnly = errors.New("sqlite store: opened read-only, it writes nothing")

var (
	_ store.Store    = (*Store)(nil)
	_ store.Notifier = (*Store)(nil)
)

// Store is the SQLite store: one handle per process on one database file.
// It is safe for concurrent use; Close it when done.
type Store struct {
	path   string
	origin string // names this handle's rows in the outbox

	wdb *sql.DB // one connection, the writer's; nil when read-only
	rdb *sql.DB // the read pool
	w   *writer // nil when read-only

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
	readOnly    bool
}

// WithBusyTimeout sets how long a write waits for another process's write
// lock (default DefaultBusyTimeout).
func WithBusyTimeout(d time.Duration) Option { return func(o *options) { o.busyTimeout = d } }

// WithReadConns sets the size of the read pool (default DefaultReadConns).
func WithReadConns(n int) Option { return func(o *options) { o.readConns = n } }

// WithOutboxPoll sets how often listeners read other processes'
// notifications from the outbox (default DefaultOutboxPoll).
func WithOutboxPoll(d time.Duration) Option { return func(o *options) { o.pollEvery = d } }

// ReadOnly opens an existing file for reading only: New never creates the
// file (a missing one is a *NoFileError), the handle has no writer, and
// every write fails with ErrReadOnly. A file the process may only read (a
// backup, another user's file) can be opened so; see openReadOnly for how
// WAL's side files are treated.
func ReadOnly() Option { return func(o *options) { o.readOnly = true } }

// NoFileError says that a store opened ReadOnly found no file to read.
type NoFileError struct{ Path string }

func (e *NoFileError) Error() string {
	return fmt.Sprintf("SQLite file %s does not exist (opened read-only, the store creates none)", e.Path)
}

// Is makes a missing file read as a database without the schema
// (store.ErrSchema): nothing has been set up there yet.
func (e *NoFileError) Is(target error) bool { return target == store.ErrSchema }

// FileMode is the mode of the files the store creates: the database file,
// and after it SQLite's -wal and -shm, which SQLite gives the database
// file's mode. Every payload and result is in them, so only the node's
// user may read them.
const FileMode os.FileMode = 0o600

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
	if o.readOnly {
		return openReadOnly(ctx, abs, o)
	}
	if err := createPrivate(abs); err != nil {
		return nil, err
	}
	wdb := openDB(abs, o.busyTimeout, readWrite)
	// One writer connection: SQLite has one writer at a time anyway, and
	// within the process the writer goroutine orders the writes, so none
	// of them waits on the file lock for another of the same process.
	wdb.SetMaxOpenConns(1)
	wdb.SetMaxIdleConns(1)
	wdb.SetConnMaxLifetime(0)
	wdb.SetConnMaxIdleTime(0)
	rdb := openDB(abs, o.busyTimeout, queryOnly)
	rdb.SetMaxOpenConns(o.readConns)
	rdb.SetMaxIdleConns(o.readConns)
	rdb.SetConnMaxIdleTime(0)
	s := &Store{path: abs, origin: newOrigin(), wdb: wdb, rdb: rdb, subs: map[*subscription]struct{}{}}
	fail := func(err error) (*Store, error) {
		if s.w != nil && s.w.conn != nil {
			_ = s.w.conn.Close()
		}
		_ = wdb.Close()
		_ = rdb.Close()
		return nil, fmt.Errorf("open SQLite file %s: %w", abs, describeOpenError(abs, translate(err)))
	}
	if s.w, err = newWriter(s, wdb, o.busyTimeout); err != nil {
		return fail(err)
	}
	if err := s.w.checkWritable(ctx); err != nil {
		return fail(err)
	}
	// WAL is a property of the file: set once, by the writer, it holds
	// for every connection and every process. Setting it writes the
	// file's header, a commit of its own, which the writer lets through.
	s.w.committing.Store(true)
	var mode string
	err = s.w.conn.QueryRowContext(ctx, `PRAGMA journal_mode = WAL`).Scan(&mode)
	s.w.committing.Store(false)
	if err == nil && !strings.EqualFold(mode, "wal") {
		err = fmt.Errorf("journal mode is %s, not WAL", mode)
	}
	if err == nil {
		err = rdb.PingContext(ctx)
	}
	if err != nil {
		return fail(err)
	}
	s.poller = newPoller(s, o.pollEvery)
	s.w.start()
	return s, nil
}

// createPrivate creates the database file, empty, readable by its owner
// alone, unless it exists: SQLite would create it under the umask (0644
// as a rule), and gives its -wal and -shm files the database file's mode.
func createPrivate(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, FileMode)
	switch {
	case err == nil:
		return f.Close()
	case errors.Is(err, fs.ErrExist):
		return nil
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("cannot create SQLite file %s: the directory %s is not writable by this user",
			path, filepath.Dir(path))
	}
	return fmt.Errorf("cannot create SQLite file %s: %w", path, err)
}

// describeOpenError says what a failure to open or set up the file means
// when the cause is a permission: SQLite keeps its -wal and -shm files
// beside the database, so the directory must be writable too.
func describeOpenError(path string, err error) error {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return err
	}
	dir := filepath.Dir(path)
	switch se.Code() {
	case sqlite3.SQLITE_READONLY_DIRECTORY:
		return fmt.Errorf("the directory %s is not writable by this user, and SQLite keeps the database's "+
			"-wal and -shm files beside it: give the node's user write permission on the directory (%s)", dir, shortError(se))
	case sqlite3.SQLITE_CANTOPEN:
		return fmt.Errorf("SQLite cannot open it: the directory %s must exist and be writable by this user, since "+
			"SQLite keeps the database's -wal and -shm files beside it (%s)", dir, shortError(se))
	case sqlite3.SQLITE_READONLY, sqlite3.SQLITE_READONLY_RECOVERY, sqlite3.SQLITE_READONLY_CANTINIT,
		sqlite3.SQLITE_READONLY_CANTLOCK, sqlite3.SQLITE_READONLY_DBMOVED:
		return fmt.Errorf("the file or its -wal and -shm files are not writable by this user (%s)", shortError(se))
	}
	return err
}

// shortError is SQLite's message.
func shortError(se *sqlite.Error) string { return se.Error() }

// access is how a pool's connections may use the file.
type access int

const (
	readWrite access = iota // the writer
	queryOnly               // the read pool of a writing handle: reads, on a file opened for writing
	readOnly                // a read-only handle: the file opened read-only, never created
	immutable               // a read-only handle on a file nobody writes (see openReadOnly)
)

// openDB opens a pool on the file with the pragmas every connection needs.
// It connects lazily: the first use opens the file.
func openDB(path string, busy time.Duration, a access) *sql.DB {
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busy.Milliseconds()))
	// NORMAL is durable in WAL mode up to the last checkpoint-free commit
	// on power loss, and crash-safe for a killed process, which is what a
	// worker needs; FULL would add an fsync of the WAL to every commit.
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Add("_pragma", "foreign_keys(OFF)")
	switch a {
	case queryOnly:
		q.Add("_pragma", "query_only(1)")
	case readOnly:
		q.Add("_pragma", "query_only(1)")
		q.Set("mode", "ro")
	case immutable:
		q.Add("_pragma", "query_only(1)")
		q.Set("mode", "ro")
		q.Set("immutable", "1")
	}
	// A write begins IMMEDIATE: a deferred transaction that upgrades to a
	// write lock gets SQLITE_BUSY at once, whatever the busy timeout says.
	q.Set("_txlock", "immediate")
	// sql.Open only checks the driver's name, which is registered.
	db, _ := sql.Open("sqlite", fileURI(path, q))
	return db
}

// fileURI is the URI that opens path with params. SQLite decodes %XX
// escapes in a URI's path and ends the path at ? or #: each of the three is
// escaped, so that the file opened is the file named (jobs%41.db is not
// jobsA.db).
func fileURI(path string, params url.Values) string {
	return "file:" + uriPathEscaper.Replace(path) + "?" + params.Encode()
}

var uriPathEscaper = strings.NewReplacer("%", "%25", "?", "%3F", "#", "%23")

// openReadOnly opens a handle that reads the file at path and writes
// nothing, the file included: no WAL mode is set, no schema created.
//
// A reader of a WAL file needs its -shm file (the index of the WAL, shared
// by every connection) and, when it is missing, creates it beside the file,
// and the -wal too. With mode=ro that works wherever the directory is
// writable or the side files exist already, which covers a live fleet:
// while any connection has the file open its -shm is there, and a reader
// that may not write it gets SQLite's read-only use of it. What is left is
// a file whose side files are gone (its last connection closed cleanly,
// checkpointing the WAL into the file) in a directory this user may not
// write: a backup, or another user's fleet at rest. Nothing is in a WAL
// then, and such a file is opened immutable=1, which reads the file alone,
// with no lock and no side file. immutable is kept for that case only: on a
// file that a live writer changes it would read pages of the file without
// the WAL's newer ones, and could see a half-written page.
func openReadOnly(ctx context.Context, path string, o options) (*Store, error) {
	if _, err := os.Stat(path); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, &NoFileError{Path: path}
		}
		return nil, fmt.Errorf("SQLite file %s: %w", path, err)
	}
	rdb := openDB(path, o.busyTimeout, readOnly)
	err := probe(ctx, rdb)
	var se *sqlite.Error
	if errors.As(err, &se) && (se.Code() == sqlite3.SQLITE_READONLY_DIRECTORY || se.Code()&0xff == sqlite3.SQLITE_CANTOPEN) &&
		!hasWAL(path) {
		_ = rdb.Close()
		rdb = openDB(path, o.busyTimeout, immutable)
		err = probe(ctx, rdb)
	}
	if err != nil {
		_ = rdb.Close()
		return nil, fmt.Errorf("open SQLite file %s read-only: %w", path, describeOpenError(path, translate(err)))
	}
	rdb.SetMaxOpenConns(o.readConns)
	rdb.SetMaxIdleConns(o.readConns)
	rdb.SetConnMaxIdleTime(0)
	s := &Store{path: path, origin: newOrigin(), rdb: rdb, subs: map[*subscription]struct{}{}}
	s.poller = newPoller(s, o.pollEvery)
	return s, nil
}

// probe reads the file's schema, which opens it (and its WAL) for real.
func probe(ctx context.Context, db *sql.DB) error {
	var n int
	return db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master`).Scan(&n)
}

// hasWAL reports whether the file has a WAL with frames in it.
func hasWAL(path string) bool {
	fi, err := os.Stat(path + "-wal")
	return err == nil && fi.Size() > 0
}

// ReadableByOthers lists those of the database's files (the file, its -wal
// and its -shm) that exist and that users other than their owner may read.
// The store creates them readable by their owner alone (FileMode); a file
// created before, or whose mode was changed, may be open to every local
// account, with every payload and result in it.
func ReadableByOthers(path string) []string {
	var open []string
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode().Perm()&0o044 != 0 {
			open = append(open, fmt.Sprintf("%s (%s)", p, fi.Mode().Perm()))
		}
	}
	return open
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
	if s.w != nil {
		s.w.stop()
		_ = s.wdb.Close()
	}
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
