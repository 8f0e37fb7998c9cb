package dsn_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/dsn"
	"github.com/flotilla-dev/flotilla/store/sqlite"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParse(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		in   string
		kind dsn.Kind
		path string
	}{
		{in: "postgres://u@h:5432/db", kind: dsn.PostgreSQL},
		{in: "postgresql://u@h/db?sslmode=disable", kind: dsn.PostgreSQL},
		{in: "sqlite:flotilla.db", kind: dsn.SQLite, path: filepath.Join(wd, "flotilla.db")},
		{in: "sqlite:/var/lib/flotilla/fleet", kind: dsn.SQLite, path: "/var/lib/flotilla/fleet"},
		{in: "sqlite:///var/lib/fleet.db", kind: dsn.SQLite, path: "/var/lib/fleet.db"},
		{in: "data/fleet.db", kind: dsn.SQLite, path: filepath.Join(wd, "data/fleet.db")},
		{in: "/tmp/x.db", kind: dsn.SQLite, path: "/tmp/x.db"},
	}
	for _, tt := range tests {
		got, err := dsn.Parse(tt.in)
		if err != nil || got.Kind != tt.kind || got.Path != tt.path {
			t.Errorf("Parse(%q) = %+v, %v; want %s %q", tt.in, got, err, tt.kind, tt.path)
		}
	}
}

func TestParseRefusesOtherFormsNamingThemWithoutPassword(t *testing.T) {
	for _, in := range []string{"mysql://u@h/db", "host=db user=u password=hunter2", "fleet", "sqlite:", "http://x.db", "sqlite:a.db?mode=ro"} {
		_, err := dsn.Parse(in)
		if !errors.Is(err, store.ErrInvalid) {
			t.Errorf("Parse(%q): %v, want store.ErrInvalid", in, err)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("Parse(%q): the error shows the password: %v", in, err)
		}
	}
	_, err := dsn.Parse("mysql://u:hunter2@h/db")
	var ie *dsn.InvalidError
	if !errors.As(err, &ie) || strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), "mysql://u@h/db") ||
		!strings.Contains(err.Error(), "postgres://") || !strings.Contains(err.Error(), "sqlite:PATH") {
		t.Errorf("error %v: want it to name the DSN without its password, and both forms", err)
	}
}

func TestTargetStringHidesThePassword(t *testing.T) {
	got, err := dsn.Parse("postgres://u:hunter2@h/db")
	if err != nil {
		t.Fatal(err)
	}
	if s := got.String(); strings.Contains(s, "hunter2") || !strings.Contains(s, "u@h/db") {
		t.Errorf("String() = %q", s)
	}
}

func TestTargetStringHidesThePasswordOfAMultiHostURL(t *testing.T) {
	for _, tt := range []struct{ dsn, want string }{
		{"postgres://u:hunter2@10.0.0.1:5432,10.0.0.2:5432/db?target_session_attrs=read-write",
			"postgres://u@10.0.0.1:5432,10.0.0.2:5432/db?target_session_attrs=read-write"},
		{"postgres://u:hunter2@[::1]:5432,[::1]:5433/db?target_session_attrs=read-write",
			"postgres://u@[::1]:5432,[::1]:5433/db?target_session_attrs=read-write"},
	} {
		got, err := dsn.Parse(tt.dsn)
		if err != nil {
			t.Fatalf("Parse(a multi-host URL): %v", err)
		}
		if s := got.String(); s != tt.want {
			t.Errorf("String() = %q, want %q", s, tt.want)
		}
	}
}

func TestEnsureAndOpenSQLite(t *testing.T) {
	ctx := context.Background()
	target, err := dsn.Parse("sqlite:" + filepath.Join(t.TempDir(), "f.db"))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false} {
		created, err := target.Ensure(ctx)
		if err != nil || created != want {
			t.Fatalf("Ensure #%d: created %v, %v; want %v", i+1, created, err, want)
		}
	}
	s, err := target.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, ok := s.(*sqlite.Store); !ok {
		t.Fatalf("opened %T, want the SQLite store", s)
	}
	if _, err := s.Meta(ctx); !errors.Is(err, store.ErrSchema) {
		t.Fatalf("Meta of a new file: %v, want store.ErrSchema", err)
	}
}
