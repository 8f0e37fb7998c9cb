package storetest

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
)

func testFleet(t *testing.T, h Harness) {
	t.Run("MetaBeforeMigrateAsksForMigrate", func(t *testing.T) {
		parallel(t, h)
		ctx := context.Background()
		s := h.Open(t)
		_, err := s.Meta(ctx)
		var se *store.SchemaError
		if !errors.As(err, &se) || !errors.Is(err, store.ErrSchema) {
			t.Fatalf("Meta on an empty database: %v, want *store.SchemaError", err)
		}
		if !strings.Contains(err.Error(), "flotilla.Migrate") || strings.Contains(err.Error(), "worker ") {
			t.Errorf("%q does not name flotilla.Migrate, or names a command of the binary", err)
		}
	})

	t.Run("MigrateFixesTheBucketCount", func(t *testing.T) {
		parallel(t, h)
		ctx := context.Background()
		s := h.Open(t)
		meta, err := s.Migrate(ctx, 0)
		if err != nil {
			t.Fatalf("Migrate: %v", err)
		}
		if meta.NumBuckets != bucket.DefaultCount {
			t.Errorf("NumBuckets = %d, want the default %d", meta.NumBuckets, bucket.DefaultCount)
		}
		if meta.SchemaVersion < 1 {
			t.Errorf("SchemaVersion = %d", meta.SchemaVersion)
		}
		leases, err := s.ListBuckets(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(leases) != bucket.DefaultCount {
			t.Fatalf("ListBuckets has %d buckets, want %d", len(leases), bucket.DefaultCount)
		}
		for i, l := range leases {
			if l.Bucket != i || l.Holder != "" {
				t.Fatalf("bucket %d: %+v, want bucket %d free", i, l, i)
			}
		}
	})

	t.Run("MigrateTwiceAndConcurrently", func(t *testing.T) {
		parallel(t, h)
		ctx := context.Background()
		s := h.Open(t)
		other := h.Reopen(t, s)
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, st := range []store.Store{s, other} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = st.Migrate(ctx, 16)
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("concurrent Migrate %d: %v", i, err)
			}
		}
		for _, n := range []int{16, 0} {
			meta, err := s.Migrate(ctx, n)
			if err != nil || meta.NumBuckets != 16 {
				t.Fatalf("Migrate(%d) again = %+v, %v; want 16 buckets and no error", n, meta, err)
			}
		}
	})

	t.Run("ADifferentBucketCountIsRefused", func(t *testing.T) {
		b := setup(t, h)
		_, err := b.s.Migrate(b.ctx, 64)
		var ce *store.BucketCountError
		if !errors.As(err, &ce) || !errors.Is(err, store.ErrBucketCount) {
			t.Fatalf("Migrate(64) on a fleet of %d: %v, want *store.BucketCountError", numBuckets, err)
		}
		if ce.Fleet != numBuckets || ce.Requested != 64 {
			t.Errorf("error carries fleet=%d requested=%d", ce.Fleet, ce.Requested)
		}
		for _, want := range []string{"8", "64"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%q does not name %s", err, want)
			}
		}
		meta, err := b.s.Meta(b.ctx)
		if err != nil || meta.NumBuckets != numBuckets {
			t.Errorf("after the refusal Meta = %+v, %v; the fleet must be unchanged", meta, err)
		}
	})

	t.Run("ANewerSchemaIsRefused", func(t *testing.T) {
		b := setup(t, h)
		meta, err := b.s.Meta(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		h.SetSchemaVersion(t, b.s, meta.SchemaVersion+1)
		for name, call := range map[string]func() error{
			"Meta":    func() error { _, err := b.s.Meta(b.ctx); return err },
			"Migrate": func() error { _, err := b.s.Migrate(b.ctx, 0); return err },
		} {
			err := call()
			var se *store.SchemaError
			if !errors.As(err, &se) {
				t.Fatalf("%s on a newer schema: %v, want *store.SchemaError", name, err)
			}
			if se.Database != meta.SchemaVersion+1 || se.Binary != meta.SchemaVersion {
				t.Errorf("%s: SchemaError %+v", name, se)
			}
			if !strings.Contains(err.Error(), "newer") {
				t.Errorf("%s: %q does not say the schema is newer", name, err)
			}
		}
	})

	t.Run("NowIsTheStoreClock", func(t *testing.T) {
		b := setup(t, h)
		now, err := b.s.Now(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Generous: the point is that Now answers a plausible wall time.
		if d := time.Since(now); d > time.Hour || d < -time.Hour {
			t.Errorf("Now = %v, more than an hour from this machine's clock", now)
		}
	})
}
