package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// Every invalid pipeline file is exit 2, naming the problem, before any
// connection: the DSN given points nowhere, so a file that got as far as
// connecting would fail with exit 1 instead.
func TestPipelineSubmitRefusesInvalidFilesWithExit2(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, body, want string
	}{
		{"empty", `{"name": "n", "tasks": []}`, "at least one step"},
		{"unknown dependency", `{"name": "n", "tasks": [{"name": "a", "kind": "k", "depends_on": ["nope"]}]}`, `depends on "nope"`},
		{"duplicate", `{"name": "n", "tasks": [{"name": "a", "kind": "k"}, {"name": "a", "kind": "k"}]}`, `"a" is used twice`},
		{"cycle", `{"name": "n", "tasks": [{"name": "a", "kind": "k", "depends_on": ["b"]}, {"name": "b", "kind": "k", "depends_on": ["a"]}]}`, "cycle: a -> b -> a"},
		{"policy", `{"name": "n", "tasks": [{"name": "a", "kind": "k"}, {"name": "b", "kind": "k", "depends_on": ["a"], "on": "maybe"}]}`, `"maybe"`},
		{"no name", `{"tasks": [{"name": "a", "kind": "k"}]}`, `no "name"`},
		{"unknown field", `{"name": "n", "tasks": [{"name": "a", "kind": "k", "dependson": ["x"]}]}`, `"dependson"`},
		{"bad timeout", `{"name": "n", "tasks": [{"name": "a", "kind": "k", "timeout": "soon"}]}`, `"soon"`},
		{"not json", `{"name": `, "not a pipeline file"},
		// encoding/json keeps the last of a key given twice and matches keys
		// in any case: a second depends_on would start the step at once.
		{"depends_on twice", `{"name": "n", "tasks": [{"name": "a", "kind": "k"}, {"name": "b", "kind": "k", "depends_on": ["a"], "depends_on": []}]}`,
			`task 1 has the key "depends_on" twice`},
		{"depends_on in another case", `{"name": "n", "tasks": [{"name": "a", "kind": "k"}, {"name": "b", "kind": "k", "depends_on": ["a"], "Depends_On": []}]}`,
			`task 1 has the keys "depends_on" and "Depends_On"`},
		{"a key in upper case", `{"name": "n", "tasks": [{"name": "a", "kind": "k", "Kind": "k2"}]}`, `"kind" and "Kind"`},
		{"a key only in upper case", `{"name": "n", "tasks": [{"name": "a", "KIND": "k"}]}`, `task 0 has the key "KIND": keys are lower case, write "kind"`},
		{"tasks twice", `{"name": "n", "tasks": [{"name": "a", "kind": "k"}], "tasks": [{"name": "b", "kind": "k"}]}`,
			`the pipeline has the key "tasks" twice`},
		{"name twice", `{"name": "n", "Name": "m", "tasks": [{"name": "a", "kind": "k"}]}`, `"name" and "Name"`},
		// A step is refused for what a submitted task is refused for.
		{"payload over 1 MiB", `{"name": "n", "tasks": [{"name": "a", "kind": "k", "payload": "` + strings.Repeat("x", 1<<20) + `"}]}`,
			`step "a": payload`},
		{"max attempts over 1000", `{"name": "n", "tasks": [{"name": "a", "kind": "k", "max_attempts": 1001}]}`,
			`step "a": max attempts 1001 is out of range`},
		{"kind with a control character", `{"name": "n", "tasks": [{"name": "a", "kind": "k\u0007"}]}`,
			`step "a": kind`},
		{"priority beyond int32", `{"name": "n", "tasks": [{"name": "a", "kind": "k", "priority": 2147483648}]}`,
			`step "a": priority 2147483648 is out of range`},
		{"key of 600 bytes", `{"name": "n", "key": "` + strings.Repeat("k", 600) + `", "tasks": [{"name": "a", "kind": "k"}]}`,
			`key`},
		{"a stock kind's payload", `{"name": "n", "tasks": [{"name": "a", "kind": "sleep", "payload": {"ms": 10}}]}`,
			`step "a": payload "{\"ms\": 10}" is refused by kind sleep`},
		{"over 64 MiB", `{"name": "n", "tasks": [{"name": "a", "kind": "k", "payload": "` + strings.Repeat("x", 64<<20) + `"}]}`,
			"over 64 MiB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_")+".json")
			if err := os.WriteFile(path, []byte(tc.body), 0o600); err != nil {
				t.Fatal(err)
			}
			_, stderr, code := runWorker(t, "pipeline", "submit", path, "--dsn", "postgres://nobody@127.0.0.1:1/none")
			if code != exitInvalid || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d, stderr %q; want exit %d naming %q", code, stderr, exitInvalid, tc.want)
			}
		})
	}
}

func TestPipelineCommandsRefuseBadArguments(t *testing.T) {
	for _, args := range [][]string{
		{"pipeline", "get"},
		{"pipeline", "get", "x"},
		{"pipeline", "retry", "7"},
		{"pipeline", "submit"},
	} {
		if _, stderr, code := runWorker(t, append(args, "--dsn", "postgres://nobody@127.0.0.1:1/none")...); code != exitInvalid {
			t.Errorf("%v: exit %d (%s), want %d", args, code, stderr, exitInvalid)
		}
	}
}

// pipeline pause, resume and stop print what they did to each step, and
// leave finished steps alone. No node runs here: the steps wait, so each
// request is applied at once (the command channel to a running step is
// covered by the client's tests and the integration test).
func TestPipelineStopPauseAndResumePrintEachStep(t *testing.T) {
	withoutDSNEnv(t)
	dsn := "sqlite:" + filepath.Join(t.TempDir(), "fleet.db")
	if _, stderr, code := runWorker(t, "migrate", "--dsn", dsn); code != exitOK {
		t.Fatal(stderr)
	}
	p, id, taskOf := submitPipelineFile(t, dsn, `{"name": "ops", "tasks": [{"name": "a", "kind": "noop"},
		{"name": "b", "kind": "noop", "depends_on": ["a"]}, {"name": "c", "kind": "noop", "depends_on": ["b"]}]}`)
	expect := func(args []string, want ...string) {
		t.Helper()
		stdout, stderr, code := runWorker(t, append(args, "--dsn", dsn)...)
		if code != exitOK {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
		if got := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n"); strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("%v printed\n%s\nwant\n%s", args, stdout, strings.Join(want, "\n"))
		}
	}
	expect([]string{"pipeline", "pause", id, "--reason", "maintenance"},
		"a: task "+taskOf["a"]+": paused (was queued)",
		"b: task "+taskOf["b"]+": paused (was pending)",
		"c: task "+taskOf["c"]+": paused (was pending)")
	stdout, stderr, code := runWorker(t, "pipeline", "resume", id, "--json", "--dsn", dsn)
	if code != exitOK {
		t.Fatal(stderr)
	}
	var resumed pipelineControlJSON
	if err := json.Unmarshal([]byte(stdout), &resumed); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range resumed.Steps {
		got = append(got, s.Step+"="+s.From+"->"+s.Status)
	}
	if strings.Join(got, " ") != "a=paused->queued b=paused->pending c=paused->pending" || resumed.Pipeline != p.ID {
		t.Errorf("resume answered %s for pipeline %d", got, resumed.Pipeline)
	}
	// Dependents first: c and b are cancelled while pending, then a.
	expect([]string{"pipeline", "stop", id},
		"c: task "+taskOf["c"]+": cancelled (was pending)",
		"b: task "+taskOf["b"]+": cancelled (was pending)",
		"a: task "+taskOf["a"]+": cancelled (was queued)")
	expect([]string{"pipeline", "pause", id}, "pipeline "+id+": no step to pause")
	stdout, _, _ = runWorker(t, "pipeline", "get", id, "--json", "--dsn", dsn)
	if err := json.Unmarshal([]byte(stdout), &p); err != nil {
		t.Fatal(err)
	}
	got = nil
	for _, s := range p.Tasks {
		got = append(got, s.Name+"="+string(s.Status))
	}
	if strings.Join(got, " ") != "a=cancelled b=cancelled c=cancelled" {
		t.Errorf("after the stop: %s", got)
	}
	// c depends on b, which ended cancelled: a retry from c would be
	// skipped at once. Refused, naming the step to retry from.
	_, stderr, code = runWorker(t, "pipeline", "retry", id, "--from", "c", "--dsn", dsn)
	if code != exitRefused || !strings.Contains(stderr, `retry from step "b"`) {
		t.Errorf("retry --from a step its dependency would skip: exit %d, %q; want exit %d naming step b", code, stderr, exitRefused)
	}
}

// TestPipelineGetDrawsATreeAndRetryRunsAStepAgain: `pipeline get` draws
// each step under the steps it depends on, a step with several dependencies
// in full under the first and named again under the others, with the
// policy of a dependency that is not "success"; `pipeline retry` refuses a
// step that has not ended and an unknown one, and after a stop runs the
// step again with its descendants, as new tasks (try 2), drawing the tree.
func TestPipelineGetDrawsATreeAndRetryRunsAStepAgain(t *testing.T) {
	withoutDSNEnv(t)
	dsn := "sqlite:" + filepath.Join(t.TempDir(), "fleet.db")
	if _, stderr, code := runWorker(t, "migrate", "--dsn", dsn); code != exitOK {
		t.Fatal(stderr)
	}
	p, id, taskOf := submitPipelineFile(t, dsn, `{"name": "diamond", "key": "tenant-7", "tasks": [{"name": "fetch", "kind": "noop"},
		{"name": "left", "kind": "noop", "depends_on": ["fetch"]},
		{"name": "right", "kind": "noop", "depends_on": ["fetch"]},
		{"name": "join", "kind": "noop", "depends_on": ["left", "right"]},
		{"name": "tidy", "kind": "noop", "depends_on": ["join"], "on": "any"}]}`)
	tree := func(status, fetch, others, try string) []string {
		return []string{
			"pipeline " + id + " diamond  key tenant-7  bucket " + strconv.Itoa(p.Bucket) + "  " + status,
			"└─ fetch  " + fetch + "  task " + taskOf["fetch"] + "  attempts 0" + try,
			"   ├─ left  " + others + "  task " + taskOf["left"] + "  attempts 0" + try,
			"   │  └─ join  " + others + "  task " + taskOf["join"] + "  attempts 0" + try,
			"   │     └─ [on any] tidy  " + others + "  task " + taskOf["tidy"] + "  attempts 0" + try,
			"   └─ right  " + others + "  task " + taskOf["right"] + "  attempts 0" + try,
			"      └─ join (see above)",
		}
	}
	lines := func(args ...string) []string {
		t.Helper()
		stdout, stderr, code := runWorker(t, append(args, "--dsn", dsn)...)
		if code != exitOK {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
		return strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	}
	if got, want := lines("pipeline", "get", id), tree("running", "queued", "pending", ""); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("pipeline get drew\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	for _, tc := range []struct {
		from string
		code int
		want string
	}{
		{"fetch", exitRefused, `step "fetch" is queued`},
		{"nope", exitNotFound, `no step "nope"`},
	} {
		_, stderr, code := runWorker(t, "pipeline", "retry", id, "--from", tc.from, "--dsn", dsn)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("retry --from %s: exit %d, %q; want exit %d naming %q", tc.from, code, stderr, tc.code, tc.want)
		}
	}

	lines("pipeline", "stop", id)
	old := map[string]string{}
	for k, v := range taskOf {
		old[k] = v
	}
	stdout, stderr, code := runWorker(t, "pipeline", "retry", id, "--from", "fetch", "--json", "--dsn", dsn)
	if code != exitOK {
		t.Fatal(stderr)
	}
	if err := json.Unmarshal([]byte(stdout), &p); err != nil {
		t.Fatal(err)
	}
	for _, s := range p.Tasks {
		taskOf[s.Name] = strconv.FormatInt(s.TaskID, 10)
		if taskOf[s.Name] == old[s.Name] {
			t.Errorf("after the retry, step %s is still task %s; want a new task", s.Name, old[s.Name])
		}
	}
	if got, want := lines("pipeline", "get", id), tree("running", "queued", "pending", "  (try 2)"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("pipeline get after the retry drew\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// submitPipelineFile submits the pipeline file body with `worker pipeline
// submit --json` and answers what it printed, the pipeline's id as an
// argument, and each step's task id by name.
func submitPipelineFile(t *testing.T, dsn, body string) (p pipelineJSON, id string, taskOf map[string]string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "pipeline.json")
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := runWorker(t, "pipeline", "submit", file, "--allow-unowned", "--json", "--dsn", dsn)
	if code != exitOK {
		t.Fatal(stderr)
	}
	if err := json.Unmarshal([]byte(stdout), &p); err != nil {
		t.Fatal(err)
	}
	taskOf = map[string]string{}
	for _, s := range p.Tasks {
		taskOf[s.Name] = strconv.FormatInt(s.TaskID, 10)
	}
	return p, strconv.FormatInt(p.ID, 10), taskOf
}

// The limits table of docs/pipelines.md gives each bound as the code has
// it: a bound changed in the code and not in the guide fails here.
func TestThePipelinesDocStatesEachLimit(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "pipelines.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, limits, ok := strings.Cut(string(doc), "\n## Limits\n")
	if !ok {
		t.Fatal("docs/pipelines.md has no Limits section")
	}
	limits, _, _ = strings.Cut(limits, "\n## ")
	for constant, bound := range map[string]string{
		"`maxPipelineFileBytes`":            sizeInWords(maxPipelineFileBytes),
		"`store.MaxPipelineSteps`":          "| " + thousands(store.MaxPipelineSteps) + " |",
		"`store.MaxNameBytes`":              "| " + strconv.Itoa(store.MaxNameBytes) + " bytes",
		"`store.MaxPayloadBytes`":           sizeInWords(store.MaxPayloadBytes),
		"`store.MaxMaxAttempts`":            "| " + thousands(store.MaxMaxAttempts) + " |",
		"`task.MaxResultBytes`":             sizeInWords(task.MaxResultBytes),
		"`store.MaxDependencyResultsBytes`": sizeInWords(store.MaxDependencyResultsBytes),
	} {
		row := ""
		for _, line := range strings.Split(limits, "\n") {
			if strings.Contains(line, constant) {
				row = line
			}
		}
		if !strings.Contains(row, bound) {
			t.Errorf("docs/pipelines.md's limit for %s is %q, want it to say %q", constant, row, bound)
		}
	}
}

// sizeInWords writes a size of whole KiB or MiB as a table cell does.
func sizeInWords(n int) string {
	if n%(1<<20) == 0 {
		return "| " + strconv.Itoa(n>>20) + " MiB |"
	}
	return "| " + strconv.Itoa(n>>10) + " KiB |"
}

// thousands writes n with a comma between each group of three digits.
func thousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
