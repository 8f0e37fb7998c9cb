package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/task"
)

// TestStoppingAnExecTaskLeavesNoProcess runs an exec task whose shell
// ignores SIGTERM and has a child of its own, stops it from another process,
// and checks that nothing of the task's process group survives: the node
// sends SIGTERM to the group, then SIGKILL after the stop grace.
func TestStoppingAnExecTaskLeavesNoProcess(t *testing.T) {
	needsIntegration(t)
	f := newFleet(t)
	f.worker("run", "--node-id", "runner", "--allow-exec", "sh", "--stop-grace", "1s")
	f.waitUntilHeld("runner", mustSet(t, "0-63"), startWithin)

	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pgid")
	script := fmt.Sprintf(`echo $$ > %s; trap "" TERM; sleep 300 & wait`, pidFile)
	payload, _ := json.Marshal(map[string]any{"argv": []string{"sh", "-c", script}})
	id := f.submit("--kind", "exec", "--key", "exec-1", "--payload", string(payload), "--max-attempts", "1")
	f.waitForTask(id, "running", func(tk *task.Task) bool { return tk.Status == task.Running })

	var pgid int
	eventually(t, 30*time.Second, "the child wrote its process group id", func() bool {
		raw, err := os.ReadFile(pidFile)
		if err != nil {
			return false
		}
		pgid, err = strconv.Atoi(strings.TrimSpace(string(raw)))
		return err == nil && pgid > 0
	})
	eventually(t, 30*time.Second, "the child's own child runs", func() bool { return len(groupMembers(pgid)) >= 2 })

	_, stderr, code := f.cli("stop", fmt.Sprint(id), "--wait")
	if code != 0 {
		t.Fatalf("worker stop --wait exited %d: %s", code, stderr)
	}
	eventually(t, 30*time.Second, fmt.Sprintf("no live process left in group %d", pgid), func() bool {
		return len(groupMembers(pgid)) == 0
	})
	if got := f.mustGet(id).Task.Status; got != task.Stopped {
		t.Errorf("exec task is %s, want stopped", got)
	}
}

// TestExecIsRefusedWithoutAnAllowList: a node started without --allow-exec
// fails exec tasks at once, naming why, and runs nothing.
func TestExecIsRefusedWithoutAnAllowList(t *testing.T) {
	needsIntegration(t)
	f := newFleet(t)
	f.worker("run", "--node-id", "plain")
	f.waitUntilHeld("plain", mustSet(t, "0-63"), startWithin)
	marker := filepath.Join(t.TempDir(), "ran")
	payload, _ := json.Marshal(map[string]any{"argv": []string{"touch", marker}})
	id := f.submit("--kind", "exec", "--key", "exec-2", "--payload", string(payload), "--max-attempts", "1")
	r := f.waitForTask(id, "failed", func(tk *task.Task) bool { return tk.Status.Terminal() })
	if r.Task.Status != task.Failed || !strings.Contains(r.Task.Error, "exec is not allowed on this node") {
		t.Errorf("exec on a node without --allow-exec: %s", describeTask(r))
	}
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused command ran: %v", err)
	}
}

// groupMembers lists the live processes (not zombies) of a process group,
// from /proc.
func groupMembers(pgid int) []int {
	entries, _ := os.ReadDir("/proc")
	var live []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces, so split
		// after its closing parenthesis.
		rest := string(raw[strings.LastIndexByte(string(raw), ')')+1:])
		fields := strings.Fields(rest)
		if len(fields) < 3 || fields[0] == "Z" {
			continue
		}
		if g, _ := strconv.Atoi(fields[2]); g == pgid {
			live = append(live, pid)
		}
	}
	return live
}
