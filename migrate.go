package flotilla

import (
	"context"
	"fmt"

	"github.com/flotilla-dev/flotilla/store"
	storedsn "github.com/flotilla-dev/flotilla/store/dsn"
)

// ErrNoSchema is matched by Connect's error on a database that has no
// flotilla schema yet, or an SQLite file that does not exist: Migrate
// creates it. It also matches store.ErrSchema.
var ErrNoSchema error = noSchemaError{}

type noSchemaError struct{}

func (noSchemaError) Error() string {
	return "no flotilla schema: create it with flotilla.Migrate(ctx, dsn) before connecting"
}

func (noSchemaError) Is(target error) bool { return target == store.ErrSchema }

// MigrateOption configures Migrate.
type MigrateOption func(*migrateOptions)

type migrateOptions struct {
	numBuckets int
}

// WithNumBuckets sets the bucket count of a new fleet (default
// bucket.DefaultCount). The count is fixed when the fleet is created: on an
// existing fleet another count is refused (*store.BucketCountError).
func WithNumBuckets(n int) MigrateOption {
	return func(o *migrateOptions) { o.numBuckets = n }
}

// Migrate makes dsn ready for a fleet: it creates the database when it is
// missing (the SQLite file, in a directory that must exist; on PostgreSQL
// the database the URL names, which needs the CREATEDB privilege) and
// creates or upgrades the schema. It is safe to run again, and from several
// processes at once; run it at deploy time, or at the start of a program
// that owns its database.
func Migrate(ctx context.Context, dsn string, opts ...MigrateOption) error {
	var o migrateOptions
	for _, opt := range opts {
		opt(&o)
	}
	target, err := storedsn.Parse(dsn)
	if err != nil {
		return err
	}
	if _, err := target.Ensure(ctx); err != nil {
		return err
	}
	s, err := target.Open(ctx)
	if err != nil {
		return err
	}
	defer s.Close()
	if _, err := s.Migrate(ctx, o.numBuckets); err != nil {
		return fmt.Errorf("migrate %s: %w", target, err)
	}
	return nil
}
