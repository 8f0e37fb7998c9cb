package main

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/node"
	storedsn "github.com/flotilla-dev/flotilla/store/dsn"
	"github.com/flotilla-dev/flotilla/store/postgres"
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
		{"a missing token file", "", []string{"ui", "--dsn", dsn, "--token-file", filepath.Join(dir, "none")}, "cannot be read: no such file"},
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

func TestSecretFilesReadableByOthersAreRefused(t *testing.T) {
	dir := t.TempDir()
	loose := filepath.Join(dir, "loose")
	if err := os.WriteFile(loose, []byte("0123456789abcdef0123\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(loose, 0o644); err != nil { // whatever the umask
		t.Fatal(err)
	}
	groupOnly := filepath.Join(dir, "group")
	if err := os.WriteFile(groupOnly, []byte("postgres://u:s3cret@127.0.0.1:1/none\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(groupOnly, 0o640); err != nil {
		t.Fatal(err)
	}
	dsn := "postgres://u:s3cret@127.0.0.1:1/none"
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"a token file others read", []string{"ui", "--dsn", dsn, "--token-file", loose}, "--token-file " + loose + " has mode 0644"},
		{"a node's token file others read", []string{"run", "--dsn", dsn, "--http", "127.0.0.1:0", "--ui", "--ui-token-file", loose}, "has mode 0644"},
		{"a DSN file its group reads", []string{"ui", "--dsn-file", groupOnly}, "--dsn-file " + groupOnly + " has mode 0640"},
		{"a DSN file for a submit", []string{"submit", "--dsn-file", groupOnly, "--kind", "noop"}, "chmod 600"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(uiTokenEnv, "")
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

func TestUIAccessFlagsAreChecked(t *testing.T) {
	dsn := "postgres://u:s3cret@127.0.0.1:1/none"
	for _, c := range []struct {
		name, env string
		args      []string
		want      string
	}{
		{"an unknown auth mode", "0123456789abcdef0123", []string{"ui", "--dsn", dsn, "--auth", "some"}, `invalid --auth: auth mode "some" is not known`},
		{"an auth mode without a token", "", []string{"ui", "--dsn", dsn, "--auth", "actions"}, "--auth actions needs a token"},
		{"a proxy that is no address", "", []string{"ui", "--dsn", dsn, "--trusted-proxy", "proxy.local"}, `invalid --trusted-proxy "proxy.local"`},
		{"an empty secret field", "", []string{"ui", "--dsn", dsn, "--secret-field", "_"}, `invalid --secret-field "_"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(uiTokenEnv, c.env)
			_, stderr, code := runWorker(t, c.args...)
			if code != exitInvalid || !strings.Contains(stderr, c.want) {
				t.Errorf("exit %d, stderr %q; want %d with %q", code, stderr, exitInvalid, c.want)
			}
		})
	}
}

// TestRunUIWarnsBeyondLoopbackAndReadsThroughAPoolOfItsOwn: `worker run
// --http ADDR --ui` warns as `worker ui` does when ADDR is not loopback, and
// its pages read PostgreSQL through a pool of their own, not the node's.
func TestRunUIWarnsBeyondLoopbackAndReadsThroughAPoolOfItsOwn(t *testing.T) {
	dsn := testdb.New(t)
	ctx := context.Background()
	target, err := storedsn.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	s, err := postgres.New(ctx, dsn, postgres.WithApplicationName("flotilla-node-test"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Migrate(ctx, 8); err != nil {
		t.Fatal(err)
	}
	n, err := node.New(s, node.Config{NodeID: "solo", AllBuckets: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		addr string
		warn bool
	}{{"0.0.0.0:8080", true}, {"192.0.2.7:8080", true}, {"127.0.0.1:8080", false}, {"[::1]:8080", false}} {
		core, logs := observer.New(zap.WarnLevel)
		addr, err := net.ResolveTCPAddr("tcp", c.addr)
		if err != nil {
			t.Fatal(err)
		}
		h, closeUI, err := nodeHTTP(ctx, s, n, httpOptions{ui: true, dsn: dsn, target: target}, addr, zap.New(core))
		if err != nil {
			t.Fatal(err)
		}
		if got := logs.FilterMessageSnippet("beyond loopback").Len() > 0; got != c.warn {
			t.Errorf("--http %s --ui: warned %v, want %v", c.addr, got, c.warn)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/fleet", nil))
		if w.Code != http.StatusOK {
			t.Fatalf("GET /fleet: %d", w.Code)
		}
		var own int
		if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = 'flotilla-ui' AND datname = current_database()`).Scan(&own); err != nil {
			t.Fatal(err)
		}
		if own == 0 {
			t.Error("the dashboard's page read no connection of its own (application_name flotilla-ui)")
		}
		closeUI()
	}
}
