package kinds

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/flotilla-dev/flotilla/internal/hardening"
	"github.com/flotilla-dev/flotilla/task"
)

// environReport is what the node helper prints: how its exec task that
// cats the node's own /proc/<pid>/environ went.
type environReport struct {
	Err    string `json:"err"`
	Stdout string `json:"stdout"`
}

func init() {
	testHelpers["node-dumpable"] = func() error { return catOwnEnviron(false) }
	testHelpers["node-hardened"] = func() error { return catOwnEnviron(true) }
}

// catOwnEnviron acts as a node: optionally hardened as `worker run` is, it
// runs an exec task, allowed cat, that reads the node's environment.
func catOwnEnviron(harden bool) error {
	if harden {
		if err := hardening.DisableDumping(); err != nil {
			return err
		}
	}
	payload, err := json.Marshal(ExecPayload{Argv: []string{"cat", fmt.Sprintf("/proc/%d/environ", os.Getpid())}})
	if err != nil {
		return err
	}
	tk := &task.Task{ID: 1, Kind: "exec", Attempt: 1, Payload: payload}
	runErr := Exec(ExecConfig{Allowed: []string{"cat"}})(context.Background(), tk)
	var report environReport
	if runErr != nil {
		report.Err = runErr.Error()
	}
	var res ExecResult
	if err := json.Unmarshal(tk.Result, &res); err != nil {
		return fmt.Errorf("result %s: %w", tk.Result, err)
	}
	report.Stdout = res.Stdout
	return json.NewEncoder(os.Stdout).Encode(report)
}

// TestExecChildCannotReadTheNodeEnvironment runs a node in a process of its
// own, its DSN in its environment, and an exec task that cats
// /proc/<node pid>/environ. The node and the child share a uid without
// CAP_SYS_PTRACE (nobody, where the tests run as root): then only the
// node's being non-dumpable keeps the DSN from the child.
func TestExecChildCannotReadTheNodeEnvironment(t *testing.T) {
	secret := "postgres://flotilla:" + rand.Text() + "@db.example/fleet"
	tests := []struct {
		mode     string
		readable bool
	}{
		// Without the hardening the child reads it: the test can see a leak.
		{mode: "node-dumpable", readable: true},
		{mode: "node-hardened", readable: false},
	}
	exe := worldExecutableCopy(t)
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			cmd := exec.Command(exe)
			cmd.Dir = filepath.Dir(exe)
			// A race-enabled binary sleeps a second at exit by default.
			cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "GORACE=atexit_sleep_ms=0", testHelperEnv + "=" + tt.mode, "FLOTILLA_DSN=" + secret}
			if os.Geteuid() == 0 {
				// Root has CAP_SYS_PTRACE, which reads any process.
				cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
			}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("node helper: %v\n%s", err, stderr.String())
			}
			var report environReport
			if err := json.Unmarshal(out, &report); err != nil {
				t.Fatalf("node helper printed %q: %v", out, err)
			}
			leaked := strings.Contains(report.Stdout, secret)
			switch {
			case tt.readable && !leaked:
				t.Fatalf("a dumpable node's environment was not readable (err %q, stdout %q): the test cannot tell a protected node", report.Err, report.Stdout)
			case !tt.readable && leaked:
				t.Fatalf("the child read the node's DSN from /proc/<pid>/environ")
			case !tt.readable && !strings.Contains(report.Err, "Permission denied"):
				t.Errorf("the task's error is %q, want cat's Permission denied", report.Err)
			}
		})
	}
}

// worldExecutableCopy copies the test binary where any user may run it.
func worldExecutableCopy(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// t.TempDir's own directory is private to its owner.
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	src, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	path := filepath.Join(dir, "node")
	dst, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}
