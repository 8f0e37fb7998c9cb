package dashboard

import (
	"testing"

	"github.com/flotilla-dev/flotilla/internal/testdb"
)

// The handler tests use the memory store; the page benchmark uses
// PostgreSQL, through testdb, which also checks for leaked goroutines.
func TestMain(m *testing.M) { testdb.VerifyNoLeaks(m) }
