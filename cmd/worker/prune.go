package main

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/retention"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// retentionFlags are shared by run (the node's retention loop) and prune.
func retentionFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "retain", Usage: `how long finished tasks are kept, per final state, e.g. "succeeded=24h,failed=168h"; ` +
			`"all" names every final state, 0 keeps forever; states not named keep theirs`,
			DefaultText: "succeeded, cancelled, skipped 24h; failed, timed_out, lost, stopped 168h"},
		&cli.StringSliceFlag{Name: "retain-kind", Usage: `ages of one kind, replacing --retain's for the states named, e.g. ` +
			`"email:succeeded=1h,failed=24h" (repeatable)`},
	}
}

// parseRetention reads --retain and --retain-kind.
func parseRetention(c *cli.Context) (store.Retention, error) {
	var r store.Retention
	if c.IsSet("retain") {
		ages, err := store.ParseAges(c.String("retain"))
		if err != nil {
			return r, invalid(fmt.Errorf("invalid --retain: %w", err))
		}
		r.Ages = ages
	}
	// The flag library splits values at commas: "email:succeeded=1h,
	// failed=24h" arrives as two, and an entry without "KIND:" belongs to
	// the kind before it.
	kind := ""
	for _, v := range c.StringSlice("retain-kind") {
		name, _, hasKind := strings.Cut(v, ":")
		if hasKind && !strings.Contains(name, "=") {
			var ages store.Ages
			var err error
			kind, ages, err = store.ParseKindAges(v)
			if err != nil {
				return r, invalid(fmt.Errorf("invalid --retain-kind: %w", err))
			}
			r = addKindAges(r, kind, ages)
			continue
		}
		if kind == "" {
			return r, invalid(fmt.Errorf("invalid --retain-kind %q: want KIND:STATE=AGE[,STATE=AGE...], as in email:succeeded=1h", v))
		}
		ages, err := store.ParseAges(v)
		if err != nil {
			return r, invalid(fmt.Errorf("invalid --retain-kind for kind %s: %w", kind, err))
		}
		r = addKindAges(r, kind, ages)
	}
	return r.WithDefaults(), nil
}

func addKindAges(r store.Retention, kind string, ages store.Ages) store.Retention {
	if r.Kinds == nil {
		r.Kinds = map[string]store.Ages{}
	}
	if r.Kinds[kind] == nil {
		r.Kinds[kind] = store.Ages{}
	}
	for st, age := range ages {
		r.Kinds[kind][st] = age
	}
	return r
}

func pruneCommand() *cli.Command {
	return &cli.Command{
		Name: "prune",
		Usage: "remove finished tasks past their retention, with their events and acknowledged commands, " +
			"from buckets that no live node holds (a node prunes the buckets it holds itself)",
		ArgsUsage: " ",
		Flags: commonFlags(append(retentionFlags(),
			&cli.StringFlag{Name: "buckets", Usage: `only these buckets, e.g. "0-31" (default: every bucket)`},
			&cli.IntFlag{Name: "batch", Value: node.DefaultPruneBatch, Usage: fmt.Sprintf("tasks removed per statement (1 to %d)", store.MaxPruneBatch)},
			&cli.BoolFlag{Name: "dry-run", Usage: "take no lease and remove nothing; count what a run would remove, per bucket and state, with the oldest"},
			jsonFlag,
		)...),
		Action: func(c *cli.Context) error {
			if err := noArgs(c, ""); err != nil {
				return err
			}
			var set bucket.Set
			if c.IsSet("buckets") {
				var err error
				if set, err = bucket.ParseSet(c.String("buckets"), 0); err != nil {
					return invalid(fmt.Errorf("invalid --buckets: %w", err))
				}
			}
			if n := c.Int("batch"); n < 1 || n > store.MaxPruneBatch {
				return invalid(fmt.Errorf("--batch %d is out of range: give 1 to %d", n, store.MaxPruneBatch))
			}
			ret, err := parseRetention(c)
			if err != nil {
				return err
			}
			client, err := connect(c)
			if err != nil {
				return err
			}
			defer client.Close()
			if err := set.CheckRange(client.Policy().Count()); err != nil {
				return invalid(fmt.Errorf("invalid --buckets: %w", err))
			}
			node, owner := operatorIdentity("prune")
			rep, err := retention.Prune(c.Context, client.Store(), retention.Request{
				Owner: owner, Node: node, Buckets: set, Retention: ret,
				Batch: c.Int("batch"), DryRun: c.Bool("dry-run"),
			})
			if err != nil {
				return err
			}
			if c.Bool(jsonFlag.Name) {
				return printJSON(c.App.Writer, pruneJSON(rep))
			}
			printPruneReport(c, rep)
			return nil
		},
	}
}

type prunedJSON struct {
	Bucket int    `json:"bucket"`
	Status string `json:"status"`
	Tasks  int    `json:"tasks"`
	Oldest string `json:"oldest_finished_at"`
}

func pruneJSON(rep retention.Report) map[string]any {
	rows := []prunedJSON{}
	for _, b := range rep.Buckets {
		for _, st := range task.TerminalStates() {
			if c, ok := b.ByStatus[st]; ok {
				rows = append(rows, prunedJSON{Bucket: b.Bucket, Status: string(st), Tasks: c.Tasks,
					Oldest: c.Oldest.UTC().Format(JSONTimeFormat)})
			}
		}
	}
	skipped := make([]skippedJSON, 0, len(rep.Skipped))
	for _, b := range sortedKeys(rep.Skipped) {
		skipped = append(skipped, skippedJSON{Bucket: b, Holder: rep.Skipped[b]})
	}
	out := map[string]any{"dry_run": rep.DryRun, "buckets": rep.Acted.String(), "tasks": rep.Total.Tasks,
		"pruned": rows, "skipped": skipped}
	if !rep.DryRun {
		out["events"], out["commands"] = rep.Total.Events, rep.Total.Commands
	}
	return out
}

func printPruneReport(c *cli.Context, rep retention.Report) {
	w := c.App.Writer
	if len(rep.Skipped) > 0 {
		fmt.Fprintf(w, "skipped %d buckets held by live nodes (they prune their own): %s\n",
			len(rep.Skipped), bucket.Of(sortedKeys(rep.Skipped)...).String())
	}
	acted := rep.Acted.String()
	if acted == "" {
		acted = "none"
	}
	if rep.DryRun {
		fmt.Fprintf(w, "buckets nobody holds: %s; would prune %d tasks\n", acted, rep.Total.Tasks)
	} else {
		fmt.Fprintf(w, "buckets nobody holds: %s; pruned %d tasks, %d events, %d commands\n", acted,
			rep.Total.Tasks, rep.Total.Events, rep.Total.Commands)
	}
	if len(rep.Buckets) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BUCKET\tSTATUS\tTASKS\tOLDEST FINISHED")
	for _, b := range rep.Buckets {
		for _, st := range task.TerminalStates() {
			if n, ok := b.ByStatus[st]; ok {
				fmt.Fprintf(tw, "%d\t%s\t%d\t%s\n", b.Bucket, st, n.Tasks, n.Oldest.UTC().Format(time.RFC3339))
			}
		}
	}
	_ = tw.Flush()
}
