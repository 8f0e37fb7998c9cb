package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
