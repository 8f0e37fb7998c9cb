package store_test

import (
	"strings"
	"testing"

	"github.com/flotilla-dev/flotilla/store"
)

// TestScanOfLooksAtMoreOnlyWhereAKeyCanTurnCandidatesDown: a claim under
// rooms of kinds alone looks at twice what it asks for; one a key's room or
// a resource can turn candidates down at looks at 32 at least.
func TestScanOfLooksAtMoreOnlyWhereAKeyCanTurnCandidatesDown(t *testing.T) {
	fleet := []store.KindRoom{{Kind: "train", Room: 3, KeyRoom: -1}}
	for _, c := range []struct {
		name  string
		lc    store.LimitedClaim
		limit int
		want  int
	}{
		{"kind rooms alone", store.LimitedClaim{Kinds: fleet}, 1, 2},
		{"nothing named", store.LimitedClaim{}, 3, 6},
		{"a key named", store.LimitedClaim{Kinds: fleet, Keys: []store.KeyRoom{{Kind: "train", Key: "a", Room: 1}}}, 1, 32},
		{"keys named with no room of their own", store.LimitedClaim{Kinds: fleet, Keys: []store.KeyRoom{
			{Kind: "train", Key: "a", Room: -1, Used: 1}, {Kind: "train", Key: "b", Room: 0, Used: 2}}}, 1, 2},
		{"a room per key", store.LimitedClaim{Kinds: []store.KindRoom{{Kind: "train", Room: -1, KeyRoom: 2}}}, 1, 32},
		{"resources free", store.LimitedClaim{Kinds: fleet, Free: store.Resources{"gpu": 1}}, 1, 32},
		{"a large claim", store.LimitedClaim{Keys: []store.KeyRoom{{Kind: "train", Key: "a", Room: 1}}}, 100, 200},
		{"past the bound", store.LimitedClaim{}, 6000, 10_000},
		{"set", store.LimitedClaim{Scan: 5}, 100, 5},
	} {
		if got := c.lc.ScanOf(c.limit); got != c.want {
			t.Errorf("%s: ScanOf(%d) = %d, want %d", c.name, c.limit, got, c.want)
		}
	}
}

// TestResourcesAroundSpaces: a list written with spaces after its commas
// names what it says, and a name with spaces around it, which no task's
// name would match, is refused naming it.
func TestResourcesAroundSpaces(t *testing.T) {
	got, err := store.ParseResources("--capacity", "gpu=1, mem = 8")
	if err != nil || len(got) != 2 || got["gpu"] != 1 || got["mem"] != 8 {
		t.Errorf("ParseResources of \"gpu=1, mem = 8\": %v, %v; want gpu=1 and mem=8", got, err)
	}
	err = store.CheckResources("capacity", store.Resources{" mem": 8})
	if err == nil || !strings.Contains(err.Error(), `" mem"`) {
		t.Errorf("a name with a space before it: %v; want it refused, named", err)
	}
}
