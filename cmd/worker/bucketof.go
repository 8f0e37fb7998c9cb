package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/flotilla-dev/flotilla/bucket"
)

func bucketOfCommand() *cli.Command {
	return &cli.Command{
		Name:      "bucket-of",
		Usage:     "print the bucket a key hashes to (and its holder, given a database)",
		ArgsUsage: "KEY",
		Flags:     commonFlags(numBucketsFlag, jsonFlag),
		Action: func(c *cli.Context) error {
			args, err := positional(c)
			if err != nil {
				return err
			}
			if len(args) != 1 {
				return invalid(fmt.Errorf("bucket-of takes one KEY, got %d arguments", len(args)))
			}
			key := args[0]
			if err := checkName("KEY", key, true); err != nil {
				return err
			}
			count := bucket.DefaultCount
			if c.IsSet(numBucketsFlag.Name) {
				count = c.Int(numBucketsFlag.Name)
				if _, err := bucket.NewPolicy(count); err != nil {
					return invalid(fmt.Errorf("invalid --num-buckets: %w", err))
				}
			}
			holder := ""
			dsn, _, err := lookupDSN(c)
			if err != nil {
				return err
			}
			if dsn != "" {
				s, meta, err := openFleet(c.Context, dsn)
				if err != nil {
					return err
				}
				defer s.Close()
				if c.IsSet(numBucketsFlag.Name) && count != meta.NumBuckets {
					return invalid(fmt.Errorf("--num-buckets %d differs from the fleet's %d buckets", count, meta.NumBuckets))
				}
				count = meta.NumBuckets
				leases, err := s.ListBuckets(c.Context)
				if err != nil {
					return err
				}
				policy, err := bucket.NewPolicy(count)
				if err != nil {
					return err
				}
				if b := policy.Of(key); b < len(leases) {
					holder = leases[b].Node
				}
			}
			policy, err := bucket.NewPolicy(count)
			if err != nil {
				return invalid(fmt.Errorf("invalid --num-buckets: %w", err))
			}
			b := policy.Of(key)
			if c.Bool(jsonFlag.Name) {
				return printJSON(c.App.Writer, map[string]any{"key": key, "bucket": b, "holder": holder})
			}
			if holder != "" {
				fmt.Fprintf(c.App.Writer, "%d\theld by %s\n", b, holder)
				return nil
			}
			fmt.Fprintln(c.App.Writer, b)
			return nil
		},
	}
}
