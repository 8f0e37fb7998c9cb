package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flotilla-dev/flotilla/internal/testdb"
)

// runWorkerWithInput is runWorker with a standard input.
func runWorkerWithInput(t *testing.T, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = runWithInput(append([]string{"worker"}, args...), strings.NewReader(stdin), &out, &errOut)
	return out.String(), errOut.String(), code
}

// TestPayloadFromAFileOrStandardInputAndKeysStartingWithADash: --payload
// @FILE and --payload - give the payload, the trailing newline dropped; a
// key or name that starts with "-" is given after the flag or after "--".
func TestPayloadFromAFileOrStandardInputAndKeysStartingWithADash(t *testing.T) {
	withoutDSNEnv(t)
	dsn := testdb.New(t)
	if _, stderr, code := runWorker(t, "migrate", "--dsn", dsn); code != exitOK {
		t.Fatal(stderr)
	}
	file := filepath.Join(t.TempDir(), "p.json")
	if err := os.WriteFile(file, []byte(`{"duration":"1s"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	submit := func(stdin string, args ...string) taskJSON {
		t.Helper()
		args = append([]string{"submit", "--dsn", dsn, "--allow-unowned", "--json"}, args...)
		stdout, stderr, code := runWorkerWithInput(t, stdin, args...)
		if code != exitOK {
			t.Fatalf("worker %s: exit %d: %s", strings.Join(args, " "), code, stderr)
		}
		var got taskJSON
		if err := json.Unmarshal([]byte(stdout), &got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	compact := func(raw json.RawMessage) string {
		var b bytes.Buffer
		if err := json.Compact(&b, raw); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	if got := submit("", "--kind", "sleep", "--payload", "@"+file, "--key", "-dash"); compact(got.Payload) != `{"duration":"1s"}` || got.Key != "-dash" {
		t.Errorf("from a file: payload %s key %q", got.Payload, got.Key)
	}
	if got := submit(`{"until_attempt":2}`+"\n", "--kind", "fail", "--payload", "-"); compact(got.Payload) != `{"until_attempt":2}` {
		t.Errorf("from standard input: payload %s", got.Payload)
	}
	if _, stderr, code := runWorkerWithInput(t, "", "submit", "--dsn", dsn, "--allow-unowned", "--kind", "noop", "--payload", "-"); code != exitInvalid || !strings.Contains(stderr, "--payload \"-\" is empty") {
		t.Errorf("empty standard input: exit %d: %s", code, stderr)
	}
	// A schedule name and a bucket-of key that start with "-", after "--".
	if _, stderr, code := runWorker(t, "schedule", "add", "--dsn", dsn, "--every", "1h", "--kind", "noop", "--", "-nightly"); code != exitOK {
		t.Errorf("schedule add -- -nightly: exit %d: %s", code, stderr)
	}
	if stdout, stderr, code := runWorker(t, "schedule", "rm", "--dsn", dsn, "--json", "--", "-nightly"); code != exitOK || !strings.Contains(stdout, `"removed": true`) {
		t.Errorf("schedule rm --json -- -nightly: exit %d, %s %s", code, stdout, stderr)
	}
	if stdout, _, code := runWorker(t, "bucket-of", "--", "-k"); code != exitOK || strings.TrimSpace(stdout) == "" {
		t.Errorf("bucket-of -- -k: exit %d, %q", code, stdout)
	}
}

func TestCellsAreEscapedAndShortened(t *testing.T) {
	tests := []struct{ in, want string }{
		{"plain", "plain"},
		{"tab\there", `tab\there`},
		{"\x1b[2Jclear", `\x1b[2Jclear`},
		{"bad\xffbyte", `bad\xffbyte`},
		{"new\nline", `new\nline`},
		{"real \uFFFD stays", "real \uFFFD stays"},
		{strings.Repeat("é", 50), strings.Repeat("é", cellWidth) + "…"},
	}
	for _, tt := range tests {
		if got := cell(tt.in); got != tt.want {
			t.Errorf("cell(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
