// Command worker is flotilla's command line: it runs a node, and submits,
// inspects and controls tasks. It only parses flags, calls the library and
// prints; the behaviour lives in the packages it imports.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/urfave/cli/v2"
)

// Exit statuses (DESIGN §9).
const (
	exitOK       = 0
	exitRuntime  = 1 // database unreachable, ...
	exitInvalid  = 2 // bad flag value, JSON, bucket spec
	exitRefused  = 3 // refused by the fleet's state
	exitNotFound = 4
	exitTooLate  = 5
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(run(os.Args, os.Stdout, os.Stderr))
}

// run is main without the process: tests call it with their own arguments
// and writers.
func run(args []string, stdout, stderr io.Writer) int {
	app := newApp(stdout, stderr)
	var unknown error
	app.CommandNotFound = func(_ *cli.Context, name string) {
		unknown = invalid(fmt.Errorf("unknown command %q: see `worker --help`", name))
	}
	err := app.Run(args)
	if err == nil {
		err = unknown
	}
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(stderr, "worker:", err)
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return exitRuntime
}

func newApp(stdout, stderr io.Writer) *cli.App {
	usageError := func(_ *cli.Context, err error, _ bool) error { return invalid(err) }
	app := &cli.App{
		Name:    "worker",
		Usage:   "a fleet of workers for background tasks on PostgreSQL",
		Version: version,
		Writer:  stdout, ErrWriter: stderr,
		// Errors are printed once, by run, with their exit status.
		ExitErrHandler: func(*cli.Context, error) {},
		OnUsageError:   usageError,
		Commands: []*cli.Command{
			migrateCommand(),
			runCommand(),
			submitCommand(),
			getCommand(),
			listCommand(),
			stopCommand(),
			pauseCommand(),
			resumeCommand(),
			bucketsCommand(),
			nodesCommand(),
			reconcileCommand(),
			bucketOfCommand(),
			scheduleCommand(),
			pipelineCommand(),
			benchCommand(),
		},
	}
	// A bad flag value is invalid input (exit 2) with a one-line message,
	// not a page of help on stdout.
	var setUsageError func([]*cli.Command)
	setUsageError = func(cmds []*cli.Command) {
		for _, c := range cmds {
			c.OnUsageError = usageError
			setUsageError(c.Subcommands)
		}
	}
	setUsageError(app.Commands)
	return app
}

// exitError carries the exit status an error should end the process with.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func invalid(err error) error { return &exitError{code: exitInvalid, err: err} }
func refused(err error) error { return &exitError{code: exitRefused, err: err} }
func notFound(err error) error {
	return &exitError{code: exitNotFound, err: err}
}
