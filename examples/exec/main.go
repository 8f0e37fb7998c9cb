// Exec runs the stock exec kind, which starts a child process, with an
// allow list: a command whose executable is on the list runs, and its
// output is the task's result; any other is refused without running, and
// the task fails at once (the refusal is not retried).
//
// The allow list is the node's (kinds.ExecConfig.Allowed, or the worker's
// --allow-exec flag); a payload cannot widen it. See docs/exec.md.
//
// It needs nothing installed: the fleet is an SQLite file in a temporary
// directory, removed at exit.
//
//	go run ./examples/exec
package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/examples/internal/tempfleet"
	"github.com/flotilla-dev/flotilla/kinds"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/task"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "exec:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	fleet, err := tempfleet.Open(ctx)
	if err != nil {
		return err
	}
	defer fleet.Close()

	n, err := node.New(fleet.Store, node.Config{NodeID: "node-1", AllBuckets: true})
	if err != nil {
		return err
	}
	cfg := kinds.ExecConfig{Allowed: []string{"/bin/echo"}}
	if err := cfg.Validate(); err != nil {
		return err
	}
	kinds.RegisterExec(n, cfg)
	if err := n.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = n.Shutdown(context.WithoutCancel(ctx)) }()
	fmt.Printf("node %s allows exec of: %s\n", n.ID(), strings.Join(cfg.Allowed, " "))

	allowed, err := submit(ctx, fleet.Client, "/bin/echo", "hello from a child process")
	if err != nil {
		return err
	}
	done, err := fleet.Client.Wait(ctx, allowed.ID)
	if err != nil {
		return err
	}
	res, err := flotilla.ResultOf[kinds.ExecResult](done)
	if err != nil {
		return err
	}
	fmt.Printf("task %d (/bin/echo) %s: exit code %d, stdout %q\n", done.ID, done.Status, res.ExitCode, res.Stdout)

	refused, err := submit(ctx, fleet.Client, "/bin/cat", "/etc/hostname")
	if err != nil {
		return err
	}
	failed, err := tempfleet.Wait(ctx, fleet.Client, refused.ID, task.Failed)
	if err != nil {
		return err
	}
	fmt.Printf("task %d (/bin/cat) %s after %d attempt(s): %s\n", failed.ID, failed.Status, failed.Attempt, failed.Error)
	return n.Shutdown(ctx)
}

// submit submits an exec task: kinds.ExecPayload is the stock kind's
// arguments, a flotilla.Args like any task type of the application's.
func submit(ctx context.Context, c *flotilla.Client, argv ...string) (*task.Task, error) {
	return flotilla.SubmitArgs(ctx, c, kinds.ExecPayload{Argv: argv}, flotilla.WithKey(argv[0]))
}
