package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/sqlite"
	"github.com/flotilla-dev/flotilla/task"
)

// connect opens a fleet client from the command's --dsn.
func connect(c *cli.Context) (*flotilla.Client, error) {
	dsn, _, err := requireDSN(c)
	if err != nil {
		return nil, err
	}
	return flotilla.Connect(c.Context, dsn)
}

// connectRead opens a fleet client for a command that only reads: the
// SQLite file is opened read-only, so that a read writes nothing, works on
// a file this user may only read, and never creates one. done closes it.
func connectRead(c *cli.Context) (client *flotilla.Client, done func(), err error) {
	_, target, err := requireDSN(c)
	if err != nil {
		return nil, nil, err
	}
	s, err := target.OpenReadOnly(c.Context)
	if err != nil {
		return nil, nil, noFileHint(err)
	}
	if client, err = flotilla.NewClient(c.Context, s); err != nil {
		s.Close()
		return nil, nil, err
	}
	return client, s.Close, nil
}

// noFileHint adds to the refusal of a missing SQLite file the commands
// that create one.
func noFileHint(err error) error {
	var noFile *sqlite.NoFileError
	if !errors.As(err, &noFile) {
		return err
	}
	return refused(fmt.Errorf("SQLite file %s does not exist: `worker migrate` or `worker run` with the same --dsn creates it",
		noFile.Path))
}

func submitCommand() *cli.Command {
	return &cli.Command{
		Name:      "submit",
		Usage:     "submit a task; prints its id",
		ArgsUsage: " ",
		Description: "Every value is checked before anything connects; a refused task writes nothing.\n\n" +
			stockKindsHelp(),
		Flags: commonFlags(
			&cli.StringFlag{Name: "kind", Usage: "the task's kind (required)"},
			&cli.StringFlag{Name: "key", Usage: "routes the task to its bucket"},
			&cli.StringFlag{Name: "payload", Usage: "JSON given to the handler; @FILE reads it from a file, - from standard input"},
			&cli.IntFlag{Name: "priority", Usage: "higher runs first"},
			&cli.DurationFlag{Name: "delay", Usage: "run no sooner than this from now"},
			&cli.StringFlag{Name: "run-at", Usage: "run no sooner than this RFC 3339 time"},
			&cli.IntFlag{Name: "max-attempts", Usage: fmt.Sprintf("attempts before it fails, 1-%d", store.MaxMaxAttempts),
				DefaultText: strconv.Itoa(store.DefaultMaxAttempts)},
			&cli.DurationFlag{Name: "timeout", Usage: "per-attempt timeout, in whole milliseconds", DefaultText: "none"},
			&cli.StringFlag{Name: "unique-key", Usage: "refuse the task while another unfinished task has this key"},
			&cli.StringFlag{Name: "limit-key", Usage: "the key per-key limits count the task under; it also picks the bucket instead of --key", DefaultText: "the key"},
			&cli.StringFlag{Name: "resources", Usage: `what the task needs free on a node to start, e.g. "gpu=1,mem=8" (see worker run --capacity)`},
			&cli.BoolFlag{Name: "allow-unowned", Usage: "accept a task whose bucket no live node holds"},
			&cli.BoolFlag{Name: "allow-unknown-kind", Usage: "accept a task whose kind its bucket's holder does not run"},
			jsonFlag,
		),
		Action: func(c *cli.Context) error {
			if err := noArgs(c, "did you mean --key?"); err != nil {
				return err
			}
			req, err := taskRequest(c)
			if err != nil {
				return err
			}
			var opts []flotilla.SubmitOption
			if c.Bool("allow-unowned") {
				opts = append(opts, flotilla.AllowUnowned())
			}
			if c.Bool("allow-unknown-kind") {
				opts = append(opts, flotilla.AllowUnknownKind())
			}
			client, err := connect(c)
			if err != nil {
				return err
			}
			defer client.Close()
			t, err := client.Submit(c.Context, req, opts...)
			if err != nil {
				return err
			}
			if c.Bool(jsonFlag.Name) {
				return printJSON(c.App.Writer, newTaskJSON(t))
			}
			fmt.Fprintln(c.App.Writer, t.ID)
			return nil
		},
	}
}

// taskRequest validates submit's flags before anything connects: each
// flag as the user typed it, then the whole as every store would
// (store.CheckNewTasks), and the payload as a stock kind would use it.
func taskRequest(c *cli.Context) (flotilla.TaskRequest, error) {
	r := flotilla.TaskRequest{
		Kind: c.String("kind"), Key: c.String("key"), Priority: c.Int("priority"),
		Delay: c.Duration("delay"), MaxAttempts: c.Int("max-attempts"), Timeout: c.Duration("timeout"),
		UniqueKey: c.String("unique-key"), LimitKey: c.String("limit-key"),
	}
	if r.Kind == "" {
		return r, invalid(errors.New("--kind is required (e.g. --kind noop)"))
	}
	for _, name := range []string{"kind", "key", "unique-key", "limit-key"} {
		if err := checkNameFlag(c, name, false); err != nil {
			return r, err
		}
	}
	if c.IsSet("resources") {
		res, err := parseResourcesFlag(c, "resources")
		if err != nil {
			return r, err
		}
		r.Resources = res
	}
	payload, err := readPayload(c)
	if err != nil {
		return r, err
	}
	r.Payload = payload
	if err := checkKindPayload(r.Kind, r.Payload); err != nil {
		return r, err
	}
	if at := c.String("run-at"); c.IsSet("run-at") {
		if c.IsSet("delay") {
			return r, invalid(errors.New("give --delay or --run-at, not both"))
		}
		if r.RunAt, err = checkRunAt(at); err != nil {
			return r, err
		}
	}
	if err := checkMaxAttempts(c); err != nil {
		return r, err
	}
	if err := checkDurationFlag(c, "delay", false); err != nil {
		return r, err
	}
	if r.Priority < store.MinPriority || r.Priority > store.MaxPriority {
		return r, invalid(fmt.Errorf("--priority %d is out of range: give %d to %d", r.Priority, store.MinPriority, store.MaxPriority))
	}
	if err := store.CheckTimeout(r.Timeout); err != nil {
		return r, invalid(fmt.Errorf("--%w", err))
	}
	if err := store.CheckNewTasks([]store.NewTask{r.NewTask(0)}, 0); err != nil {
		return r, invalid(err)
	}
	return r, nil
}

func getCommand() *cli.Command {
	return &cli.Command{
		Name:      "get",
		Usage:     "show a task, why it waits, and its audit trail",
		ArgsUsage: "ID",
		Flags:     commonFlags(jsonFlag),
		Action: func(c *cli.Context) error {
			args, err := positional(c)
			if err != nil {
				return err
			}
			if len(args) != 1 {
				return invalid(fmt.Errorf("get takes one task ID, got %d arguments", len(args)))
			}
			id, err := parseTaskID(args[0])
			if err != nil {
				return err
			}
			client, done, err := connectRead(c)
			if err != nil {
				return err
			}
			defer done()
			r, err := client.Report(c.Context, id)
			if errors.Is(err, store.ErrNotFound) {
				return notFound(fmt.Errorf("no task %d", id))
			}
			if err != nil {
				return err
			}
			now, err := client.Store().Now(c.Context)
			if err != nil {
				return err
			}
			if c.Bool(jsonFlag.Name) {
				return printJSON(c.App.Writer, reportJSON(r, now))
			}
			printReport(c.App.Writer, r, now)
			return nil
		},
	}
}

func listCommand() *cli.Command {
	return &cli.Command{
		Name:      "list",
		Usage:     "list tasks, newest first",
		ArgsUsage: " ",
		Flags: commonFlags(
			&cli.StringSliceFlag{Name: "status", Usage: "only tasks in this state (repeatable)"},
			&cli.StringFlag{Name: "bucket", Usage: "only tasks in these buckets, e.g. 0-31"},
			&cli.StringFlag{Name: "kind", Usage: "only tasks of this kind"},
			&cli.StringFlag{Name: "key", Usage: "only tasks with this key"},
			&cli.StringFlag{Name: "schedule", Usage: "only tasks fired by this schedule"},
			&cli.StringFlag{Name: "node", Usage: "only tasks whose last attempt ran on this node"},
			&cli.IntFlag{Name: "limit", Value: 100, Usage: "at most this many (1-10000)"},
			&cli.Int64Flag{Name: "before", Usage: "only ids below this (paging)", DefaultText: "none"},
			jsonFlag,
		),
		Action: func(c *cli.Context) error {
			if err := noArgs(c, ""); err != nil {
				return err
			}
			f := store.TaskFilter{Kind: c.String("kind"), Key: c.String("key"), Schedule: c.String("schedule"),
				Limit: c.Int("limit"), BeforeID: c.Int64("before")}
			if f.Limit < 1 || f.Limit > 10000 {
				return invalid(fmt.Errorf("--limit %d is out of range: give 1 to 10000", f.Limit))
			}
			if c.IsSet("before") && f.BeforeID < 1 {
				return invalid(fmt.Errorf("--before %d is not a task ID: give a positive integer", f.BeforeID))
			}
			for _, name := range []string{"kind", "key", "schedule", "node"} {
				if err := checkNameFlag(c, name, false); err != nil {
					return err
				}
			}
			for _, s := range c.StringSlice("status") {
				st, err := task.ParseStatus(s)
				if err != nil {
					return invalid(fmt.Errorf("--status %s: %w", store.Shorten(s, 40), err))
				}
				f.Statuses = append(f.Statuses, st)
			}
			if spec := c.String("bucket"); c.IsSet("bucket") {
				set, err := bucket.ParseSet(spec, 0)
				if err != nil {
					return invalid(fmt.Errorf("invalid --bucket: %w", err))
				}
				f.Buckets = &set
			}
			client, done, err := connectRead(c)
			if err != nil {
				return err
			}
			defer done()
			if f.Buckets != nil {
				if err := f.Buckets.CheckRange(client.Policy().Count()); err != nil {
					return invalid(fmt.Errorf("invalid --bucket: %w", err))
				}
			}
			ts, err := listTasks(c, client, f, c.String("node"))
			if err != nil {
				return err
			}
			if c.Bool(jsonFlag.Name) {
				out := make([]taskJSON, len(ts))
				for i, t := range ts {
					out[i] = newTaskJSON(t)
				}
				return printJSON(c.App.Writer, out)
			}
			printTasks(c.App.Writer, ts)
			return nil
		},
	}
}

// listTasks lists the tasks the filter keeps; node, when set, keeps those
// whose latest attempt ran on that node, in the store's query.
func listTasks(c *cli.Context, client *flotilla.Client, f store.TaskFilter, node string) ([]*task.Task, error) {
	f.Node = node
	return client.List(c.Context, f)
}

func bucketsCommand() *cli.Command {
	return &cli.Command{
		Name:      "buckets",
		Usage:     "show every bucket: holder, target, hand-off, epoch, expiry, standby nodes, backlog; move or unpin buckets",
		ArgsUsage: " ",
		Flags: commonFlags(
			&cli.StringFlag{Name: "held-by", Usage: "only the buckets this node holds"},
			&cli.BoolFlag{Name: "unheld", Usage: "only the buckets no live node holds"},
			jsonFlag,
		),
		Subcommands: []*cli.Command{bucketsMoveCommand(), bucketsUnpinCommand()},
		Action: func(c *cli.Context) error {
			if err := noArgs(c, ""); err != nil {
				return err
			}
			if err := checkNameFlag(c, "held-by", false); err != nil {
				return err
			}
			if c.IsSet("held-by") && c.Bool("unheld") {
				return invalid(errors.New("give --held-by or --unheld, not both"))
			}
			client, done, err := connectRead(c)
			if err != nil {
				return err
			}
			defer done()
			all, err := client.Buckets(c.Context)
			if err != nil {
				return err
			}
			bs := make([]flotilla.BucketReport, 0, len(all))
			for _, b := range all {
				switch {
				case c.IsSet("held-by") && b.Holder != c.String("held-by"):
				case c.Bool("unheld") && b.Holder != "":
				default:
					bs = append(bs, b)
				}
			}
			if c.Bool(jsonFlag.Name) {
				out := make([]bucketJSON, len(bs))
				for i, b := range bs {
					out[i] = newBucketJSON(b)
				}
				return printJSON(c.App.Writer, out)
			}
			printBuckets(c.App.Writer, bs)
			printBucketSummary(c.App.Writer, all)
			return nil
		},
	}
}

// bucketsArg reads the BUCKETS argument of buckets move and unpin, and,
// once check (the command's other input) passes, connects and checks it
// against the fleet's count. The caller closes the client.
func bucketsArg(c *cli.Context, command string, check func() error) (*flotilla.Client, bucket.Set, error) {
	args, err := positional(c)
	if err != nil {
		return nil, bucket.Set{}, err
	}
	if len(args) != 1 {
		return nil, bucket.Set{}, invalid(fmt.Errorf("buckets %s takes one BUCKETS argument (e.g. 0-7,12), got %d arguments",
			command, len(args)))
	}
	set, err := bucket.ParseSet(args[0], 0)
	if err != nil {
		return nil, bucket.Set{}, invalid(fmt.Errorf("invalid BUCKETS: %w", err))
	}
	if err := check(); err != nil {
		return nil, bucket.Set{}, err
	}
	client, err := connect(c)
	if err != nil {
		return nil, bucket.Set{}, err
	}
	if err := set.CheckRange(client.Policy().Count()); err != nil {
		client.Close()
		return nil, bucket.Set{}, invalid(fmt.Errorf("invalid BUCKETS for this fleet: %w", err))
	}
	return client, set, nil
}

func bucketsMoveCommand() *cli.Command {
	return &cli.Command{
		Name:      "move",
		Usage:     "move buckets to a node now, through the live hand-off, and pin them there until buckets unpin",
		ArgsUsage: "BUCKETS",
		Description: "The holder of each bucket stops claiming there, lets its running tasks finish (up to its\n" +
			"--handoff-timeout), and hands the bucket to NODE under the next epoch. NODE must be live and declare\n" +
			"every bucket named (exit 3 otherwise). The buckets stay there, whatever balance would do, until\n" +
			"worker buckets unpin.",
		Flags: commonFlags(
			&cli.StringFlag{Name: "to", Usage: "the node to move them to (required)"},
			jsonFlag,
		),
		Action: func(c *cli.Context) error {
			client, set, err := bucketsArg(c, "move", func() error { return checkNameFlag(c, "to", true) })
			if err != nil {
				return err
			}
			defer client.Close()
			to := c.String("to")
			if err := client.MoveBuckets(c.Context, set, to); err != nil {
				return err
			}
			if c.Bool(jsonFlag.Name) {
				return printJSON(c.App.Writer, pinJSON{Buckets: set.String(), Pin: to})
			}
			fmt.Fprintf(c.App.Writer, "buckets %s pinned to %s: their holders hand them over (worker buckets shows the moves)\n",
				cell(set.String()), cell(to))
			return nil
		},
	}
}

func bucketsUnpinCommand() *cli.Command {
	return &cli.Command{
		Name:      "unpin",
		Usage:     "remove the pins of buckets: balance places them again, and leaves them where they are unless it must move them",
		ArgsUsage: "BUCKETS",
		Flags:     commonFlags(jsonFlag),
		Action: func(c *cli.Context) error {
			client, set, err := bucketsArg(c, "unpin", func() error { return nil })
			if err != nil {
				return err
			}
			defer client.Close()
			if err := client.UnpinBuckets(c.Context, set); err != nil {
				return err
			}
			if c.Bool(jsonFlag.Name) {
				return printJSON(c.App.Writer, pinJSON{Buckets: set.String()})
			}
			fmt.Fprintf(c.App.Writer, "buckets %s unpinned\n", cell(set.String()))
			return nil
		},
	}
}

// staleNode is how long a stopped node stays in `worker nodes` without
// --all.
const staleNode = 24 * time.Hour

func nodesCommand() *cli.Command {
	return &cli.Command{
		Name:      "nodes",
		Usage:     "list the registered nodes, with the buckets each declares and holds",
		ArgsUsage: " ",
		Flags: commonFlags(
			&cli.BoolFlag{Name: "all", Usage: "also show nodes stopped more than a day ago"},
			jsonFlag,
		),
		Action: func(c *cli.Context) error {
			if err := noArgs(c, ""); err != nil {
				return err
			}
			client, done, err := connectRead(c)
			if err != nil {
				return err
			}
			defer done()
			ns, err := client.NodeReports(c.Context)
			if err != nil {
				return err
			}
			now, err := client.Store().Now(c.Context)
			if err != nil {
				return err
			}
			shown, hidden := make([]flotilla.NodeReport, 0, len(ns)), 0
			for _, n := range ns {
				if !c.Bool("all") && !n.StoppedAt.IsZero() && now.Sub(n.StoppedAt) > staleNode {
					hidden++
					continue
				}
				shown = append(shown, n)
			}
			if c.Bool(jsonFlag.Name) {
				out := make([]nodeJSON, len(shown))
				for i, n := range shown {
					out[i] = newNodeJSON(n)
				}
				return printJSON(c.App.Writer, out)
			}
			printNodes(c.App.Writer, shown)
			if hidden > 0 {
				fmt.Fprintf(c.App.Writer, "(%d nodes stopped more than a day ago not shown: --all shows them)\n", hidden)
			}
			return nil
		},
	}
}

// showCommand is a read-only command without arguments: it reads a list
// from the fleet and prints it as a JSON array (--json) or a table.
func showCommand[T any](name, usage string, read func(*flotilla.Client, context.Context) ([]T, error),
	asJSON func(T) any, table func(io.Writer, []T)) *cli.Command {
	return &cli.Command{
		Name:      name,
		Usage:     usage,
		ArgsUsage: " ",
		Flags:     commonFlags(jsonFlag),
		Action: func(c *cli.Context) error {
			if err := noArgs(c, ""); err != nil {
				return err
			}
			client, done, err := connectRead(c)
			if err != nil {
				return err
			}
			defer done()
			items, err := read(client, c.Context)
			if err != nil {
				return err
			}
			if c.Bool(jsonFlag.Name) {
				out := make([]any, len(items))
				for i, item := range items {
					out[i] = asJSON(item)
				}
				return printJSON(c.App.Writer, out)
			}
			table(c.App.Writer, items)
			return nil
		},
	}
}
