package store

import (
	"fmt"
	"time"
)

// CheckHandoffs refuses, with ErrInvalid, a batch no store could apply: a
// bucket named twice, a negative bucket, and, for a hand-off (not a mark),
// one without a successor. Every store calls it before any write.
func CheckHandoffs(moves []Handoff, handOff bool) error {
	seen := make(map[int]bool, len(moves))
	for i, m := range moves {
		switch {
		case m.Bucket < 0:
			return fmt.Errorf("hand-off %d: bucket %d is negative: %w", i, m.Bucket, ErrInvalid)
		case seen[m.Bucket]:
			return fmt.Errorf("hand-off %d: bucket %d is named a second time: %w", i, m.Bucket, ErrInvalid)
		case handOff && (m.To == "" || m.ToNode == ""):
			return fmt.Errorf("hand-off %d of bucket %d names no successor (incarnation and node id): %w",
				i, m.Bucket, ErrInvalid)
		case m.To != "" && m.ToNode == "":
			return fmt.Errorf("hand-off %d of bucket %d names the successor %s without its node id: %w",
				i, m.Bucket, m.To, ErrInvalid)
		}
		seen[m.Bucket] = true
	}
	return nil
}

// CheckHandOff is CheckHandoffs for a hand-off, with its lease TTL.
func CheckHandOff(moves []Handoff, ttl time.Duration) error {
	if err := CheckHandoffs(moves, true); err != nil {
		return err
	}
	if ttl <= 0 {
		return fmt.Errorf("hand off buckets: lease TTL %v is not positive: %w", ttl, ErrInvalid)
	}
	return nil
}
