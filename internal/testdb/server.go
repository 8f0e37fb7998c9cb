package testdb

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flotilla-dev/flotilla/internal/patience"
)

// A Server is a PostgreSQL server of one test's own: initdb into a
// temporary directory, listening on a free loopback port, removed when the
// test ends. A test that stops, restarts, kills, partitions or fills a
// server uses one, so that it never touches a server it did not start.
//
// The server runs the installed binaries ([ServerBinDir]) as the tests'
// user, or as the postgres user when the tests run as root. It trusts every
// local connection, keeps nothing safe across a crash of the machine (fsync
// is off), and logs to a file that a failing test shows.
//
// Its methods, other than the getters, must be called from the test's
// goroutine: they fail the test.
type Server struct {
	t        testing.TB
	bin      string
	dir      string // owned by the server's user: data/ and server.log
	data     string
	logPath  string
	port     int
	name     string // cluster_name: in every server process's title
	cred     *syscall.Credential
	settings []string

	mu   sync.Mutex
	cmd  *exec.Cmd     // the postmaster; nil while stopped
	done chan struct{} // closed once cmd has exited and been waited for
}

// serverSettings fit a server that lives for one test: nothing is made
// durable against a crash of the machine, and it listens on loopback TCP
// only. A crash of the server itself (Kill) loses no committed write: a
// commit still writes its WAL to the kernel before it returns
// (synchronous_commit stays on), and the page cache keeps it without fsync.
var serverSettings = []string{
	"listen_addresses=127.0.0.1",
	"unix_socket_directories=",
	"fsync=off",
	"full_page_writes=off",
	"max_connections=100",
	"shared_buffers=32MB",
	"max_wal_size=1GB",
	"logging_collector=off",
	"lc_messages=C",
}

const (
	// serverStartWithin bounds a start until connections are accepted,
	// before patience.Scale.
	serverStartWithin = 60 * time.Second
	// serverStopWithin bounds a shutdown, before patience.Scale; a fast
	// shutdown that takes longer is followed by an immediate one.
	serverStopWithin = 30 * time.Second
	// bindAttempts is how often a first start tries another free port when
	// another process took the one it was given meanwhile.
	bindAttempts = 3
)

// A ServerOption changes how a private server is set up.
type ServerOption func(*Server)

// WithSetting sets a server parameter (postgresql.conf's name = value) for
// every start of the server.
func WithSetting(name, value string) ServerOption {
	return func(s *Server) { s.settings = append(s.settings, name+"="+value) }
}

// StartServer creates a PostgreSQL server for the test and starts it. The
// server is stopped and its files removed when the test ends, whether it
// passed or not; a failing test's log shows the end of the server's. The
// package's TestMain must be [Run] or [VerifyNoLeaks], which remove the
// initialised data directory that the process's servers are copied from.
func StartServer(t testing.TB, opts ...ServerOption) *Server {
	t.Helper()
	skipIfShort(t)
	s := &Server{t: t, settings: append([]string(nil), serverSettings...)}
	for _, opt := range opts {
		opt(s)
	}
	var err error
	if s.bin, err = ServerBinDir(); err != nil {
		t.Fatalf("testdb: %v", err)
	}
	if s.cred, err = serverCredential(); err != nil {
		t.Fatalf("testdb: %v", err)
	}
	s.dir = ServerDir(t)
	s.data = filepath.Join(s.dir, "data")
	s.logPath = filepath.Join(s.dir, "server.log")
	s.name = "flotilla-test-" + randomHex(6)
	// Registered after ServerDir: the server ends before its files go.
	t.Cleanup(s.cleanup)

	if err := s.initdb(); err != nil {
		t.Fatalf("testdb: %v", err)
	}
	for attempt := 1; ; attempt++ {
		s.port = FreePort(t)
		err := s.start()
		if err == nil {
			return s
		}
		if attempt == bindAttempts || !strings.Contains(s.Log(), "could not bind") {
			t.Fatalf("testdb: start PostgreSQL: %v\n%s", err, s.logTail())
		}
	}
}

// initdb makes the server's data directory: a copy of this process's
// initialised one, which the first server of the process makes. A copy
// takes a fraction of initdb's time.
func (s *Server) initdb() error {
	initialised.once.Do(func() { initialised.data, initialised.err = initialise(s.bin, s.cred) })
	if initialised.err != nil {
		return initialised.err
	}
	cp := serverCommand("cp", s.dir, s.cred, "-a", initialised.data, s.data)
	if out, err := cp.CombinedOutput(); err != nil {
		return fmt.Errorf("copy the initialised data directory %s to %s: %v\n%s", initialised.data, s.data, err, out)
	}
	return nil
}

// initialised is the data directory that initdb made for this process's
// servers to copy. [Run] removes it.
var initialised struct {
	once sync.Once
	data string
	err  error
}

// initialise runs initdb into a new temporary directory, which the
// server's user owns.
func initialise(bin string, cred *syscall.Credential) (string, error) {
	dir, err := os.MkdirTemp("", "flotilla-pg-initdb-")
	if err != nil {
		return "", err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			_ = os.RemoveAll(dir)
			return "", fmt.Errorf("give %s to the %s user: %w", dir, serverUser, err)
		}
	}
	data := filepath.Join(dir, "data")
	out, err := serverCommand(filepath.Join(bin, "initdb"), dir, cred, "-D", data, "-U", "postgres", "--auth=trust",
		"--encoding=UTF8", "--locale=C", "--no-sync").CombinedOutput()
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("initdb %s: %v\n%s", data, err, out)
	}
	initialisedDir.Store(dir)
	return data, nil
}

// initialisedDir is the directory initialise made, once it has.
var initialisedDir atomic.Value // string

// removeInitialised removes the data directory that this process's
// servers were copied from, if one was made.
func removeInitialised() error {
	dir, _ := initialisedDir.Load().(string)
	if dir == "" {
		return nil
	}
	return os.RemoveAll(dir)
}

// ServerDir returns a new temporary directory that the server's user owns
// (see [StartServer]), for a server's data directory or anything else a
// test runs as that user. It is removed when the test ends.
func ServerDir(t testing.TB) string {
	t.Helper()
	cred, err := serverCredential()
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	// Not t.TempDir: its parent is private to the tests' user, so the
	// postgres user could not reach into it.
	dir, err := os.MkdirTemp("", "flotilla-pg-")
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("testdb: remove %s: %v", dir, err)
		}
	})
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatalf("testdb: give %s to the %s user: %v", dir, serverUser, err)
		}
	}
	return dir
}

// ServerCommand prepares one of the server binaries (name, in
// [ServerBinDir]) to run as a private server's user, in dir, with a clean
// PostgreSQL environment (no PGDATA, PGPORT, ... of the caller's).
func ServerCommand(t testing.TB, dir, name string, args ...string) *exec.Cmd {
	t.Helper()
	bin, err := ServerBinDir()
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	cred, err := serverCredential()
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	return serverCommand(filepath.Join(bin, name), dir, cred, args...)
}

func (s *Server) command(name string, args ...string) *exec.Cmd {
	return serverCommand(filepath.Join(s.bin, name), s.dir, s.cred, args...)
}

// serverCommand prepares program to run as cred (nil: as this process's
// user) in dir.
func serverCommand(program, dir string, cred *syscall.Credential, args ...string) *exec.Cmd {
	cmd := exec.Command(program, args...)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") && !strings.HasPrefix(kv, "LC_") && !strings.HasPrefix(kv, "LANG=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "LC_ALL=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: cred,
		// Its own group, and killed with this process: a test binary that
		// dies (a -timeout panic runs no cleanup) leaves no server behind.
		Setpgid:   true,
		Pdeathsig: syscall.SIGKILL,
	}
	return cmd
}

// FreePort returns a TCP port on 127.0.0.1 that nothing listens on now.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testdb: find a free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Port is the server's TCP port on 127.0.0.1; it keeps it across restarts.
func (s *Server) Port() int { return s.port }

// Addr is the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// DataDir is the server's data directory.
func (s *Server) DataDir() string { return s.data }

// BinDir is the directory of the binaries the server runs.
func (s *Server) BinDir() string { return s.bin }

// DSN is the URL of the server's maintenance database, postgres, as its
// superuser postgres.
func (s *Server) DSN() string { return s.DatabaseDSN("postgres") }

// DatabaseDSN is the URL of a database of the server's.
func (s *Server) DatabaseDSN(database string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", s.Addr(), database)
}

// New is [New] on this server: a fresh, empty database. It goes with the
// server when the test ends.
func (s *Server) New(t testing.TB) string {
	t.Helper()
	name, dsn := draw(t, s.DSN())
	create(t, s.DSN(), name)
	return dsn
}

// PID is the postmaster's process id, 0 while the server is stopped.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Start starts the stopped server and returns once it accepts connections.
func (s *Server) Start() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatalf("testdb: start PostgreSQL: %v\n%s", err, s.logTail())
	}
}

// Stop shuts the server down as `pg_ctl stop` does by default (fast: every
// session is ended, and a checkpoint written) and returns once every
// process of it has ended.
func (s *Server) Stop() {
	s.t.Helper()
	if err := s.stop(syscall.SIGINT); err != nil {
		s.t.Fatalf("testdb: stop PostgreSQL: %v\n%s", err, s.logTail())
	}
}

// Restart stops the server and starts it again, on the same port: every
// connection to it breaks.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.Start()
}

// Kill kills the postmaster with SIGKILL, as a crash or `kill -9` would,
// and returns once every process of the server has ended (a backend ends
// when it finds its postmaster gone). The next Start recovers from the
// crash.
func (s *Server) Kill() {
	s.t.Helper()
	if err := s.stop(syscall.SIGKILL); err != nil {
		s.t.Fatalf("testdb: kill PostgreSQL: %v\n%s", err, s.logTail())
	}
}

// Log returns what the server has logged so far.
func (s *Server) Log() string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return fmt.Sprintf("(server log unreadable: %v)", err)
	}
	return string(b)
}

// logTail is the end of the server's log, for a failure message.
func (s *Server) logTail() string {
	const keep = 4 << 10
	log := s.Log()
	if len(log) > keep {
		log = "..." + log[len(log)-keep:]
	}
	return "server log " + s.logPath + ":\n" + log
}

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("the server is running already")
	}
	// The server's processes of an earlier life may linger after a Kill;
	// a postmaster refuses to start beside them.
	if err := s.waitForNoProcesses(); err != nil {
		return err
	}
	logFile, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close() // the child has its own descriptor
	args := []string{"-D", s.data, "-p", strconv.Itoa(s.port), "-c", "cluster_name=" + s.name}
	for _, setting := range s.settings {
		args = append(args, "-c", setting)
	}
	cmd := s.command("postgres", args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	s.cmd, s.done = cmd, done

	within := patience.Scale(serverStartWithin)
	deadline := time.Now().Add(within)
	for {
		err := s.ping()
		if err == nil {
			return nil
		}
		select {
		case <-done:
			s.cmd, s.done = nil, nil
			return fmt.Errorf("the postmaster exited: %v", cmd.ProcessState)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.kill(cmd, done)
			s.cmd, s.done = nil, nil
			return fmt.Errorf("no connection accepted within %v: %w", within, err)
		}
	}
}

// ping connects to the server and disconnects.
func (s *Server) ping() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.DSN())
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

// stop sends sig to the postmaster and waits until every process of the
// server has ended: SIGINT is a fast shutdown, SIGQUIT an immediate one,
// SIGKILL a crash.
func (s *Server) stop(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return errors.New("the server is not running")
	}
	cmd, done := s.cmd, s.done
	s.cmd, s.done = nil, nil
	if err := cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal %v to the postmaster (pid %d): %w", sig, cmd.Process.Pid, err)
	}
	within := patience.Scale(serverStopWithin)
	select {
	case <-done:
	case <-time.After(within):
		s.kill(cmd, done)
		return fmt.Errorf("the postmaster (pid %d) had not ended %v after %v; killed", cmd.Process.Pid, within, sig)
	}
	return s.waitForNoProcesses()
}

// kill ends the postmaster and every other process of the server with
// SIGKILL, and waits for the postmaster.
func (s *Server) kill(cmd *exec.Cmd, done <-chan struct{}) {
	_ = cmd.Process.Kill()
	<-done
	for _, pid := range s.processes() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// waitForNoProcesses waits until no process of the server is left: after
// a postmaster has died, its backends end when they find it gone. Those
// still there after the stop deadline are killed.
func (s *Server) waitForNoProcesses() error {
	deadline := time.Now().Add(patience.Scale(serverStopWithin))
	for {
		left := s.processes()
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			for _, pid := range left {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			deadline = time.Now().Add(patience.Scale(serverStopWithin))
			if !pollUntil(deadline, func() bool { return len(s.processes()) == 0 }) {
				return fmt.Errorf("processes %v of the server outlived SIGKILL", left)
			}
			return nil
		}
		time.Sleep(20 * time.Millisecond) // polling, with the deadline above
	}
}

func pollUntil(deadline time.Time, cond func() bool) bool {
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond) // polling, with the deadline given
	}
	return true
}

// processes returns the live (not zombie) processes of the server: those
// whose title names its cluster_name, as every child of its postmaster's
// does ("postgres: <cluster_name>: ..."), found in /proc. PostgreSQL puts
// each child in a session of its own, so a process group would not find
// them. Where there is no /proc, it finds none.
func (s *Server) processes() []int {
	title := []byte("postgres: " + s.name + ": ")
	return liveProcesses(func(proc string) bool {
		cmdline, err := os.ReadFile(filepath.Join(proc, "cmdline"))
		return err == nil && bytes.HasPrefix(cmdline, title)
	})
}

// liveProcesses returns the processes in /proc, other than zombies, for
// which match, given the process's directory there, reports true. Where
// there is no /proc, it finds none.
func liveProcesses(match func(proc string) bool) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		proc := filepath.Join("/proc", e.Name())
		if !match(proc) {
			continue
		}
		stat, err := os.ReadFile(filepath.Join(proc, "stat"))
		if err != nil {
			continue
		}
		// The state follows the command name, which is in parentheses.
		if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
			continue
		}
		pids = append(pids, pid)
	}
	return pids
}

// cleanup ends the server at the end of its test: at once, as nothing it
// holds is kept.
func (s *Server) cleanup() {
	s.mu.Lock()
	running := s.cmd != nil
	s.mu.Unlock()
	if running {
		if err := s.stop(syscall.SIGQUIT); err != nil {
			s.t.Errorf("testdb: stop PostgreSQL at the end of the test: %v", err)
		}
	}
	if s.t.Failed() {
		s.t.Logf("testdb: %s", s.logTail())
	}
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b)
}
