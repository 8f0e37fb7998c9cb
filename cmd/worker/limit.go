package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/store"
)

func limitCommand() *cli.Command {
	return &cli.Command{
		Name:  "limit",
		Usage: "set, list and remove concurrency and rate limits",
		Subcommands: []*cli.Command{
			limitSetCommand(),
			showCommand("list", "list the limits, with what each holder runs under them and its share of the fleet-wide ones", readLimits,
				func(r limitReport) any { return newLimitJSON(r) }, printLimits),
			limitRemoveCommand(),
		},
	}
}

func limitSetCommand() *cli.Command {
	return &cli.Command{
		Name:      "set",
		Usage:     "create or replace a limit: --kind K --per key|fleet (--concurrency N | --rate N/PERIOD [--burst B]) NAME",
		ArgsUsage: "NAME",
		Description: "--per key limits each limit key of the kind on its own (a task's limit key is its --limit-key,\n" +
			"or its --key); --per fleet limits every task of the kind in the fleet, shared among the nodes.\n" +
			"A rate is per key only. The nodes read the change at their next heartbeat.",
		Flags: commonFlags(
			&cli.StringFlag{Name: "kind", Usage: "the kind of task the limit applies to (required)"},
			&cli.StringFlag{Name: "per", Usage: "key: each limit key on its own; fleet: the whole fleet (required)"},
			&cli.IntFlag{Name: "concurrency", Usage: fmt.Sprintf("at most this many running, 1-%d", store.MaxLimitConcurrency), DefaultText: "none"},
			&cli.StringFlag{Name: "rate", Usage: `at most N starts per PERIOD, e.g. "10/1s", "100/m" (per key only)`},
			&cli.IntFlag{Name: "burst", Usage: "starts a rate allows at once", DefaultText: "1"},
			jsonFlag,
		),
		Action: func(c *cli.Context) error {
			args, err := positional(c)
			if err != nil {
				return err
			}
			if len(args) != 1 {
				return invalid(fmt.Errorf("limit set takes one NAME, got %d arguments", len(args)))
			}
			l, err := limitFromFlags(c, args[0])
			if err != nil {
				return err
			}
			client, err := connect(c)
			if err != nil {
				return err
			}
			defer client.Close()
			saved, err := client.Store().UpsertLimit(c.Context, l)
			if err != nil {
				return err
			}
			if c.Bool(jsonFlag.Name) {
				return printJSON(c.App.Writer, newLimitJSON(limitReport{Limit: saved}))
			}
			fmt.Fprintf(c.App.Writer, "limit %s set: kind %s, %s\n", cell(saved.Name), cell(saved.Kind), saved)
			return nil
		},
	}
}

// limitFromFlags checks limit set's flags before anything connects: each
// flag as typed, then the whole as every store would (store.CheckLimit).
func limitFromFlags(c *cli.Context, name string) (store.Limit, error) {
	l := store.Limit{Name: name, Kind: c.String("kind"), Per: c.String("per")}
	if err := checkName("NAME", name, true); err != nil {
		return l, err
	}
	if err := checkNameFlag(c, "kind", true); err != nil {
		return l, err
	}
	switch {
	case !c.IsSet("per"):
		return l, invalid(errors.New("--per is required: give key (each limit key on its own) or fleet (the whole fleet)"))
	case l.Per != store.PerKey && l.Per != store.PerFleet:
		return l, invalid(fmt.Errorf("--per %s is unknown: give key or fleet", store.Shorten(l.Per, 60)))
	case c.IsSet("concurrency") && c.IsSet("rate"):
		return l, invalid(errors.New("give --concurrency or --rate, not both"))
	case !c.IsSet("concurrency") && !c.IsSet("rate"):
		return l, invalid(errors.New("give --concurrency N or --rate N/PERIOD"))
	case c.IsSet("burst") && !c.IsSet("rate"):
		return l, invalid(errors.New("--burst goes with --rate: give --rate N/PERIOD too"))
	}
	if c.IsSet("concurrency") {
		l.Concurrency = c.Int("concurrency")
		if l.Concurrency < 1 || l.Concurrency > store.MaxLimitConcurrency {
			return l, invalid(fmt.Errorf("--concurrency %d is out of range: give 1 to %d", l.Concurrency, store.MaxLimitConcurrency))
		}
	}
	if c.IsSet("rate") {
		if l.Per != store.PerKey {
			return l, invalid(fmt.Errorf("--rate with --per %s: a rate is per key; give --per key", l.Per))
		}
		rate, period, err := parseRate(c.String("rate"))
		if err != nil {
			return l, err
		}
		l.Rate, l.Period = rate, period
	}
	if c.IsSet("burst") {
		l.Burst = c.Int("burst")
		if l.Burst < 1 || l.Burst > store.MaxLimitRate {
			return l, invalid(fmt.Errorf("--burst %d is out of range: give 1 to %d", l.Burst, store.MaxLimitRate))
		}
	}
	if l.Rate > 0 {
		if l.Period/time.Duration(l.Rate) < store.MinLimitInterval {
			return l, invalid(fmt.Errorf("--rate %s asks for more than one start per %v: give at most %d/%v",
				store.Shorten(c.String("rate"), 60), store.MinLimitInterval, l.Period/store.MinLimitInterval, l.Period))
		}
		if most := store.MaxBurst(l.Rate, l.Period); l.EffectiveBurst() > most {
			return l, invalid(fmt.Errorf("--burst %d takes longer than %v to refill at --rate %s: give --burst at most %d",
				l.Burst, store.MaxLimitRefill, store.Shorten(c.String("rate"), 60), most))
		}
	}
	if err := store.CheckLimit(l); err != nil {
		return l, invalid(err)
	}
	return l, nil
}

// parseRate reads N/PERIOD: N whole starts per PERIOD, a duration ("1s",
// "500ms") or a bare unit ("s", "m", "h") for one of it.
func parseRate(s string) (int, time.Duration, error) {
	bad := func(problem string) error {
		return invalid(fmt.Errorf("--rate %s %s: give N/PERIOD, e.g. 10/1s or 100/m, N from 1 to %d and PERIOD "+
			"whole milliseconds from 1ms to 24h", store.Shorten(s, 60), problem, store.MaxLimitRate))
	}
	count, per, ok := strings.Cut(s, "/")
	if !ok {
		return 0, 0, bad("has no /")
	}
	n, err := strconv.Atoi(count)
	if err != nil || n < 1 || n > store.MaxLimitRate {
		return 0, 0, bad("has a count that is not a whole number in range")
	}
	if per != "" && (per[0] < '0' || per[0] > '9') {
		per = "1" + per
	}
	period, err := time.ParseDuration(per)
	if err != nil {
		return 0, 0, bad("has a period that is not a duration")
	}
	if period < time.Millisecond || period > store.MaxLimitPeriod || period%time.Millisecond != 0 {
		return 0, 0, bad("has a period out of range")
	}
	return n, period, nil
}

func limitRemoveCommand() *cli.Command {
	return &cli.Command{
		Name:      "rm",
		Usage:     "remove a limit; its kind runs unlimited from the nodes' next heartbeat",
		ArgsUsage: "NAME",
		Flags:     commonFlags(jsonFlag),
		Action: func(c *cli.Context) error {
			args, err := positional(c)
			if err != nil {
				return err
			}
			if len(args) != 1 {
				return invalid(fmt.Errorf("limit rm takes one NAME, got %d arguments", len(args)))
			}
			if err := checkName("NAME", args[0], true); err != nil {
				return err
			}
			client, err := connect(c)
			if err != nil {
				return err
			}
			defer client.Close()
			if err := client.Store().DeleteLimit(c.Context, args[0]); err != nil {
				return err
			}
			if c.Bool(jsonFlag.Name) {
				return printJSON(c.App.Writer, map[string]any{"name": args[0], "removed": true})
			}
			fmt.Fprintf(c.App.Writer, "limit %s removed\n", cell(args[0]))
			return nil
		},
	}
}

// limitReport is a limit with what each holder runs under it, read from
// the active rows, and the holders' shares of it (fleet-wide limits only).
type limitReport struct {
	store.Limit
	Holders []store.HolderUse
	Shares  []store.ShareUse
}

func readLimits(client *flotilla.Client, ctx context.Context) ([]limitReport, error) {
	limits, err := client.Store().ListLimits(ctx)
	if err != nil {
		return nil, err
	}
	shares, err := client.Store().ListShares(ctx)
	if err != nil {
		return nil, err
	}
	keyUse, err := client.Store().ListKeyUse(ctx)
	if err != nil {
		return nil, err
	}
	byLimit := map[string][]store.ShareUse{}
	for _, sh := range shares {
		byLimit[sh.Limit] = append(byLimit[sh.Limit], sh)
	}
	out := make([]limitReport, len(limits))
	for i, l := range limits {
		out[i] = limitReport{Limit: l, Holders: store.UseByHolder(l, keyUse), Shares: byLimit[l.Name]}
	}
	return out, nil
}

type limitJSON struct {
	Name        string       `json:"name"`
	Kind        string       `json:"kind"`
	Per         string       `json:"per"`
	Concurrency int          `json:"concurrency,omitempty"`
	Rate        int          `json:"rate,omitempty"`
	Period      string       `json:"period,omitempty"`
	Burst       int          `json:"burst,omitempty"`
	CreatedAt   any          `json:"created_at"`
	UpdatedAt   any          `json:"updated_at"`
	Holders     []holderJSON `json:"holders"`
	Shares      []shareJSON  `json:"shares"`
}

type holderJSON struct {
	Node        string `json:"node"`
	Running     int    `json:"running"`
	Keys        int    `json:"keys"`
	KeysAtLimit int    `json:"keys_at_limit"`
}

type shareJSON struct {
	Node      string `json:"node"`
	Owner     string `json:"owner"`
	Share     int    `json:"share"`
	Demand    int    `json:"demand"`
	ExpiresAt any    `json:"expires_at"`
	Alive     bool   `json:"alive"`
}

func newLimitJSON(r limitReport) limitJSON {
	v := limitJSON{Name: r.Name, Kind: r.Kind, Per: r.Per, Concurrency: r.Concurrency, Rate: r.Rate,
		CreatedAt: jsonTime(r.CreatedAt), UpdatedAt: jsonTime(r.UpdatedAt), Holders: []holderJSON{}, Shares: []shareJSON{}}
	for _, h := range r.Holders {
		v.Holders = append(v.Holders, holderJSON{Node: h.Node, Running: h.Running, Keys: h.Keys, KeysAtLimit: h.KeysAtLimit})
	}
	if r.Rate > 0 {
		v.Period, v.Burst = r.Period.String(), r.EffectiveBurst()
	}
	for _, sh := range r.Shares {
		v.Shares = append(v.Shares, shareJSON{Node: sh.Node, Owner: sh.Owner, Share: sh.Share, Demand: sh.Demand,
			ExpiresAt: jsonTime(sh.ExpiresAt), Alive: sh.Alive})
	}
	return v
}

func printLimits(w io.Writer, rs []limitReport) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tKIND\tRULE\tUSE\tSHARES")
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", cell(r.Name), cell(r.Kind), r.Limit, dash(describeHolders(r.Limit, r.Holders)),
			dash(describeShares(r.Shares)))
	}
	_ = tw.Flush()
}

// describeHolders is "node-a 3 running over 2 keys (1 at its limit),
// node-b 1 running over 1 key".
func describeHolders(lim store.Limit, hs []store.HolderUse) string {
	parts := make([]string, 0, len(hs))
	for _, h := range hs {
		keys := "keys"
		if h.Keys == 1 {
			keys = "key"
		}
		p := fmt.Sprintf("%s %d running over %d %s", cell(h.Node), h.Running, h.Keys, keys)
		if lim.Per == store.PerKey && lim.Concurrency > 0 {
			p += fmt.Sprintf(" (%d at its limit)", h.KeysAtLimit)
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, ", ")
}

// describeShares is "node-a 2 of demand 3, node-b 1 of demand 1 (lapsed)".
func describeShares(shares []store.ShareUse) string {
	parts := make([]string, 0, len(shares))
	for _, sh := range shares {
		p := fmt.Sprintf("%s %d of demand %d", cell(sh.Node), sh.Share, sh.Demand)
		if !sh.Alive {
			p += " (lapsed)"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, ", ")
}
