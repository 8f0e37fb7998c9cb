package benchmark_test

import (
	"testing"

	"github.com/flotilla-dev/flotilla/internal/testdb"
)

// The workloads run against PostgreSQL, through testdb, which also checks
// for leaked goroutines.
func TestMain(m *testing.M) { testdb.VerifyNoLeaks(m) }
