package bucket

import (
	"iter"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// span is an inclusive range of bucket numbers, lo <= hi.
type span struct{ lo, hi int }

// Set is an immutable set of bucket numbers.
//
// A Set is stored as a sorted list of disjoint, non-adjacent ranges, so the
// common ownership lists ("0-31", every bucket of a 65536-bucket fleet) take
// a few words no matter how many buckets they hold. Because the form is
// canonical, two Sets holding the same buckets have identical ranges.
//
// Sets only hold numbers that are a bucket in some fleet: 0 to MaxCount-1.
// The zero Set is empty. Sets are safe to copy and to share between
// goroutines; no method changes a Set after it is built, except
// [Set.UnmarshalText], which replaces the whole value it is called on.
type Set struct {
	spans []span
}

// All returns the set of buckets 0..count-1: every bucket of a fleet with
// count buckets. A count of 0 or less gives the empty set, and a count above
// MaxCount is treated as MaxCount.
func All(count int) Set {
	count = min(count, MaxCount)
	if count <= 0 {
		return Set{}
	}
	return Set{spans: []span{{0, count - 1}}}
}

// Of returns the set holding the given bucket numbers, in any order, with
// repeats counted once. Values that cannot be a bucket in any fleet
// (negative, or MaxCount and above) are left out: Of is meant for literals
// and computed lists, and [ParseSet] is the place that explains bad input.
func Of(buckets ...int) Set {
	values := make([]int, 0, len(buckets))
	for _, b := range buckets {
		if b >= 0 && b < MaxCount {
			values = append(values, b)
		}
	}
	slices.Sort(values)
	var spans []span
	for _, v := range values {
		spans = appendSpan(spans, span{v, v})
	}
	return Set{spans: spans}
}

// appendSpan adds next to spans, which must be sorted and must end before
// next starts or overlap it only at its tail. Touching or overlapping ranges
// are merged, which keeps the canonical form without a separate pass.
func appendSpan(spans []span, next span) []span {
	if n := len(spans); n > 0 && next.lo <= spans[n-1].hi+1 {
		spans[n-1].hi = max(spans[n-1].hi, next.hi)
		return spans
	}
	return append(spans, next)
}

// String returns the canonical form of the set: ascending, comma-separated,
// with every run of two or more consecutive buckets written as "lo-hi" and a
// lone bucket as its number, for example "0-31,40,42-45". The empty set is
// "". For any non-empty Set s, ParseSet(s.String(), 0) returns a set equal to
// s, and the canonical form of a set is unique.
func (s Set) String() string {
	var b []byte
	for i, r := range s.spans {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendSpanText(b, r)
	}
	return string(b)
}

func appendSpanText(b []byte, r span) []byte {
	b = strconv.AppendInt(b, int64(r.lo), 10)
	if r.hi != r.lo {
		b = append(b, '-')
		b = strconv.AppendInt(b, int64(r.hi), 10)
	}
	return b
}

// Contains reports whether bucket b is in the set.
func (s Set) Contains(b int) bool {
	// The first range that does not end before b is the only one that can
	// hold it.
	i := sort.Search(len(s.spans), func(i int) bool { return s.spans[i].hi >= b })
	return i < len(s.spans) && s.spans[i].lo <= b
}

// Len returns the number of buckets in the set.
func (s Set) Len() int {
	n := 0
	for _, r := range s.spans {
		n += r.hi - r.lo + 1
	}
	return n
}

// Empty reports whether the set holds no buckets.
func (s Set) Empty() bool {
	return len(s.spans) == 0
}

// Slice returns the buckets of the set in ascending order, in a new slice
// the caller may keep or change.
func (s Set) Slice() []int {
	out := make([]int, 0, s.Len())
	for _, r := range s.spans {
		for b := r.lo; b <= r.hi; b++ {
			out = append(out, b)
		}
	}
	return out
}

// Ranges yields the set's ranges in ascending order, each as its first and
// last bucket (inclusive): a few pairs however many buckets the set holds.
func (s Set) Ranges() iter.Seq2[int, int] {
	return func(yield func(lo, hi int) bool) {
		for _, r := range s.spans {
			if !yield(r.lo, r.hi) {
				return
			}
		}
	}
}

// Max returns the largest bucket in the set, or -1 if the set is empty.
func (s Set) Max() int {
	if len(s.spans) == 0 {
		return -1
	}
	return s.spans[len(s.spans)-1].hi
}

// Equal reports whether s and other hold the same buckets.
func (s Set) Equal(other Set) bool {
	// The representation is canonical, so equal sets have equal ranges.
	return slices.Equal(s.spans, other.spans)
}

// IsAll reports whether the set holds exactly the buckets 0..count-1, that
// is, every bucket of a fleet with count buckets. A node whose ownership
// IsAll can run any task, including tasks without a key. It is false for a
// count no fleet can have (outside MinCount..MaxCount).
func (s Set) IsAll(count int) bool {
	if count < MinCount || count > MaxCount {
		return false
	}
	return s.Equal(All(count))
}

// Intersect returns the buckets that are in both s and other.
func (s Set) Intersect(other Set) Set {
	var out []span
	a, b := s.spans, other.spans
	for i, j := 0, 0; i < len(a) && j < len(b); {
		lo, hi := max(a[i].lo, b[j].lo), min(a[i].hi, b[j].hi)
		if lo <= hi {
			out = appendSpan(out, span{lo, hi})
		}
		// The range that ends first cannot meet anything further on in
		// the other set.
		if a[i].hi < b[j].hi {
			i++
		} else {
			j++
		}
	}
	return Set{spans: out}
}

// Minus returns the buckets of s that are not in other.
func (s Set) Minus(other Set) Set {
	var out []span
	cut := other.spans
	j := 0
	for _, r := range s.spans {
		lo := r.lo
		// Skip the removed ranges that end before this range starts; they
		// end before every later range too.
		for j < len(cut) && cut[j].hi < lo {
			j++
		}
		k := j
		for k < len(cut) && cut[k].lo <= r.hi {
			if cut[k].lo > lo {
				out = appendSpan(out, span{lo, cut[k].lo - 1})
			}
			lo = max(lo, cut[k].hi+1)
			if cut[k].hi > r.hi {
				// This removed range reaches into the next range of s,
				// so it is looked at again there.
				break
			}
			k++
		}
		if lo <= r.hi {
			out = appendSpan(out, span{lo, r.hi})
		}
		j = k
	}
	return Set{spans: out}
}

// CheckRange reports whether every bucket in the set exists in a fleet with
// count buckets. It is the second half of ParseSet(spec, 0), for flags read
// before the fleet's bucket count is known. A bucket out of range gives a
// *[RangeError] naming the first such bucket; an invalid count gives an error
// matching [ErrInvalidCount].
func (s Set) CheckRange(count int) error {
	if err := checkCount(count); err != nil {
		return err
	}
	if s.Max() < count {
		return nil
	}
	i := sort.Search(len(s.spans), func(i int) bool { return s.spans[i].hi >= count })
	r := s.spans[i]
	return &RangeError{
		Spec:   s.String(),
		Token:  string(appendSpanText(nil, r)),
		Bucket: max(r.lo, count),
		Count:  count,
	}
}

// MarshalText encodes the set as its canonical String, so that it appears in
// JSON and other text formats the way an operator would type it.
func (s Set) MarshalText() ([]byte, error) {
	return []byte(s.String()), nil
}

// UnmarshalText replaces *s with the set written in text, with the bucket
// count not yet known (as ParseSet(text, 0)); check it against the fleet
// with [Set.CheckRange]. Unlike ParseSet, empty or blank text gives the empty
// set, because that is how MarshalText writes it.
func (s *Set) UnmarshalText(text []byte) error {
	spec := string(text)
	if strings.TrimSpace(spec) == "" {
		*s = Set{}
		return nil
	}
	parsed, err := ParseSet(spec, 0)
	if err != nil {
		return err
	}
	*s = parsed
	return nil
}
