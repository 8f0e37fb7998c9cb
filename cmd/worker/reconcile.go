package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"slices"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/reconcile"
)

func reconcileCommand() *cli.Command {
	return &cli.Command{
		Name: "reconcile",
		Usage: "rescue tasks left running in buckets that no live node holds " +
			"(buckets a node holds are its own to rescue, and are skipped)",
		ArgsUsage: " ",
		Flags: commonFlags(
			&cli.StringFlag{Name: "buckets", Usage: `only these buckets, e.g. "0-31" (default: every bucket)`},
			&cli.BoolFlag{Name: "dry-run", Usage: "take no lease and change nothing; list what a run would do"},
			jsonFlag,
		),
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
			client, err := connect(c)
			if err != nil {
				return err
			}
			defer client.Close()
			if err := set.CheckRange(client.Policy().Count()); err != nil {
				return invalid(fmt.Errorf("invalid --buckets: %w", err))
			}
			node, owner := operatorIdentity("reconcile")
			rep, err := reconcile.RunOperator(c.Context, client.Store(), reconcile.OperatorRequest{
				Owner: owner, Node: node, Buckets: set, DryRun: c.Bool("dry-run"),
			})
			if err != nil {
				return err
			}
			if c.Bool(jsonFlag.Name) {
				return printJSON(c.App.Writer, operatorJSON(rep))
			}
			printOperatorReport(c, rep)
			return nil
		},
	}
}

type rescueJSON struct {
	Task          int64  `json:"task"`
	Bucket        int    `json:"bucket"`
	Kind          string `json:"kind"`
	From          string `json:"from"`
	To            string `json:"to"`
	Outcome       string `json:"outcome"`
	PreviousOwner string `json:"previous_owner"`
	Attempt       int    `json:"attempt"`
	Reason        string `json:"reason"`
	Error         string `json:"error,omitempty"`
}

type skippedJSON struct {
	Bucket int    `json:"bucket"`
	Holder string `json:"holder"`
}

func operatorJSON(rep reconcile.OperatorReport) map[string]any {
	entries := make([]rescueJSON, len(rep.Entries))
	for i, e := range rep.Entries {
		entries[i] = rescueJSON{Task: e.TaskID, Bucket: e.Bucket, Kind: e.Kind, From: string(e.From), To: string(e.To),
			Outcome: string(e.Outcome), PreviousOwner: e.PreviousOwner, Attempt: e.Attempt, Reason: e.Reason, Error: e.Err}
	}
	skipped := make([]skippedJSON, 0, len(rep.Skipped))
	for _, b := range sortedKeys(rep.Skipped) {
		skipped = append(skipped, skippedJSON{Bucket: b, Holder: rep.Skipped[b]})
	}
	return map[string]any{"dry_run": rep.DryRun, "buckets": rep.Acted.String(), "rescued": entries,
		"skipped": skipped, "more": rep.More}
}

func printOperatorReport(c *cli.Context, rep reconcile.OperatorReport) {
	w := c.App.Writer
	verb := "rescued"
	if c.Bool("dry-run") {
		verb = "would rescue"
	}
	if len(rep.Skipped) > 0 {
		fmt.Fprintf(w, "skipped %d buckets held by live nodes (they rescue their own): %s\n",
			len(rep.Skipped), bucket.Of(sortedKeys(rep.Skipped)...).String())
	}
	acted := rep.Acted.String()
	if acted == "" {
		acted = "none"
	}
	fmt.Fprintf(w, "buckets nobody holds: %s; %s %d tasks\n", acted, verb, rep.Rescued())
	if len(rep.Entries) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TASK\tBUCKET\tKIND\tFROM\tTO\tOUTCOME\tPREVIOUS OWNER\tATTEMPT")
	for _, e := range rep.Entries {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\t%s\t%d\n", e.TaskID, e.Bucket, cell(e.Kind), e.From, e.To, e.Outcome,
			dash(cell(e.PreviousOwner)), e.Attempt)
	}
	_ = tw.Flush()
	if rep.More {
		fmt.Fprintln(w, "(more expired tasks than one page: a real run handles them all)")
	}
	if left := rep.Busy + rep.Failed; left > 0 {
		fmt.Fprintf(w, "%d tasks were left as they were (busy: locked by another writer throughout; failed: the store refused the write); run again to retry them\n", left)
	}
}

func sortedKeys(m map[int]string) []int { return slices.Sorted(maps.Keys(m)) }

// operatorIdentity is the node id and incarnation under which an operator's
// command (reconcile, prune) takes the leases of unheld buckets: named for
// the command, the host and the process, with a random incarnation so that
// two runs never share a lease.
func operatorIdentity(command string) (node, owner string) {
	host, _ := os.Hostname()
	nonce := make([]byte, 4)
	_, _ = rand.Read(nonce)
	node = fmt.Sprintf("%s-%s-%d", command, host, os.Getpid())
	return node, node + "/" + hex.EncodeToString(nonce)
}
