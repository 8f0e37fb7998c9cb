package flotilla_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/flotilla-dev/flotilla/flotillatest"
	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/node"
)

// exampleT is the *testing.T that package flotillatest and the test
// databases ask for, in examples, which have none: a failure panics, and
// done runs the clean-ups.
type exampleT struct {
	testing.TB
	cleanups []func()
}

func (t *exampleT) Helper()                           {}
func (t *exampleT) Name() string                      { return "Example" }
func (t *exampleT) Context() context.Context          { return context.Background() }
func (t *exampleT) Cleanup(f func())                  { t.cleanups = append(t.cleanups, f) }
func (t *exampleT) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (t *exampleT) Errorf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

func (t *exampleT) TempDir() string {
	dir, err := os.MkdirTemp("", "flotilla-example-")
	if err != nil {
		panic(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func (t *exampleT) done() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}

// exampleFleet is a fleet of one node on an SQLite file in a temporary
// directory, running the handlers register registers: the setup most
// examples share (see ExampleHandle for it written out). done shuts it down
// and removes the file.
func exampleFleet(register func(n *node.Node) error, opts ...flotillatest.FleetOption) (fleet *flotillatest.Fleet, done func()) {
	t := &exampleT{}
	return flotillatest.NewFleet(t, register, opts...), t.done
}

// postgresDSN is a new, empty PostgreSQL database on the test server, which
// done drops: the examples of the calls that take a pgx.Tx run on it.
func postgresDSN() (dsn string, done func()) {
	t := &exampleT{}
	return testdb.New(t), t.done
}
