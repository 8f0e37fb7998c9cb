package testdb

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// Run runs the tests and then terminates the PostgreSQL container, if one
// was started, removes what the private servers of [StartServer] were
// copied from, and returns the exit code for os.Exit. Use it as
//
//	func TestMain(m *testing.M) { os.Exit(testdb.Run(m)) }
//
// A failure to terminate the container turns a passing run into a failing
// one.
func Run(m *testing.M) int {
	code := m.Run()
	if err := Terminate(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	if err := removeInitialised(); err != nil {
		fmt.Fprintf(os.Stderr, "testdb: remove the initialised data directory of the private servers: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// VerifyNoLeaks is goleak.VerifyTestMain for packages that use New: it runs
// the tests, terminates the PostgreSQL container if one was started, then,
// if the tests passed, looks for leaked goroutines with goleak.Find and the
// given options, and exits the process (non-zero on failure or leaks). Use
// it as
//
//	func TestMain(m *testing.M) { testdb.VerifyNoLeaks(m) }
//
// When a container was started, the goroutines testcontainers-go leaves
// behind (its reaper connection and its Docker client's idle keep-alive
// connections) are ignored. goleak.Cleanup is not supported: do cleanup in
// the tests.
func VerifyNoLeaks(m *testing.M, opts ...goleak.Option) {
	os.Exit(verifyNoLeaks(m, opts...))
}

func verifyNoLeaks(m *testing.M, opts ...goleak.Option) int {
	code := Run(m)
	if code != 0 {
		return code
	}
	if containerStarted() {
		opts = append(opts, containerLeftovers()...)
	}
	if err := goleak.Find(opts...); err != nil {
		fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
		return 1
	}
	return 0
}

// containerLeftovers are goroutines that testcontainers-go may leave running
// after its container has been terminated.
func containerLeftovers() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("github.com/testcontainers/testcontainers-go.(*Reaper).connect.func1"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
	}
}

func containerStarted() bool {
	server.mu.Lock()
	defer server.mu.Unlock()
	return server.started
}
