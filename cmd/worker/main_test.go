package main

import (
	"bytes"
	"testing"

	"github.com/flotilla-dev/flotilla/internal/testdb"
)

func TestMain(m *testing.M) { testdb.VerifyNoLeaks(m) }

// runWorker runs the command line in this process, as main would, and
// returns what it printed and its exit status.
func runWorker(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(append([]string{"worker"}, args...), &out, &errOut)
	return out.String(), errOut.String(), code
}
