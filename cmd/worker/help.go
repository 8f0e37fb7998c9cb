package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/flotilla-dev/flotilla/kinds"
	"github.com/flotilla-dev/flotilla/store"
)

// exitStatusHelp ends every command's help (DESIGN §9).
var exitStatusHelp = func() string {
	var b strings.Builder
	b.WriteString("Exit status:\n")
	for _, s := range exitStatuses {
		fmt.Fprintf(&b, "   %d  %s\n", s.status, s.meaning)
	}
	b.WriteString(`
A "--" ends the options: what follows is an argument even if it starts with "-".
Under --json, an error is printed on stderr as {"error": "...", "exit": N}.`)
	return b.String()
}()

// examples holds two examples or more for each command, by its path.
var examples = map[string][]string{
	"migrate": {
		"worker migrate --dsn postgres://postgres@127.0.0.1:5432/flotilla",
		"worker migrate --num-buckets 256    # a new fleet of 256 buckets",
	},
	"run": {
		"worker run --node-id a --buckets 0-31",
		"worker run --node-id b --wait-for-node-id --allow-exec /usr/local/bin/report",
	},
	"submit": {
		`worker submit --kind sleep --key order-42 --payload '{"duration":"30s"}'`,
		"worker submit --kind exec --key nightly --payload @job.json --max-attempts 1",
	},
	"get": {
		"worker get 42",
		"worker get --json 42",
	},
	"list": {
		"worker list --status failed --limit 20",
		"worker list --node a --kind sleep --json",
	},
	"stop": {
		"worker stop 42 --reason 'wrong input'",
		"worker stop 42 --wait --timeout 30s",
	},
	"pause": {
		"worker pause 42",
		"worker pause 42 --reason maintenance --json",
	},
	"resume": {
		"worker resume 42",
		"worker resume 42 --reason 'maintenance done'",
	},
	"buckets": {
		"worker buckets --unheld",
		"worker buckets --held-by a --json",
	},
	"buckets move": {
		"worker buckets move 0-7 --to node-b",
		"worker buckets move 12 --to node-c --json",
	},
	"buckets unpin": {
		"worker buckets unpin 0-7",
		"worker buckets unpin 0-63 --json",
	},
	"nodes": {
		"worker nodes",
		"worker nodes --all --json",
	},
	"reconcile": {
		"worker reconcile --dry-run",
		"worker reconcile --buckets 0-15",
	},
	"prune": {
		"worker prune --dry-run",
		"worker prune --buckets 0-15 --retain succeeded=1h,failed=72h --retain-kind audit:all=0",
	},
	"bucket-of": {
		"worker bucket-of order-42",
		"worker bucket-of --num-buckets 256 -- -key-starting-with-a-dash",
	},
	"schedule": {
		`worker schedule add --cron "*/5 * * * *" --kind noop tick`,
		"worker schedule list",
	},
	"schedule add": {
		`worker schedule add --cron "0 3 * * *" --timezone Europe/Paris --kind exec --payload @backup.json backup`,
		`worker schedule add --every 30s --kind sleep --payload '{"duration":"1s"}' heartbeat`,
	},
	"schedule list": {
		"worker schedule list",
		"worker schedule list --json",
	},
	"schedule rm": {
		"worker schedule rm backup",
		"worker schedule rm --json heartbeat",
	},
	"schedule pause": {
		"worker schedule pause backup",
		"worker schedule pause --json backup",
	},
	"schedule resume": {
		"worker schedule resume backup",
		"worker schedule resume --json backup",
	},
	"bench": {
		"worker bench --jobs 10000",
		"worker bench --jobs 100000 --concurrency 200 --json",
	},
	"version": {
		"worker version",
		"worker run --version    # any command takes --version",
	},
	"completion": {
		"source <(worker completion bash)",
		"worker completion fish > ~/.config/fish/completions/worker.fish",
	},
	"limit": {
		"worker limit set api --kind fetch --per key --concurrency 2",
		"worker limit list",
	},
	"limit set": {
		"worker limit set api --kind fetch --per key --concurrency 2    # each limit key of kind fetch: at most 2 running",
		"worker limit set mail --kind send --per key --rate 10/1s --burst 5",
		"worker limit set train --kind train --per fleet --concurrency 4    # at most 4 of kind train running in the fleet",
	},
	"limit list": {
		"worker limit list",
		"worker limit list --json",
	},
	"limit rm": {
		"worker limit rm api",
		"worker limit rm --json mail",
	},
	"pipeline": {
		"worker pipeline submit nightly.json",
		"worker pipeline get 42 --json",
	},
	"pipeline submit": {
		"worker pipeline submit nightly.json",
		"worker pipeline submit --json nightly.json    # the pipeline with its tasks' ids",
	},
	"pipeline get": {
		"worker pipeline get 42",
		"worker pipeline get 42 --json",
	},
	"pipeline retry": {
		"worker pipeline retry 42 --from report",
		"worker pipeline retry 42 --from fetch --json",
	},
	"pipeline stop": {
		"worker pipeline stop 42 --reason \"bad input file\"",
		"worker pipeline stop 42 --json    # one entry per step acted on",
	},
	"pipeline pause": {
		"worker pipeline pause 42",
		"worker pipeline pause 42 --reason \"database maintenance\" --json",
	},
	"pipeline resume": {
		"worker pipeline resume 42",
		"worker pipeline resume 42 --json",
	},
	"ui": {
		"worker ui    # read-only, on 127.0.0.1:8089",
		"worker ui --listen 127.0.0.1:9000 --token-file /etc/flotilla/ui-token",
	},
}

// stockKindsHelp describes the payload of each stock kind, for submit and
// schedule add.
func stockKindsHelp() string {
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range kinds.Payloads {
			if !yield(k) {
				return
			}
		}
	})
	var b strings.Builder
	b.WriteString("Stock kinds and their payloads (checked at submit):\n")
	for _, k := range names {
		fmt.Fprintf(&b, "   %-6s %s\n", k, kinds.Payloads[k])
	}
	fmt.Fprintf(&b, "\nLimits: keys, unique keys, kinds and names are at most %d bytes of UTF-8 without control characters; "+
		"a payload is at most 1 MiB of JSON; --payload @FILE reads it from a file, --payload - from standard input.",
		store.MaxNameBytes)
	return b.String()
}

// document gives every command its examples and the exit statuses, under
// its description.
func document(cmds []*cli.Command, parent string) {
	for _, c := range cmds {
		path := strings.TrimSpace(parent + " " + c.Name)
		var parts []string
		if c.Description != "" {
			parts = append(parts, c.Description)
		}
		if ex, ok := examples[path]; ok {
			parts = append(parts, "Examples:\n   "+strings.Join(ex, "\n   "))
		}
		parts = append(parts, exitStatusHelp)
		c.Description = strings.Join(parts, "\n\n")
		document(c.Subcommands, path)
	}
}
