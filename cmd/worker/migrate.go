package main

import (
	"context"
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	storedsn "github.com/flotilla-dev/flotilla/store/dsn"
)

var numBucketsFlag = &cli.IntFlag{
	Name:        "num-buckets",
	Usage:       fmt.Sprintf("the fleet's bucket count, fixed when the fleet is created (%d-%d)", bucket.MinCount, bucket.MaxCount),
	DefaultText: fmt.Sprintf("the fleet's; %d for a new fleet", bucket.DefaultCount),
}

func migrateCommand() *cli.Command {
	return &cli.Command{
		Name:      "migrate",
		Usage:     "create or upgrade the fleet's schema in its database, an SQLite file (the default) or PostgreSQL, creating the database if missing",
		ArgsUsage: " ",
		Flags:     commonFlags(numBucketsFlag, jsonFlag),
		Action: func(c *cli.Context) error {
			if err := noArgs(c, ""); err != nil {
				return err
			}
			n := c.Int(numBucketsFlag.Name)
			if c.IsSet(numBucketsFlag.Name) {
				if _, err := bucket.NewPolicy(n); err != nil {
					return invalid(fmt.Errorf("invalid --num-buckets: %w", err))
				}
			}
			_, target, err := requireDSN(c)
			if err != nil {
				return err
			}
			created, err := target.Ensure(c.Context)
			if err != nil {
				return err
			}
			if created {
				fmt.Fprintln(c.App.ErrWriter, "created the database")
			}
			s, err := target.Open(c.Context)
			if err != nil {
				return err
			}
			defer s.Close()
			meta, err := s.Migrate(c.Context, n)
			if err != nil {
				return err
			}
			if c.Bool(jsonFlag.Name) {
				return printJSON(c.App.Writer, map[string]any{
					"schema_version": meta.SchemaVersion, "num_buckets": meta.NumBuckets,
					"created_at": jsonTime(meta.CreatedAt),
				})
			}
			fmt.Fprintf(c.App.Writer, "schema version %d, %d buckets\n", meta.SchemaVersion, meta.NumBuckets)
			return nil
		},
	}
}

// openFleet connects and reads the fleet's metadata, refusing a schema this
// binary does not know.
func openFleet(ctx context.Context, dsn string) (store.Store, store.Meta, error) {
	target, err := storedsn.Parse(dsn)
	if err != nil {
		return nil, store.Meta{}, invalid(err)
	}
	s, err := target.Open(ctx)
	if err != nil {
		return nil, store.Meta{}, err
	}
	meta, err := s.Meta(ctx)
	if err != nil {
		s.Close()
		return nil, store.Meta{}, err
	}
	return s, meta, nil
}
