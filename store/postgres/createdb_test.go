package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/store/postgres"
)

func TestEnsureDatabaseCreatesAMissingOneOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := testdb.New(t) // an existing database on the test server
	u, err := url.Parse(base)
	if err != nil {
		t.Skipf("the test DSN is not a URL: %v", err)
	}
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	name := "flotilla_test_ensure_" + hex.EncodeToString(suffix)
	u.Path = "/" + name
	dsn := u.String()
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), base)
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		defer conn.Close(context.Background())
		_, _ = conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})

	created, err := postgres.EnsureDatabase(ctx, dsn)
	if err != nil || !created {
		t.Fatalf("first EnsureDatabase: created=%v err=%v, want the database created", created, err)
	}
	created, err = postgres.EnsureDatabase(ctx, dsn)
	if err != nil || created {
		t.Fatalf("second EnsureDatabase: created=%v err=%v, want it left alone", created, err)
	}
	s, err := postgres.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Migrate(ctx, 0); err != nil {
		t.Fatal(err)
	}
}
