package examples_test

import (
	"testing"

	"github.com/flotilla-dev/flotilla/internal/testdb"
)

// The outbox example runs on PostgreSQL too, on a database from testdb,
// which also checks for leaked goroutines.
func TestMain(m *testing.M) { testdb.VerifyNoLeaks(m) }
