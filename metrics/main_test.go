package metrics_test

import (
	"testing"

	"github.com/flotilla-dev/flotilla/internal/testdb"
)

func TestMain(m *testing.M) { testdb.VerifyNoLeaks(m) }
