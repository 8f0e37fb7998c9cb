package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/schedule"
	"github.com/flotilla-dev/flotilla/store"
)

func scheduleCommand() *cli.Command {
	return &cli.Command{
		Name:  "schedule",
		Usage: "add, list, remove, pause and resume periodic tasks",
		Subcommands: []*cli.Command{
			scheduleAddCommand(),
			showCommand("list", "list the schedules, with the node that fires each", (*flotilla.Client).Schedules,
				func(r flotilla.ScheduleReport) any { return newScheduleJSON(r) }, printSchedules),
			scheduleActionCommand("rm", "remove a schedule; the tasks it fired stay",
				func(c *cli.Context, client *flotilla.Client, name string) error {
					if err := client.RemoveSchedule(c.Context, name); err != nil {
						return err
					}
					if c.Bool(jsonFlag.Name) {
						return printJSON(c.App.Writer, map[string]any{"name": name, "removed": true})
					}
					fmt.Fprintf(c.App.Writer, "schedule %s removed\n", cell(name))
					return nil
				}),
			scheduleActionCommand("pause", "stop a schedule from firing",
				func(c *cli.Context, client *flotilla.Client, name string) error {
					return printSchedule(c, client, client.PauseSchedule, name)
				}),
			scheduleActionCommand("resume", "let a paused schedule fire again, from its next tick",
				func(c *cli.Context, client *flotilla.Client, name string) error {
					return printSchedule(c, client, client.ResumeSchedule, name)
				}),
		},
	}
}

func scheduleAddCommand() *cli.Command {
	return &cli.Command{
		Name:      "add",
		Usage:     "add a schedule: (--cron EXPR | --every D) --kind K NAME",
		ArgsUsage: "NAME",
		Description: "The definition is checked before anything connects; a refused one writes nothing.\n\n" +
			stockKindsHelp(),
		Flags: commonFlags(
			&cli.StringFlag{Name: "cron", Usage: `cron expression: 5 fields, or 6 with seconds first ("*/5 * * * *", "@hourly")`},
			&cli.DurationFlag{Name: "every", Usage: "fixed period, at least 1s; ticks fall on whole multiples since the Unix epoch"},
			&cli.StringFlag{Name: "kind", Usage: "the kind of the task each tick fires (required)"},
			&cli.StringFlag{Name: "key", Usage: "routes the schedule and its tasks to a bucket", DefaultText: "the name"},
			&cli.StringFlag{Name: "payload", Usage: "JSON given to each task's handler; @FILE reads it from a file, - from standard input"},
			&cli.StringFlag{Name: "timezone", Usage: `IANA time zone of the cron fields, e.g. "Europe/Paris"`, DefaultText: "UTC"},
			&cli.StringFlag{Name: "catch-up", Value: schedule.Skip,
				Usage: "ticks missed while no node held the bucket: skip them, or fire the latest once"},
			&cli.IntFlag{Name: "priority", Usage: "the tasks' priority; higher runs first"},
			&cli.IntFlag{Name: "max-attempts", Usage: fmt.Sprintf("attempts of each task, 1-%d", store.MaxMaxAttempts),
				DefaultText: strconv.Itoa(store.DefaultMaxAttempts)},
			&cli.DurationFlag{Name: "timeout", Usage: "per-attempt timeout of each task, in whole milliseconds", DefaultText: "none"},
			&cli.BoolFlag{Name: "paused", Usage: "create the schedule paused; with --replace, pause it"},
			&cli.BoolFlag{Name: "resume", Usage: "with --replace, resume the schedule if paused, from its next tick"},
			&cli.BoolFlag{Name: "replace", Usage: "replace a schedule of the same name; it stays paused or running " +
				"as it is, unless --paused or --resume is given"},
			jsonFlag,
		),
		Action: func(c *cli.Context) error {
			args, err := positional(c)
			if err != nil {
				return err
			}
			if len(args) != 1 {
				return invalid(fmt.Errorf("schedule add takes one NAME, got %d arguments", len(args)))
			}
			if err := checkName("NAME", args[0], true); err != nil {
				return err
			}
			for _, name := range []string{"kind", "key", "timezone"} {
				if err := checkNameFlag(c, name, false); err != nil {
					return err
				}
			}
			if err := checkCronLists(c.String("cron")); err != nil {
				return err
			}
			if err := checkMaxAttempts(c); err != nil {
				return err
			}
			if err := store.CheckTimeout(c.Duration("timeout")); err != nil {
				return invalid(fmt.Errorf("--%w", err))
			}
			payload, err := readPayload(c)
			if err != nil {
				return err
			}
			if err := checkKindPayload(c.String("kind"), payload); err != nil {
				return err
			}
			if c.Bool("paused") && c.Bool("resume") {
				return invalid(fmt.Errorf("schedule add: --paused and --resume contradict each other: give one"))
			}
			mode := store.UpsertCreate
			switch {
			case c.Bool("replace") && (c.Bool("paused") || c.Bool("resume")):
				mode = store.UpsertReplaceEnabled
			case c.Bool("replace"):
				mode = store.UpsertReplace
			}
			d := schedule.Definition{
				Name: args[0], Cron: c.String("cron"), Every: c.Duration("every"), Timezone: c.String("timezone"),
				CatchUp: c.String("catch-up"), Kind: c.String("kind"), Key: c.String("key"),
				Priority: c.Int("priority"), MaxAttempts: c.Int("max-attempts"), Timeout: c.Duration("timeout"),
				Paused: c.Bool("paused"), Payload: payload,
			}
			if c.Int("priority") < store.MinPriority || c.Int("priority") > store.MaxPriority {
				return invalid(fmt.Errorf("--priority %d is out of range: give %d to %d", c.Int("priority"), store.MinPriority, store.MaxPriority))
			}
			// Refuse a bad definition before connecting: bucket routing is
			// the only part that needs the fleet.
			one, _ := bucket.NewPolicy(1)
			if _, err := d.Resolve(one, time.Now()); err != nil {
				return invalid(err)
			}
			client, err := connect(c)
			if err != nil {
				return err
			}
			defer client.Close()
			r, err := client.AddSchedule(c.Context, d, mode)
			if errors.Is(err, store.ErrDuplicate) {
				return refused(fmt.Errorf("%w; give --replace to replace it", err))
			}
			if err != nil {
				return err
			}
			// Not a refusal: the nodes that fire a schedule may start
			// after it is added. But the operator hears of it now.
			if r.Waiting != "" {
				fmt.Fprintf(c.App.ErrWriter, "worker: warning: schedule %s: %s; its ticks will wait until one does\n",
					r.Name, r.Waiting)
			}
			if c.Bool(jsonFlag.Name) {
				return printJSON(c.App.Writer, newScheduleJSON(r))
			}
			state := ""
			if !r.Enabled {
				state = ", paused"
			}
			fmt.Fprintf(c.App.Writer, "schedule %s added: %s, bucket %d, first at %s%s\n", cell(r.Name), cell(describeTiming(r.Schedule)),
				r.Bucket, human(r.NextFireAt), state)
			return nil
		},
	}
}

// scheduleActionCommand is a command on one schedule, named by its only
// argument.
func scheduleActionCommand(name, usage string, act func(*cli.Context, *flotilla.Client, string) error) *cli.Command {
	return &cli.Command{
		Name:      name,
		Usage:     usage,
		ArgsUsage: "NAME",
		Flags:     commonFlags(jsonFlag),
		Action: func(c *cli.Context) error {
			args, err := positional(c)
			if err != nil {
				return err
			}
			if len(args) != 1 {
				return invalid(fmt.Errorf("schedule %s takes one NAME, got %d arguments", name, len(args)))
			}
			if err := checkName("NAME", args[0], true); err != nil {
				return err
			}
			client, err := connect(c)
			if err != nil {
				return err
			}
			defer client.Close()
			return act(c, client, args[0])
		},
	}
}

// printSchedule applies change to the named schedule and prints the
// result, with the node that fires it as schedule list shows it.
func printSchedule(c *cli.Context, client *flotilla.Client, change func(context.Context, string) (store.Schedule, error),
	name string) error {
	sc, err := change(c.Context, name)
	if err != nil {
		return err
	}
	if c.Bool(jsonFlag.Name) {
		report := flotilla.ScheduleReport{Schedule: sc}
		all, err := client.Schedules(c.Context)
		if err != nil {
			return err
		}
		for _, r := range all {
			if r.Name == sc.Name {
				report = r
			}
		}
		return printJSON(c.App.Writer, newScheduleJSON(report))
	}
	state := "active, next at " + human(sc.NextFireAt)
	if !sc.Enabled {
		state = "paused"
	}
	fmt.Fprintf(c.App.Writer, "schedule %s %s\n", cell(sc.Name), state)
	return nil
}

func describeTiming(sc store.Schedule) string {
	s := sc.Spec
	if sc.Timezone != "" {
		s += " in " + sc.Timezone
	}
	return s
}

type scheduleJSON struct {
	Name        string          `json:"name"`
	Spec        string          `json:"spec"`
	Timezone    string          `json:"timezone"`
	CatchUp     string          `json:"catch_up"`
	Kind        string          `json:"kind"`
	Key         string          `json:"key"`
	Bucket      int             `json:"bucket"`
	Payload     json.RawMessage `json:"payload"`
	Priority    int             `json:"priority"`
	MaxAttempts int             `json:"max_attempts"`
	Timeout     string          `json:"timeout"`
	Enabled     bool            `json:"enabled"`
	NextFireAt  any             `json:"next_fire_at"`
	LastFireAt  any             `json:"last_fire_at"`
	Holder      string          `json:"holder"`
	Waiting     string          `json:"waiting,omitempty"`
}

func newScheduleJSON(r flotilla.ScheduleReport) scheduleJSON {
	// A schedule keeps 0 for "the default": its tasks get the default's
	// attempts, which is what a script wants to read.
	maxAttempts := r.MaxAttempts
	if maxAttempts == 0 {
		maxAttempts = store.DefaultMaxAttempts
	}
	return scheduleJSON{Name: r.Name, Spec: r.Spec, Timezone: r.Timezone, CatchUp: r.CatchUp, Kind: r.Kind,
		Key: r.Key, Bucket: r.Bucket, Payload: rawOrNull(r.Payload), Priority: r.Priority,
		MaxAttempts: maxAttempts, Timeout: jsonDuration(r.Timeout), Enabled: r.Enabled, NextFireAt: jsonTime(r.NextFireAt),
		LastFireAt: jsonTime(r.LastFireAt), Holder: r.Holder, Waiting: r.Waiting}
}

func printSchedules(w io.Writer, rs []flotilla.ScheduleReport) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSPEC\tKIND\tBUCKET\tSTATE\tNEXT\tLAST\tHOLDER\tCATCH-UP\tWAITING")
	for _, r := range rs {
		state := "active"
		if !r.Enabled {
			state = "paused"
		}
		holder := r.Holder
		if holder == "" {
			holder = "(none)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", cell(r.Name), cell(describeTiming(r.Schedule)),
			cell(r.Kind), r.Bucket, state, human(r.NextFireAt), human(r.LastFireAt), cell(holder), r.CatchUp, dash(cell(r.Waiting)))
	}
	_ = tw.Flush()
}
