package bucket

import (
	"errors"
	"fmt"

	"github.com/cespare/xxhash/v2"
)

const (
	// MinCount is the smallest bucket count: a fleet with one bucket sends
	// every task to whichever nodes own bucket 0.
	MinCount = 1

	// DefaultCount is the bucket count used when a fleet configures none. It
	// leaves room to spread work over dozens of workers while keeping
	// ownership lists short enough to read.
	DefaultCount = 64

	// MaxCount is the largest bucket count. The bound keeps everything that
	// is sized by the count (ownership tables, sets spelled out bucket by
	// bucket) small, and is far beyond the number of workers a fleet runs.
	MaxCount = 65536
)

// ErrInvalidCount is matched by errors.Is for every refused bucket count.
var ErrInvalidCount = errors.New("invalid bucket count")

// checkCount reports whether count is a usable bucket count. The error names
// the value and the valid range, so a bad configuration value is easy to find.
func checkCount(count int) error {
	if count < MinCount || count > MaxCount {
		return fmt.Errorf("%w %d: a fleet has between %d and %d buckets", ErrInvalidCount, count, MinCount, MaxCount)
	}
	return nil
}

// Policy maps task keys to buckets for a fleet with a fixed bucket count.
//
// The zero Policy has [DefaultCount] buckets, so a fleet that configures
// nothing and a fleet that explicitly asks for the default agree on every
// key's bucket.
type Policy struct {
	// count is 0 in the zero Policy, meaning DefaultCount.
	count int
}

// NewPolicy returns the Policy for a fleet with count buckets. It refuses
// counts outside MinCount..MaxCount.
func NewPolicy(count int) (Policy, error) {
	if err := checkCount(count); err != nil {
		return Policy{}, err
	}
	return Policy{count: count}, nil
}

// Count returns the number of buckets, N.
func (p Policy) Count() int {
	if p.count == 0 {
		return DefaultCount
	}
	return p.count
}

// Of returns the bucket of key: xxhash64 of the key's UTF-8 bytes, modulo
// the bucket count. The result is in 0..Count()-1.
func (p Policy) Of(key string) int {
	return int(xxhash.Sum64String(key) % uint64(p.Count()))
}

// All returns the set of every bucket in the fleet: the ownership of a node
// that runs every task.
func (p Policy) All() Set {
	return All(p.Count())
}
