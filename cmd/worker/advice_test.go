package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/kinds"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// The library's errors name Go options; what the command line prints names
// its own flags and commands as well.
func TestTheCommandLineAddsItsFlagsToTheLibrarysAdvice(t *testing.T) {
	lite := sqliteFleet(t)
	// An empty file has no schema; a missing one has its own message
	// (TestReadCommandsDoNotCreateTheFile).
	empty := filepath.Join(t.TempDir(), "empty.db")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		code int
		want []string
	}{
		{[]string{"submit", "--kind", "noop", "--key", "k", "--dsn", lite}, exitRefused,
			[]string{"flotilla.AllowUnowned()", "(on the command line: --allow-unowned submits it anyway)"}},
		{[]string{"list", "--dsn", "sqlite:" + empty}, exitRefused,
			[]string{"flotilla.Migrate", "(on the command line: run `worker migrate`)"}},
	} {
		_, stderr, code := runWorker(t, c.args...)
		if code != c.code {
			t.Errorf("worker %v exited %d, want %d: %s", c.args, code, c.code, stderr)
		}
		for _, want := range c.want {
			if !strings.Contains(stderr, want) {
				t.Errorf("worker %v printed %q, which lacks %q", c.args, stderr, want)
			}
		}
	}
	if fi, err := os.Stat(empty); err != nil || fi.Size() != 0 {
		t.Errorf("a read command wrote to an empty SQLite file: %v", err)
	}
}

func TestFlagAdviceForEachLibraryErrorThatNamesAGoOption(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{&flotilla.UnheldBucketError{Key: "k", Bucket: 3}, "--allow-unowned"},
		{fmt.Errorf("task 1 of 2: %w", &flotilla.UnservedKindError{Kind: "x", Bucket: 3}), "--allow-unknown-kind"},
		{fmt.Errorf("sqlite:x.db: %w", flotilla.ErrNoSchema), "worker migrate"},
		{&store.SchemaError{Database: 2, Binary: 5}, "worker migrate"},
		{&store.NodeAliveError{NodeID: "a"}, "--node-id"},
		{&kinds.NotAllowedError{Argv0: "sh"}, "--allow-exec PATH"},
		{&kinds.EnvNotAllowedError{Name: "X"}, "--allow-exec-env NAME"},
		{&kinds.DangerousEnvError{Name: "LD_PRELOAD"}, "--allow-exec-env"},
		{fmt.Errorf("exec: %w", kinds.ErrExecUserNeedsRoot), "--exec-user"},
	} {
		if got := flagAdvice(c.err); !strings.Contains(got, c.want) {
			t.Errorf("advice for %T (%v): %q, want it to name %s", c.err, c.err, got, c.want)
		}
		if advised := withFlagAdvice(c.err); exitStatus(advised) != exitStatus(c.err) || !errors.Is(advised, c.err) {
			t.Errorf("the advice changed the exit status or the chain of %v", c.err)
		}
	}
	if got := flagAdvice(&store.SchemaError{Database: 9, Binary: 5}); got != "" {
		t.Errorf("advice for a schema newer than the binary: %q, want none (migrating cannot help)", got)
	}
	if got := flagAdvice(errors.New("anything else")); got != "" {
		t.Errorf("advice for an error of no option: %q", got)
	}
}

// An exec refused by the node's allow list is recorded, on a node of this
// binary, with the flag that would allow it.
func TestWorkerRunRecordsAnExecRefusalWithItsFlag(t *testing.T) {
	h := adviseFlags(func(context.Context, *task.Task) error {
		return &kinds.NotAllowedError{Argv0: "/bin/cat", Allowed: []string{"/bin/echo"}}
	})
	err := h(context.Background(), &task.Task{Kind: "exec"})
	if !errors.Is(err, task.ErrNoRetry) || !strings.Contains(err.Error(), "kinds.ExecConfig.Allowed") ||
		!strings.Contains(err.Error(), "--allow-exec PATH") {
		t.Errorf("the attempt's error: %v; want it not retried, naming the Go option and the flag", err)
	}
	if err := adviseFlags(func(context.Context, *task.Task) error { return nil })(context.Background(), &task.Task{}); err != nil {
		t.Errorf("a success through adviseFlags: %v", err)
	}
}
