package main

import (
	"os"
	"strings"
	"testing"
)

// TestRunRefusesAnUnsafeExecConfig: a node refuses to start (exit 2),
// naming the value, before it looks for a database.
func TestRunRefusesAnUnsafeExecConfig(t *testing.T) {
	withoutDSNEnv(t)
	tests := []struct {
		args     []string
		mentions []string
	}{
		{args: []string{"--allow-exec-env", "BASH_ENV"}, mentions: []string{"--allow-exec-env BASH_ENV is refused", "docs/exec.md"}},
		{args: []string{"--allow-exec-env", "GREETING", "--allow-exec-env", "LD_PRELOAD"}, mentions: []string{"--allow-exec-env LD_PRELOAD is refused"}},
		{args: []string{"--allow-exec-env", "BASH_FUNC_echo%%"}, mentions: []string{"BASH_FUNC_echo%%"}},
		{args: []string{"--allow-exec-env", "PATH"}, mentions: []string{"--allow-exec-env PATH is refused"}},
		{args: []string{"--allow-exec-env", "FLOTILLA_TASK_ID"}, mentions: []string{"FLOTILLA_TASK_ID"}},
		{args: []string{"--allow-exec-env", "A=B"}, mentions: []string{`"A=B" is not a valid environment variable name`}},
		{args: []string{"--exec-user", "no-such-user-flotilla"}, mentions: []string{"invalid --exec-user", `"no-such-user-flotilla"`, "no such user"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, stderr, code := runWorker(t, append([]string{"run"}, tt.args...)...)
			if code != exitInvalid {
				t.Errorf("exit %d, want %d; stderr: %s", code, exitInvalid, stderr)
			}
			for _, want := range tt.mentions {
				if !strings.Contains(stderr, want) {
					t.Errorf("stderr %q does not say %q", stderr, want)
				}
			}
		})
	}
}

// TestRunAcceptsASafeExecConfig gets past the exec flags to the database.
func TestRunAcceptsASafeExecConfig(t *testing.T) {
	withoutDSNEnv(t)
	args := []string{"run", "--dsn", unreachable, "--allow-exec", "/bin/echo", "--allow-exec-env", "GREETING", "--allow-exec-env", "LANG"}
	if os.Geteuid() == 0 { // elsewhere --exec-user is refused: see kinds.TestExecUserNeedsRoot
		args = append(args, "--exec-user", "nobody")
	}
	_, stderr, code := runWorker(t, args...)
	if code != exitRuntime || !strings.Contains(stderr, "cannot reach PostgreSQL") {
		t.Errorf("exit %d, want %d, failing to connect; stderr: %s", code, exitRuntime, stderr)
	}
}
