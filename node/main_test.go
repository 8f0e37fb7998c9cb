package node

import (
	"testing"

	"github.com/flotilla-dev/flotilla/internal/testdb"
)

// Unit tests use the memory store; the latency benchmarks use PostgreSQL,
// through testdb, which also checks for leaked goroutines.
func TestMain(m *testing.M) { testdb.VerifyNoLeaks(m) }
