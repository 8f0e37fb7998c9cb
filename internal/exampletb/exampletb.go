// Package exampletb gives runnable examples the testing.TB that package
// flotillatest and the test databases ask for, which an example has none
// of: a failure panics (the example fails with it), and Done runs the
// clean-ups, as the end of a test would.
package exampletb

import (
	"context"
	"fmt"
	"os"
	"testing"
)

// TB is a testing.TB for an example. Only the methods below may be called;
// the embedded interface is nil.
type TB struct {
	testing.TB
	cleanups []func()
}

func (t *TB) Helper()                           {}
func (t *TB) Name() string                      { return "Example" }
func (t *TB) Context() context.Context          { return context.Background() }
func (t *TB) Cleanup(f func())                  { t.cleanups = append(t.cleanups, f) }
func (t *TB) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (t *TB) Errorf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

// TempDir is a new directory that Done removes.
func (t *TB) TempDir() string {
	dir, err := os.MkdirTemp("", "flotilla-example-")
	if err != nil {
		panic(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// Done runs the clean-ups, the last registered first.
func (t *TB) Done() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
	t.cleanups = nil
}
