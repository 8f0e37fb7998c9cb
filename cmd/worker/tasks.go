package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// connect opens a fleet client from the command's --dsn.
func connect(c *cli.Context) (*flotilla.Client, error) {
	dsn, _, err := requireDSN(c)
	if err != nil {
		return nil, err
	}
	client, err := flotilla.Connect(c.Context, dsn)
	if errors.Is(err, store.ErrSchema) {
		return nil, refused(err)
	}
	return client, err
}

// classify gives library errors their exit status.
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, store.ErrNotFound):
		return notFound(err)
	case errors.Is(err, store.ErrInvalid), errors.Is(err, bucket.ErrInvalidSet):
		return invalid(err)
	case errors.Is(err, flotilla.ErrRefused), errors.Is(err, store.ErrDuplicate), errors.Is(err, store.ErrSchema):
		return refused(err)
	}
	return err
}

func submitCommand() *cli.Command {
	return &cli.Command{
		Name:      "submit",
		Usage:     "submit a task; prints its id",
		ArgsUsage: " ",
		Flags: commonFlags(
			&cli.StringFlag{Name: "kind", Usage: "the task's kind (required)"},
			&cli.StringFlag{Name: "key", Usage: "routes the task to its bucket"},
			&cli.StringFlag{Name: "payload", Usage: "JSON given to the handler"},
			&cli.IntFlag{Name: "priority", Usage: "higher runs first"},
			&cli.DurationFlag{Name: "delay", Usage: "run no sooner than this from now"},
			&cli.StringFlag{Name: "run-at", Usage: "run no sooner than this RFC 3339 time"},
			&cli.IntFlag{Name: "max-attempts", Usage: fmt.Sprintf("attempts before it fails (default %d)", store.DefaultMaxAttempts)},
			&cli.DurationFlag{Name: "timeout", Usage: "per-attempt timeout"},
			&cli.StringFlag{Name: "unique-key", Usage: "refuse the task while another unfinished task has this key"},
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
				return classify(err)
			}
			if c.Bool(jsonFlag.Name) {
				return printJSON(c.App.Writer, newTaskJSON(t))
			}
			fmt.Fprintln(c.App.Writer, t.ID)
			return nil
		},
	}
}

// taskRequest validates submit's flags before anything connects.
func taskRequest(c *cli.Context) (flotilla.TaskRequest, error) {
	r := flotilla.TaskRequest{
		Kind: c.String("kind"), Key: c.String("key"), Priority: c.Int("priority"),
		Delay: c.Duration("delay"), MaxAttempts: c.Int("max-attempts"), Timeout: c.Duration("timeout"),
		UniqueKey: c.String("unique-key"),
	}
	if r.Kind == "" {
		return r, invalid(errors.New("--kind is required (e.g. --kind noop)"))
	}
	if p := c.String("payload"); p != "" {
		if !json.Valid([]byte(p)) {
			var v any
			err := json.Unmarshal([]byte(p), &v)
			return r, invalid(fmt.Errorf("--payload is not valid JSON (%v): %q", err, p))
		}
		r.Payload = json.RawMessage(p)
	}
	if at := c.String("run-at"); at != "" {
		if c.IsSet("delay") {
			return r, invalid(errors.New("give --delay or --run-at, not both"))
		}
		t, err := time.Parse(time.RFC3339Nano, at)
		if err != nil {
			return r, invalid(fmt.Errorf("--run-at %q is not an RFC 3339 time like 2026-12-01T09:00:00Z", at))
		}
		r.RunAt = t
	}
	if r.Delay < 0 {
		return r, invalid(fmt.Errorf("--delay %v is negative", r.Delay))
	}
	if r.MaxAttempts < 0 {
		return r, invalid(fmt.Errorf("--max-attempts %d is negative", r.MaxAttempts))
	}
	if r.Timeout < 0 {
		return r, invalid(fmt.Errorf("--timeout %v is negative", r.Timeout))
	}
	return r, nil
}

func getCommand() *cli.Command {
	return &cli.Command{
		Name:      "get",
		Usage:     "show a task and its audit trail",
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
			id, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil || id <= 0 {
				return invalid(fmt.Errorf("task ID %q is not a positive integer", args[0]))
			}
			client, err := connect(c)
			if err != nil {
				return err
			}
			defer client.Close()
			r, err := client.Get(c.Context, id)
			if errors.Is(err, store.ErrNotFound) {
				return notFound(fmt.Errorf("no task %d", id))
			}
			if err != nil {
				return err
			}
			if c.Bool(jsonFlag.Name) {
				return printJSON(c.App.Writer, reportJSON(r))
			}
			printReport(c.App.Writer, r)
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
			&cli.IntFlag{Name: "limit", Value: 100, Usage: "at most this many (1-10000)"},
			&cli.Int64Flag{Name: "before", Usage: "only ids below this (paging)"},
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
			for _, s := range c.StringSlice("status") {
				st, err := task.ParseStatus(s)
				if err != nil {
					return invalid(err)
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
			client, err := connect(c)
			if err != nil {
				return err
			}
			defer client.Close()
			if f.Buckets != nil {
				if err := f.Buckets.CheckRange(client.Policy().Count()); err != nil {
					return invalid(fmt.Errorf("invalid --bucket: %w", err))
				}
			}
			ts, err := client.List(c.Context, f)
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

func bucketsCommand() *cli.Command {
	return showCommand("buckets", "show every bucket: holder, epoch, expiry, standby nodes, backlog",
		(*flotilla.Client).Buckets,
		func(b flotilla.BucketReport) any {
			return bucketJSON{Bucket: b.Bucket, Holder: b.Holder, Epoch: b.Epoch, ExpiresAt: jsonTime(b.ExpiresAt),
				Standby: b.Standby, Queued: b.Queued, Waiting: b.Waiting, Running: b.Running}
		},
		printBuckets)
}

func nodesCommand() *cli.Command {
	return showCommand("nodes", "list the registered nodes", (*flotilla.Client).Nodes,
		func(n store.NodeInfo) any { return newNodeJSON(n) }, printNodes)
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
			client, err := connect(c)
			if err != nil {
				return err
			}
			defer client.Close()
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
