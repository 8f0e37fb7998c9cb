// Package examples_test runs every example as a user would, and checks
// that it tells its story: an example that stops compiling, exits with an
// error, or no longer shows what it is about fails here.
package examples_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/internal/testenv"
)

// example is one program under examples/ and the lines that prove its
// story, as regular expressions over its output.
type example struct {
	name string
	want []string
}

// exampleRun is a run of an example, with the environment it adds.
type exampleRun struct {
	label string
	example
	env func(t *testing.T) []string
}

var examples = []example{
	{"firsttask", []string{
		`submitted task 1 \(kind greet, key user-42, bucket \d+\): queued`,
		`handler: hello, Ada \(task 1, attempt 1\)`,
		`task 1 succeeded with result \{"greeted":"Ada"\}`,
		`1\. \(new\) -> queued`,
		`2\. queued -> running on node-1, epoch 1, attempt 1`,
		`3\. running -> succeeded on node-1, epoch 1, attempt 1`,
	}},
	{"typedhandler", []string{
		`task 1 succeeded: thumbnail cat\.png@128w, 8192 bytes`,
		`handler: resizing cat\.png to 128px wide \(attempt 1 of 3\)`,
		`task 2 failed after 1 attempt\(s\) of 3: resize task 2: the payload does not decode into main\.Resize: json: unknown field "height"`,
	}},
	{"outbox", outboxWant},
	{"retries", []string{
		`flaky: attempt 1 fails`,
		`flaky: attempt 2 fails`,
		`flaky: attempt 3 succeeds`,
		`task 1 \(flaky\) succeeded at attempt 3 of 5`,
		`running -> retrying \(upstream unavailable \(attempt 2\)\)`,
		`slow: attempt 1 cancelled: timeout=true`,
		`slow: attempt 2 cancelled: timeout=true`,
		`task 2 \(slow\) timed_out after 2 attempts`,
		`running -> timed_out \(attempt 2 timed out after 300ms`,
	}},
	{"pauseresume", []string{
		`copy: pause requested; saved progress \{"done":3\}`,
		`task 1 paused with progress \{"done":3\}`,
		`copy: attempt 2 resumes after file 3`,
		`task 1 succeeded at attempt 2 with result \{"copied":10\}`,
		`copy: task 2 cancelled after file 2: stop requested=true`,
		`task 2 stopped`,
	}},
	{"exec", []string{
		`node node-1 allows exec of: /bin/echo`,
		`task 1 \(/bin/echo\) succeeded: exit code 0, stdout "hello from a child process\\n"`,
		`task 2 \(/bin/cat\) failed after 1 attempt\(s\): exec is not allowed on this node: "/bin/cat" is not among the allowed executables \[/bin/echo\]`,
	}},
	{"schedules", []string{
		`schedule refresh-cache: @every 1s, kind refresh, bucket \d+, fired by node-1`,
		`tick 1: task \d+ from schedule refresh-cache, for \d\d:\d\d:\d\d`,
		`tick 2: task \d+ from schedule refresh-cache, for \d\d:\d\d:\d\d`,
		`fired 2 ticks; node shut down`,
	}},
	{"uniquekeys", []string{
		`task 1 is running`,
		`second submit refused: duplicate=true`,
		`tasks in the fleet: 1`,
		`a new submit with unique key invoice-7 was accepted as task 2, and succeeded`,
	}},
	{"limits", []string{
		`node-1 holds buckets 0-7, capacity gpu=1`,
		`node-2 holds buckets 8-15, no capacity`,
		`all 6 exports succeeded; never more than 2 running at once for customer-a \(most seen: [12]\)`,
		`all 4 emails succeeded; starts after the first, at 2 per second: \+\S+ \+\S+ \+\S+`,
		`all 6 renders succeeded \(3 on node-1, 3 on node-2\); never more than 2 running at once in the fleet \(most seen: [12]\)`,
		`all 3 train tasks succeeded on node-1, one at a time for its one gpu \(most seen: 1\)`,
		`task \d+ \(train, needs gpu=2\) is still queued: resources: more than node node-1 has free \(capacity gpu=1\)`,
		`stopped task \d+: queued -> cancelled`,
	}},
	{"pipeline", []string{
		`submitted pipeline 1 \(word-count\) with 5 steps`,
		`step count-1: counted 7 words`,
		`step count-3: counted 5 words`,
		`step sum: read the results of count-1, count-2, count-3: 19 words in all`,
		`pipeline 1 succeeded:`,
		`sum +succeeded result \{"words":19\}`,
	}},
	{"failover", []string{
		`node-a declares 0-5 and holds 0-5`,
		`node-b declares 0-10 and holds 6-10`,
		`node-c declares 11-15 and holds 11-15`,
		`node-a: running task 1 \(attempt \d+, epoch \d+\), then hanging`,
		`node-a stops abruptly; its handler is abandoned: true`,
		`node-b took bucket \d+ over once its lease had lapsed`,
		`node-b: running task 1 \(attempt \d+, epoch \d+\) to the end`,
		`task 1 succeeded on node-b at attempt \d+`,
		`running -> retrying on node-b, epoch \d+`,
		`node-b now holds 0-10; node-c holds 11-15`,
	}},
	{"httpservice", []string{
		`listening on http://127\.0\.0\.1:\d+ \(node web-1\)`,
		`handler: sending the welcome email of task 1 to ada@example\.com`,
		`client: POST /tasks created task 1 \(queued\)`,
		`/metrics says: flotilla_transitions_total\{from="running",to="succeeded"\} 1`,
		`signal received: shutting down gracefully`,
		`HTTP server and node shut down; exiting`,
	}},
}

var outboxWant = []string{
	`rolled back: order for an umbrella with task \d+\n  orders: 0, ship tasks: 0`,
	// The node may ship the order before the counts are printed: the
	// lines are checked apart.
	`committed: order for a teapot with task \d+\n`,
	`\n  orders: 1, ship tasks: 1\n`,
	`ship: shipping .*teapot`,
	`task \d+ succeeded`,
}

// exampleTimeout bounds one example's run. Each ends by itself within
// seconds; the margin is for a loaded machine.
const exampleTimeout = 90 * time.Second

func TestExamplesRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the examples; skipped by -short")
	}
	dirs, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, ex := range examples {
		listed[ex.name] = true
	}
	for _, d := range dirs {
		if d.IsDir() && d.Name() != "internal" && !listed[d.Name()] {
			t.Errorf("examples/%s is not run by this test: add it to examples", d.Name())
		}
	}

	bin := t.TempDir()
	pkgs := make([]string, len(examples))
	for i, ex := range examples {
		pkgs[i] = "./" + ex.name
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	args := []string{"build", "-o", bin + string(filepath.Separator)}
	if testenv.RaceEnabled {
		// As the test was built: the examples are checked for races, and
		// the build reuses the packages compiled for the test.
		args = append(args, "-race")
	}
	build := exec.CommandContext(ctx, "go", append(args, pkgs...)...)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", strings.Join(pkgs, " "), err, out)
	}

	var runs []exampleRun
	for _, ex := range examples {
		runs = append(runs, exampleRun{label: ex.name, example: ex})
	}
	// On PostgreSQL too, on a fresh database that testdb drops afterwards.
	if os.Getenv(testdb.EnvDSN) != "" {
		pg := example{"outbox", append([]string{`store: PostgreSQL`}, outboxWant...)}
		runs = append(runs, exampleRun{label: "outbox-postgres", example: pg, env: func(t *testing.T) []string {
			return []string{"FLOTILLA_DSN=" + testdb.New(t)}
		}})
	}

	// Two at a time: each example runs its own nodes.
	slots := make(chan struct{}, 2)
	for _, r := range runs {
		t.Run(r.label, func(t *testing.T) {
			t.Parallel()
			slots <- struct{}{}
			defer func() { <-slots }()
			var env []string
			if r.env != nil {
				env = r.env(t)
			}
			runExample(t, filepath.Join(bin, r.example.name), env, r.want)
		})
	}
}

// runExample runs the binary with a temporary directory of its own and the
// extra environment given, and checks that it exits 0, that its output
// matches every pattern of want, and that it left its temporary directory
// empty.
func runExample(t *testing.T, binary string, extraEnv, want []string) {
	tmp := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), exampleTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FLOTILLA_DSN=") && !strings.HasPrefix(kv, "TMPDIR=") && !strings.HasPrefix(kv, "GORACE=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	// A race-enabled binary sleeps a second at exit by default.
	cmd.Env = append(cmd.Env, "TMPDIR="+tmp, strings.TrimSpace("GORACE="+os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	cmd.Env = append(cmd.Env, extraEnv...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v (context: %v)\n%s", filepath.Base(binary), err, ctx.Err(), out)
	}
	for _, w := range want {
		if !regexp.MustCompile(w).Match(out) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	left, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Errorf("the example left %d entries in its temporary directory, first %s", len(left), left[0].Name())
	}
}
