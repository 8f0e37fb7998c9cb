package sqlite

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A node that declares no capacity writes, at each refresh and inside the
// writer's lock, why its tasks that need resources wait. The statement
// must read those tasks by their index, not walk the whole backlog of its
// buckets.
func TestResourceWaitReasonsReadOnlyTheTasksThatNeedResources(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := New(ctx, filepath.Join(t.TempDir(), "flotilla.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Migrate(ctx, 8); err != nil {
		t.Fatal(err)
	}
	rows, err := s.rdb.QueryContext(ctx, "EXPLAIN QUERY PLAN "+setResourceWaitReasonsSQL,
		`[["noop", "", true, true, {}, "resources: none"]]`, time.Now().UnixMicro(), `[1, 2]`, 100)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	text := strings.Join(plan, "\n")
	if !strings.Contains(text, "flotilla_tasks_resources_waiting_idx") {
		t.Errorf("writing reasons by resources does not read the tasks needing resources by their index:\n%s", text)
	}
}
