package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestUIRefusesBadInputWithExitTwo(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "good")
	if err := os.WriteFile(good, []byte("0123456789abcdef0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dsn := "postgres://u:s3cret@127.0.0.1:1/none"
	cases := []struct {
		name string
		env  string
		args []string
		want string
	}{
		{"a short token file", "", []string{"ui", "--dsn", dsn, "--token-file", short}, "the token has 3 characters; give at least 16"},
		{"a missing token file", "", []string{"ui", "--dsn", dsn, "--token-file", filepath.Join(dir, "none")}, "invalid --token-file"},
		{"a short token in the environment", "abc", []string{"ui", "--dsn", dsn}, "$FLOTILLA_UI_TOKEN has 3 characters"},
		{"a token twice", "0123456789abcdef0123", []string{"ui", "--dsn", dsn, "--token-file", good}, "give one of them"},
		{"a zero query timeout", "", []string{"ui", "--dsn", dsn, "--query-timeout", "0s"}, "invalid --query-timeout 0s"},
		{"an argument", "", []string{"ui", "--dsn", dsn, "extra"}, "did you mean --listen?"},
		{"--ui without --http", "", []string{"run", "--dsn", dsn, "--ui"}, "--ui serves the dashboard on --http"},
		{"run with a short token file", "", []string{"run", "--dsn", dsn, "--http", "127.0.0.1:0", "--ui", "--ui-token-file", short}, "give at least 16"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(uiTokenEnv, c.env)
			_, stderr, code := runWorker(t, c.args...)
			if code != exitInvalid || !strings.Contains(stderr, c.want) {
				t.Errorf("exit %d, stderr %q; want %d with %q", code, stderr, exitInvalid, c.want)
			}
			if strings.Contains(stderr, "s3cret") || strings.Contains(stderr, "0123456789abcdef0123") {
				t.Errorf("a secret reached stderr: %q", stderr)
			}
		})
	}
}
