package postgres_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/internal/testdb"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/postgres"
)

func TestEnsureDatabaseCreatesAMissingOneOnce(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn := testdb.Missing(t)

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

func TestNodesStartingTogetherOnAFreshServerAllCreateAndMigrate(t *testing.T) {
	t.Parallel()
	// What `worker run` and `worker migrate` do at start, from several
	// processes at once on a server where the fleet's database is missing.
	const starters = 6
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn := testdb.Missing(t)

	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		created = make([]bool, starters)
		metas   = make([]store.Meta, starters)
		errs    = make([]error, starters)
	)
	for i := range starters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			created[i], metas[i], errs[i] = createAndMigrate(ctx, dsn)
		}()
	}
	close(start)
	wg.Wait()

	creators := 0
	for i := range starters {
		if errs[i] != nil {
			t.Errorf("starter %d: %v", i, errs[i])
			continue
		}
		if created[i] {
			creators++
		}
		if metas[i].NumBuckets != metas[0].NumBuckets || !metas[i].CreatedAt.Equal(metas[0].CreatedAt) {
			t.Errorf("starter %d sees fleet %+v, starter 0 sees %+v: want one fleet", i, metas[i], metas[0])
		}
	}
	if creators != 1 {
		t.Errorf("%d starters report that they created the database, want 1", creators)
	}
}

func createAndMigrate(ctx context.Context, dsn string) (bool, store.Meta, error) {
	created, err := postgres.EnsureDatabase(ctx, dsn)
	if err != nil {
		return false, store.Meta{}, err
	}
	s, err := postgres.New(ctx, dsn, postgres.WithMaxConns(1))
	if err != nil {
		return created, store.Meta{}, err
	}
	defer s.Close()
	meta, err := s.Migrate(ctx, 0)
	return created, meta, err
}
