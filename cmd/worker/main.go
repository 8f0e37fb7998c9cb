// Command worker is flotilla's command line: it runs a node, and submits,
// inspects and controls tasks. It only parses flags, calls the library and
// prints; the behaviour lives in the packages it imports.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v2"
)

// version and commit are set by `make build`, with -ldflags
// "-X main.version=... -X main.commit=...".
var (
	version = "dev"
	commit  = ""
)

// versionString is what --version prints after the name.
func versionString() string {
	if commit == "" {
		return version
	}
	return version + " (commit " + commit + ")"
}

func main() {
	os.Exit(runWithInput(os.Args, os.Stdin, os.Stdout, os.Stderr))
}

// run is main without the process: tests call it with their own arguments
// and writers.
func run(args []string, stdout, stderr io.Writer) int {
	return runWithInput(args, strings.NewReader(""), stdout, stderr)
}

// runWithInput is run with a standard input, which --payload - reads.
func runWithInput(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	app := newApp(stdout, stderr)
	app.Reader = stdin
	app.Metadata = map[string]any{literalArgsKey: countLiteralArgs(args)}
	var unknown error
	app.CommandNotFound = func(_ *cli.Context, name string) {
		unknown = invalid(fmt.Errorf("unknown command %q: see `worker --help`", name))
	}
	err := app.Run(args)
	if err == nil {
		err = unknown
	}
	if err == nil || errors.Is(err, errVersionPrinted) {
		return exitOK
	}
	err = withFlagAdvice(err)
	code := exitStatus(err)
	if wantsJSON(args) {
		_ = printJSON(stderr, map[string]any{"error": err.Error(), "exit": code})
	} else {
		fmt.Fprintln(stderr, "worker:", err)
	}
	return code
}

// wantsJSON reports whether the command line asks for JSON output, so that
// an error is printed as JSON too: {"error": ..., "exit": N}. It looks at
// the arguments rather than at the parsed flag, since an error may come
// before or from the parsing itself.
func wantsJSON(args []string) bool {
	for _, a := range args[1:] {
		switch a {
		case "--":
			return false
		case "--json", "-json", "--json=true", "-json=true":
			return true
		}
	}
	return false
}

func newApp(stdout, stderr io.Writer) *cli.App {
	usageError := func(_ *cli.Context, err error, _ bool) error { return invalid(err) }
	app := &cli.App{
		Name:    "worker",
		Usage:   "a fleet of workers for background tasks, on an SQLite file (the default) or PostgreSQL",
		Version: versionString(),
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
			pruneCommand(),
			bucketOfCommand(),
			scheduleCommand(),
			pipelineCommand(),
			limitCommand(),
			benchCommand(),
			completionCommand(),
			uiCommand(),
			versionCommand(),
		},
		EnableBashCompletion: true,
	}
	document(app.Commands, "")
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
	acceptVersionFlag(app.Commands)
	return app
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:      "version",
		Usage:     "print the version and the commit it was built from, as --version does",
		ArgsUsage: " ",
		Action: func(c *cli.Context) error {
			if err := noArgs(c, ""); err != nil {
				return err
			}
			cli.VersionPrinter(c)
			return nil
		},
	}
}

// errVersionPrinted ends a command whose --version was given, once the
// version is printed: the command does nothing else, and exits 0.
var errVersionPrinted = errors.New("version printed")

// acceptVersionFlag lets every command take --version, as the program
// does: `worker run --version` prints the version rather than refusing an
// unknown flag.
func acceptVersionFlag(cmds []*cli.Command) {
	for _, c := range cmds {
		c.Flags = append(c.Flags, &cli.BoolFlag{Name: "version", Hidden: true})
		before := c.Before
		c.Before = func(ctx *cli.Context) error {
			if ctx.Bool("version") {
				cli.VersionPrinter(ctx)
				return errVersionPrinted
			}
			if before != nil {
				return before(ctx)
			}
			return nil
		}
		acceptVersionFlag(c.Subcommands)
	}
}
