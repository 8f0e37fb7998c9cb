package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/postgres"
)

// snapshot is everything a fleet's database holds: a digest of every row of
// every table of the schema, and every sequence's position (a refused
// insert must not use up a task id either).
func snapshot(t *testing.T, dsn string) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	rows, err := conn.Query(ctx, `SELECT c.relname, c.relkind::text FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'S')`)
	if err != nil {
		t.Fatal(err)
	}
	type rel struct{ name, kind string }
	var rels []rel
	for rows.Next() {
		var r rel
		if err := rows.Scan(&r.name, &r.kind); err != nil {
			t.Fatal(err)
		}
		rels = append(rels, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	sort.Slice(rels, func(i, j int) bool { return rels[i].name < rels[j].name })
	out := map[string]string{}
	for _, r := range rels {
		ident := pgx.Identifier{r.name}.Sanitize()
		q := `SELECT coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '') || ':' || count(*) FROM ` + ident + ` t`
		if r.kind == "S" {
			q = `SELECT last_value::text || ':' || is_called::text FROM ` + ident
		}
		var digest string
		if err := conn.QueryRow(ctx, q).Scan(&digest); err != nil {
			t.Fatalf("%s: %v", r.name, err)
		}
		out[r.name] = digest
	}
	if len(out) == 0 {
		t.Fatal("the snapshot found no table: is the schema there?")
	}
	return out
}

// hostileFleet is a migrated fleet with one task, one schedule, one limit and one
// stopped node's history in it, so that a write anywhere would show.
func hostileFleet(t *testing.T) string {
	t.Helper()
	dsn := testdb.New(t)
	withoutDSNEnv(t)
	for _, args := range [][]string{
		{"migrate", "--dsn", dsn},
		{"submit", "--dsn", dsn, "--kind", "noop", "--key", "k", "--allow-unowned"},
		{"schedule", "add", "--dsn", dsn, "--every", "1h", "--kind", "noop", "existing"},
		{"limit", "set", "--dsn", dsn, "--kind", "noop", "--per", "key", "--concurrency", "1", "existing"},
	} {
		if _, stderr, code := runWorker(t, args...); code != exitOK {
			t.Fatalf("worker %s: exit %d: %s", strings.Join(args, " "), code, stderr)
		}
	}
	return dsn
}

// TestHostileInputIsRefusedBeforeTheDatabase runs every command with input
// an operator might type by mistake or an attacker on purpose, and checks
// that each gets exit status 2 (or 4 for what does not exist), a message
// naming the value and what is valid, and that the database holds exactly
// what it held before.
func TestHostileInputIsRefusedBeforeTheDatabase(t *testing.T) {
	dsn := hostileFleet(t)
	dir := t.TempDir()
	big := filepath.Join(dir, "big.json")
	if err := os.WriteFile(big, []byte(`"`+strings.Repeat("x", 1<<20)+`"`), 0o600); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("k", 4000)
	huge := strings.Repeat("k", 80000)
	manyResources := ""
	for i := range store.MaxResources + 1 {
		manyResources += fmt.Sprintf("r%d=1,", i)
	}
	manyResources = strings.TrimSuffix(manyResources, ",")
	// Submits go to an unheld bucket if accepted, so that a check that
	// lets a bad value through shows as a write.
	d := func(args ...string) []string {
		args = append(args, "--dsn", dsn)
		if args[0] == "submit" {
			args = append(args, "--allow-unowned", "--allow-unknown-kind")
		}
		return args
	}
	tests := []struct {
		name     string
		args     []string
		code     int
		mentions []string
	}{
		// submit
		{"key not UTF-8", d("submit", "--kind", "noop", "--key", "a\xffb"), 2, []string{`--key "a\xffb" is not valid UTF-8`, "512 bytes"}},
		{"key with NUL", d("submit", "--kind", "noop", "--key", "a\x00b"), 2, []string{`--key "a\x00b"`, "control character U+0000"}},
		{"key with escape sequence", d("submit", "--kind", "noop", "--key", "\x1b[31mred"), 2, []string{`\x1b[31mred`, "control character U+001B"}},
		{"key 4000 bytes", d("submit", "--kind", "noop", "--key", long), 2, []string{"is 4000 bytes long", "… (4000 bytes)"}},
		{"key 80000 bytes", d("submit", "--kind", "noop", "--key", huge), 2, []string{"is 80000 bytes long"}},
		{"unique key 4000 bytes", d("submit", "--kind", "noop", "--key", "k", "--unique-key", long), 2, []string{"--unique-key", "is 4000 bytes long"}},
		{"empty key", d("submit", "--kind", "noop", "--key", ""), 2, []string{`--key "" is empty`}},
		{"blank key", d("submit", "--kind", "noop", "--key", "   "), 2, []string{`--key "   " is blank`}},
		{"no kind", d("submit", "--key", "k"), 2, []string{"--kind is required"}},
		{"kind with newline", d("submit", "--kind", "no\nop"), 2, []string{`--kind "no\nop"`, "U+000A"}},
		{"payload NUL escape", d("submit", "--kind", "noop", "--payload", `{"a":"\u0000"}`), 2, []string{`\u0000`, "PostgreSQL cannot store"}},
		{"payload lone surrogate", d("submit", "--kind", "noop", "--payload", `["\udc00"]`), 2, []string{`unpaired surrogate escape \udc00`}},
		{"payload not JSON", d("submit", "--kind", "noop", "--payload", `{"a":`), 2, []string{"is not valid JSON"}},
		{"payload not UTF-8", d("submit", "--kind", "noop", "--payload", "\"\xff\""), 2, []string{"is not valid UTF-8"}},
		{"payload empty", d("submit", "--kind", "noop", "--payload", ""), 2, []string{"--payload is empty"}},
		{"payload file missing", d("submit", "--kind", "noop", "--payload", "@"+filepath.Join(dir, "none.json")), 2, []string{"none.json", "no such file"}},
		{"payload file too big", d("submit", "--kind", "noop", "--payload", "@"+big), 2, []string{"at most 1 MiB"}},
		{"sleep banana", d("submit", "--kind", "sleep", "--payload", `{"duration":"banana"}`), 2, []string{`--payload "{\"duration\":\"banana\"}" is refused by kind sleep: payload duration "banana" is not a duration`}},
		{"fail negative", d("submit", "--kind", "fail", "--payload", `{"until_attempt":-2}`), 2, []string{"until_attempt -2 is negative"}},
		{"exec without argv", d("submit", "--kind", "exec", "--payload", `{}`), 2, []string{"is refused by kind exec", "no command"}},
		{"max attempts 0", d("submit", "--kind", "noop", "--max-attempts", "0"), 2, []string{"--max-attempts 0 is out of range", "leave it out for the default of 3"}},
		{"max attempts negative", d("submit", "--kind", "noop", "--max-attempts", "-1"), 2, []string{"--max-attempts -1"}},
		{"max attempts huge", d("submit", "--kind", "noop", "--max-attempts", "1000000"), 2, []string{"--max-attempts 1000000", "1 to 1000"}},
		{"priority beyond int32", d("submit", "--kind", "noop", "--priority", "1099511627776"), 2, []string{"--priority 1099511627776 is out of range"}},
		{"negative delay", d("submit", "--kind", "noop", "--delay", "-1s"), 2, []string{"--delay -1s is negative"}},
		{"delay and run-at", d("submit", "--kind", "noop", "--delay", "1s", "--run-at", "2030-01-01T00:00:00Z"), 2, []string{"not both"}},
		{"run-at garbage", d("submit", "--kind", "noop", "--run-at", "tomorrow"), 2, []string{`--run-at "tomorrow" is not an RFC 3339 time`}},
		{"run-at year 1", d("submit", "--kind", "noop", "--run-at", "0001-01-01T00:00:01Z"), 2, []string{"years 1970 to 9999"}},
		{"timeout fraction", d("submit", "--kind", "noop", "--timeout", "1500us"), 2, []string{"--timeout 1.5ms is not a whole number of milliseconds"}},
		{"timeout negative", d("submit", "--kind", "noop", "--timeout", "-1s"), 2, []string{"--timeout -1s is negative"}},
		{"not a number", d("submit", "--kind", "noop", "--priority", "high"), 2, []string{"high"}},
		{"unknown flag", d("submit", "--kind", "noop", "--colour", "red"), 2, []string{"colour"}},
		{"argument", d("submit", "--kind", "noop", "-dash-key"), 2, []string{"-dash-key"}},
		// get, stop, pause, resume
		{"get zero", d("get", "0"), 2, []string{`task ID "0" is not a positive integer`}},
		{"get negative after --", append(d("get"), "--", "-5"), 2, []string{`task ID "-5" is not a positive integer`}},
		{"get beyond int64", d("get", "99999999999999999999"), 2, []string{`"99999999999999999999"`}},
		{"get control characters", d("get", "1\x1b[2J"), 2, []string{`"1\x1b[2J"`}},
		{"get missing", d("get", "999999"), 4, []string{"no task 999999"}},
		{"stop zero", d("stop", "0"), 2, []string{`task ID "0"`}},
		{"stop reason control", d("stop", "1", "--reason", "a\rb"), 2, []string{`--reason "a\rb"`, "U+000D"}},
		{"stop reason huge", d("stop", "1", "--reason", huge), 2, []string{"--reason", "80000 bytes"}},
		{"stop wait zero timeout", d("stop", "1", "--wait", "--timeout", "0s"), 2, []string{"--timeout 0s is not positive"}},
		{"pause missing", d("pause", "999999"), 4, []string{"999999"}},
		{"resume two ids", d("resume", "1", "2"), 2, []string{"one task ID, got 2"}},
		// pipeline stop, pause, resume
		{"pipeline stop zero", d("pipeline", "stop", "0"), 2, []string{`pipeline ID "0" is not a positive integer`}},
		{"pipeline pause control characters", d("pipeline", "pause", "7\x1b[2J"), 2, []string{`pipeline ID "7\x1b[2J"`}},
		{"pipeline resume two ids", d("pipeline", "resume", "1", "2"), 2, []string{"one pipeline ID, got 2"}},
		{"pipeline stop reason control", d("pipeline", "stop", "1", "--reason", "a\rb"), 2, []string{`--reason "a\rb"`, "U+000D"}},
		{"pipeline stop missing", d("pipeline", "stop", "999999"), 4, []string{"pipeline 999999"}},
		{"pipeline pause missing", d("pipeline", "pause", "999999"), 4, []string{"pipeline 999999"}},
		{"pipeline resume missing", d("pipeline", "resume", "999999"), 4, []string{"pipeline 999999"}},
		// list
		{"list limit 0", d("list", "--limit", "0"), 2, []string{"--limit 0 is out of range"}},
		{"list limit negative", d("list", "--limit", "-3"), 2, []string{"--limit -3"}},
		{"list before negative", d("list", "--before", "-1"), 2, []string{"--before -1"}},
		{"list kind not UTF-8", d("list", "--kind", "\xfe"), 2, []string{`--kind "\xfe" is not valid UTF-8`}},
		{"list node huge", d("list", "--node", huge), 2, []string{"--node", "80000 bytes"}},
		{"list bad status", d("list", "--status", "bogus"), 2, []string{`"bogus"`}},
		{"list bucket beyond", d("list", "--bucket", "0-64"), 2, []string{"--bucket", "64"}},
		{"list bucket empty element", d("list", "--bucket", "1,,2"), 2, []string{"--bucket"}},
		// buckets, nodes, reconcile, bucket-of
		{"buckets held-by empty", d("buckets", "--held-by", ""), 2, []string{`--held-by "" is empty`}},
		{"buckets held-by and unheld", d("buckets", "--held-by", "a", "--unheld"), 2, []string{"not both"}},
		{"nodes argument", d("nodes", "x"), 2, []string{"takes no arguments"}},
		{"reconcile buckets beyond", d("reconcile", "--buckets", "0-64"), 2, []string{"--buckets", "64"}},
		{"reconcile buckets empty element", d("reconcile", "--buckets", "1,,2"), 2, []string{"--buckets"}},
		// prune, and run's retention flags
		{"prune retain not a final state", d("prune", "--retain", "queued=1h"), 2, []string{`"queued" is not a final state`, "succeeded"}},
		{"prune retain bad age", d("prune", "--retain", "succeeded=soon"), 2, []string{`age "soon"`, "0 (keep forever)"}},
		{"prune retain no equals", d("prune", "--retain", "succeeded"), 2, []string{`"succeeded"`, "STATE=AGE"}},
		{"prune retain empty", d("prune", "--retain", ""), 2, []string{"--retain", "empty"}},
		{"prune retain-kind without kind", d("prune", "--retain-kind", "succeeded=1h"), 2, []string{`"succeeded=1h"`, "KIND:STATE=AGE"}},
		{"prune retain-kind bad state", d("prune", "--retain-kind", "email:running=1h"), 2, []string{"kind email", `"running"`}},
		{"prune batch zero", d("prune", "--batch", "0"), 2, []string{"--batch 0 is out of range"}},
		{"prune batch huge", d("prune", "--batch", "10001"), 2, []string{"--batch 10001", "10000"}},
		{"prune buckets beyond", d("prune", "--buckets", "0-64"), 2, []string{"--buckets", "64"}},
		{"prune argument", d("prune", "x"), 2, []string{"takes no arguments"}},
		{"run retain negative", d("run", "--retain", "failed=-1h"), 2, []string{`age "-1h"`}},
		{"run prune batch huge", d("run", "--prune-batch", "20000"), 2, []string{"--prune-batch 20000"}},
		{"run prune interval negative", d("run", "--prune-interval", "-1m"), 2, []string{"--prune-interval -1m0s is negative"}},
		{"bucket-of not UTF-8", d("bucket-of", "\xff"), 2, []string{`KEY "\xff" is not valid UTF-8`}},
		{"bucket-of empty", d("bucket-of", ""), 2, []string{`KEY "" is empty`}},
		{"bucket-of zero buckets", d("bucket-of", "k", "--num-buckets", "0"), 2, []string{"--num-buckets"}},
		// schedule
		{"schedule name huge", d("schedule", "add", "--every", "1m", "--kind", "noop", huge), 2, []string{"NAME", "80000 bytes"}},
		{"schedule name control", d("schedule", "add", "--every", "1m", "--kind", "noop", "a\tb"), 2, []string{`NAME "a\tb"`, "U+0009"}},
		{"schedule cron empty element", d("schedule", "add", "--cron", "1,,2 * * * *", "--kind", "noop", "s"), 2, []string{`field "1,,2" has an empty list element`}},
		{"schedule sleep banana", d("schedule", "add", "--every", "1m", "--kind", "sleep", "--payload", `{"duration":"banana"}`, "s"), 2, []string{"banana"}},
		{"schedule payload NUL", d("schedule", "add", "--every", "1m", "--kind", "noop", "--payload", `"\u0000"`, "s"), 2, []string{`\u0000`}},
		{"schedule max attempts 0", d("schedule", "add", "--every", "1m", "--kind", "noop", "--max-attempts", "0", "s"), 2, []string{"--max-attempts 0"}},
		{"schedule negative every", d("schedule", "add", "--every", "-1m", "--kind", "noop", "s"), 2, []string{"-1m"}},
		{"schedule kind missing", d("schedule", "add", "--every", "1m", "s"), 2, []string{"kind"}},
		{"schedule existing", d("schedule", "add", "--every", "1m", "--kind", "noop", "existing"), 3, []string{"--replace"}},
		{"schedule rm not UTF-8", d("schedule", "rm", "\xff"), 2, []string{`NAME "\xff" is not valid UTF-8`}},
		{"schedule rm missing", d("schedule", "rm", "none"), 4, []string{"none"}},
		// limits: submit's and run's flags, then limit set and rm
		{"limit key not UTF-8", d("submit", "--kind", "noop", "--key", "k", "--limit-key", "t\xff"), 2, []string{`--limit-key "t\xff" is not valid UTF-8`}},
		{"limit key empty", d("submit", "--kind", "noop", "--limit-key", ""), 2, []string{`--limit-key "" is empty`}},
		{"limit key 4000 bytes", d("submit", "--kind", "noop", "--limit-key", long), 2, []string{"--limit-key", "is 4000 bytes long"}},
		{"resources empty", d("submit", "--kind", "noop", "--key", "k", "--resources", ""), 2, []string{"--resources is empty", "gpu=1,mem=8"}},
		{"resources without =", d("submit", "--kind", "noop", "--key", "k", "--resources", "gpu"), 2, []string{`--resources "gpu" is not NAME=AMOUNT`}},
		{"resources zero", d("submit", "--kind", "noop", "--key", "k", "--resources", "gpu=0"), 2, []string{`--resources "gpu=0" is out of range`, "1 to 2^40"}},
		{"resources negative", d("submit", "--kind", "noop", "--key", "k", "--resources", "gpu=-1"), 2, []string{`--resources "gpu=-1" is out of range`}},
		{"resources not a number", d("submit", "--kind", "noop", "--key", "k", "--resources", "gpu=one"), 2, []string{`--resources "gpu=one"`, "not a whole number"}},
		{"resources twice", d("submit", "--kind", "noop", "--key", "k", "--resources", "gpu=1,gpu=2"), 2, []string{`--resources "gpu" is given twice`}},
		{"resources name with NUL", d("submit", "--kind", "noop", "--key", "k", "--resources", "g\x00pu=1"), 2, []string{"--resources name", "U+0000"}},
		{"resources too many", d("submit", "--kind", "noop", "--key", "k", "--resources", manyResources), 2, []string{"names 17 resources", "at most 16"}},
		{"run capacity zero", d("run", "--capacity", "gpu=0"), 2, []string{`--capacity "gpu=0" is out of range`}},
		{"run capacity garbage", d("run", "--capacity", "lots"), 2, []string{`--capacity "lots" is not NAME=AMOUNT`}},
		{"limit set no name", d("limit", "set", "--kind", "noop", "--per", "key", "--concurrency", "2"), 2, []string{"limit set takes one NAME, got 0"}},
		{"limit set name not UTF-8", d("limit", "set", "--kind", "noop", "--per", "key", "--concurrency", "2", "a\xff"), 2, []string{`NAME "a\xff" is not valid UTF-8`}},
		{"limit set no kind", d("limit", "set", "--per", "key", "--concurrency", "2", "api"), 2, []string{"--kind", "empty"}},
		{"limit set no per", d("limit", "set", "--kind", "noop", "--concurrency", "2", "api"), 2, []string{"--per is required", "key", "fleet"}},
		{"limit set per tenant", d("limit", "set", "--kind", "noop", "--per", "tenant", "--concurrency", "2", "api"), 2, []string{`--per "tenant" is unknown: give key or fleet`}},
		{"limit set neither", d("limit", "set", "--kind", "noop", "--per", "key", "api"), 2, []string{"give --concurrency N or --rate N/PERIOD"}},
		{"limit set both", d("limit", "set", "--kind", "noop", "--per", "key", "--concurrency", "2", "--rate", "1/s", "api"), 2, []string{"not both"}},
		{"limit set concurrency 0", d("limit", "set", "--kind", "noop", "--per", "key", "--concurrency", "0", "existing"), 2, []string{"--concurrency 0 is out of range", "1 to 1000000"}},
		{"limit set concurrency huge", d("limit", "set", "--kind", "noop", "--per", "fleet", "--concurrency", "1000001", "existing"), 2, []string{"--concurrency 1000001 is out of range"}},
		{"limit set rate without slash", d("limit", "set", "--kind", "noop", "--per", "key", "--rate", "10", "api"), 2, []string{`--rate "10" has no /`, "10/1s"}},
		{"limit set rate zero", d("limit", "set", "--kind", "noop", "--per", "key", "--rate", "0/s", "api"), 2, []string{`--rate "0/s" has a count`}},
		{"limit set rate bad period", d("limit", "set", "--kind", "noop", "--per", "key", "--rate", "10/fortnight", "api"), 2, []string{`--rate "10/fortnight" has a period that is not a duration`}},
		{"limit set rate period 2 days", d("limit", "set", "--kind", "noop", "--per", "key", "--rate", "10/48h", "api"), 2, []string{"period out of range", "1ms to 24h"}},
		{"limit set rate submillisecond", d("limit", "set", "--kind", "noop", "--per", "key", "--rate", "10/1500us", "api"), 2, []string{"period out of range"}},
		{"limit set rate per fleet", d("limit", "set", "--kind", "noop", "--per", "fleet", "--rate", "10/s", "api"), 2, []string{"a rate is per key"}},
		{"limit set burst without rate", d("limit", "set", "--kind", "noop", "--per", "key", "--concurrency", "2", "--burst", "3", "api"), 2, []string{"--burst goes with --rate"}},
		{"limit set burst 0", d("limit", "set", "--kind", "noop", "--per", "key", "--rate", "10/s", "--burst", "0", "api"), 2, []string{"--burst 0 is out of range"}},
		{"limit set burst beyond a year's refill", d("limit", "set", "--kind", "noop", "--per", "key", "--rate", "1/24h", "--burst", "200000", "api"), 2, []string{"--burst 200000 takes longer than 8760h0m0s to refill", "at most 365"}},
		{"limit set rate beyond one a microsecond", d("limit", "set", "--kind", "noop", "--per", "key", "--rate", "600000/1ms", "api"), 2, []string{`--rate "600000/1ms" asks for more than one start per 1µs`, "at most 1000/1ms"}},
		{"limit rm not UTF-8", d("limit", "rm", "\xff"), 2, []string{`NAME "\xff" is not valid UTF-8`}},
		{"limit rm missing", d("limit", "rm", "none"), 4, []string{`limit "none"`, "not found"}},
		{"schedule pause empty", d("schedule", "pause", ""), 2, []string{`NAME "" is empty`}},
		// run, migrate, bench, completion
		{"run node id not UTF-8", d("run", "--node-id", "n\xff"), 2, []string{`--node-id "n\xff" is not valid UTF-8`}},
		{"run node id huge", d("run", "--node-id", huge), 2, []string{"--node-id", "80000 bytes"}},
		{"run concurrency 0", d("run", "--concurrency", "0"), 2, []string{"--concurrency 0 is not positive"}},
		{"run concurrency negative", d("run", "--concurrency", "-4"), 2, []string{"--concurrency -4"}},
		{"run lease ttl 0", d("run", "--bucket-lease-ttl", "0s"), 2, []string{"--bucket-lease-ttl 0s is not positive"}},
		{"run negative shutdown", d("run", "--shutdown-timeout", "-1s"), 2, []string{"--shutdown-timeout -1s is negative"}},
		{"run buckets beyond the fleet", d("run", "--buckets", "0-64"), 2, []string{"--buckets", "64"}},
		{"run buckets empty element", d("run", "--buckets", "1,,2"), 2, []string{"--buckets"}},
		{"run num buckets 0", d("run", "--num-buckets", "0"), 2, []string{"--num-buckets"}},
		{"migrate num buckets 0", d("migrate", "--num-buckets", "0"), 2, []string{"--num-buckets"}},
		{"migrate num buckets huge", d("migrate", "--num-buckets", "99999999"), 2, []string{"--num-buckets"}},
		{"bench jobs 0", d("bench", "--jobs", "0"), 2, []string{"--jobs 0"}},
		{"completion unknown shell", []string{"completion", "tcsh"}, 2, []string{`"tcsh"`, "bash, zsh or fish"}},
		{"unknown command", []string{"frobnicate"}, 2, []string{`"frobnicate"`}},
		// connection strings that do not parse
		{"dsn bad port", []string{"list", "--dsn", "postgres://u:secret@h:notaport/db"}, 2, []string{"invalid PostgreSQL DSN", "invalid port"}},
		{"dsn bad escape", []string{"submit", "--kind", "noop", "--dsn", "postgres://%zz"}, 2, []string{"invalid PostgreSQL DSN"}},
		// A DSN of neither form (a keyword/value string included) is named,
		// with the two forms that are.
		{"dsn not a dsn", []string{"migrate", "--dsn", "hello world"}, 2, []string{`"hello world" is neither`, "postgres://", "sqlite:PATH"}},
		{"dsn run", []string{"run", "--node-id", "n", "--dsn", "host=h port=notaport"}, 2, []string{`"host=h port=notaport" is neither`, "sqlite:PATH"}},
	}
	before := snapshot(t, dsn)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdout, stderr, code := runWorker(t, tt.args...)
			if code != tt.code {
				t.Errorf("exit %d, want %d; stderr: %s", code, tt.code, stderr)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
			for _, want := range tt.mentions {
				if !strings.Contains(stderr, want) {
					t.Errorf("stderr %q does not say %q", shortFor(stderr), want)
				}
			}
			// The message is one readable line: no raw control character
			// from the input, and no value printed whole when it is huge.
			if msg := strings.TrimSuffix(stderr, "\n"); strings.ContainsAny(msg, "\x00\x1b\r\n\t") || len(msg) > 1000 {
				t.Errorf("stderr is not one short, escaped line: %q", shortFor(stderr))
			}
			if strings.Contains(stderr, "secret") {
				t.Errorf("stderr shows the password: %s", stderr)
			}
			if after := snapshot(t, dsn); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Errorf("the database changed:\nbefore %v\nafter  %v", before, after)
			}
		})
	}
}

func shortFor(s string) string {
	if len(s) > 400 {
		return s[:400] + "..."
	}
	return s
}

// TestRunRefusesBucketsBeyondANewFleetBeforeCreatingIt: against a missing
// database, --buckets beyond a new fleet's count is refused, and the
// database is not created.
func TestRunRefusesBucketsBeyondANewFleetBeforeCreatingIt(t *testing.T) {
	withoutDSNEnv(t)
	dsn := testdb.Missing(t)
	_, stderr, code := runWorker(t, "run", "--dsn", dsn, "--node-id", "n", "--buckets", "0-64")
	if code != exitInvalid || !strings.Contains(stderr, "a new one has 64 buckets") || !strings.Contains(stderr, "--num-buckets") {
		t.Errorf("exit %d, want %d naming the new fleet's count; stderr: %s", code, exitInvalid, stderr)
	}
	created, err := postgres.EnsureDatabase(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	if !created {
		t.Error("the refused node created the database")
	}
	// With --num-buckets, the same range is checked without the database.
	_, stderr, code = runWorker(t, "run", "--dsn", dsn, "--node-id", "n", "--buckets", "0-64", "--num-buckets", "32")
	if code != exitInvalid || !strings.Contains(stderr, "--num-buckets 32") {
		t.Errorf("exit %d, want %d; stderr: %s", code, exitInvalid, stderr)
	}
}

// TestErrorsAreJSONUnderJSON: with --json, an error is a JSON object on
// stderr with its exit status, and stdout stays empty.
func TestErrorsAreJSONUnderJSON(t *testing.T) {
	withoutDSNEnv(t)
	stdout, stderr, code := runWorker(t, "submit", "--json", "--kind", "noop", "--key", "a\xff", "--dsn", unreachable)
	if code != exitInvalid || stdout != "" {
		t.Fatalf("exit %d, stdout %q; want %d and nothing", code, stdout, exitInvalid)
	}
	var got struct {
		Error string `json:"error"`
		Exit  int    `json:"exit"`
	}
	if err := json.Unmarshal([]byte(stderr), &got); err != nil {
		t.Fatalf("stderr is not JSON: %v: %s", err, stderr)
	}
	if got.Exit != exitInvalid || !strings.Contains(got.Error, `--key "a\xff" is not valid UTF-8`) {
		t.Errorf("stderr JSON %+v", got)
	}
	// After "--", --json is an argument, not the flag.
	_, stderr, _ = runWorker(t, "get", "--dsn", unreachable, "--", "--json")
	if strings.HasPrefix(stderr, "{") {
		t.Errorf("an argument --json after -- made the error JSON: %s", stderr)
	}
}
