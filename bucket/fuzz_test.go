package bucket_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/flotilla-dev/flotilla/bucket"
)

// fuzzCount maps any fuzzed number onto 0..MaxCount, so that both "count not
// known yet" (0) and every real fleet size are explored.
func fuzzCount(raw uint32) int {
	return int(raw % (bucket.MaxCount + 1))
}

func FuzzParseSet(f *testing.F) {
	seeds := []struct {
		spec  string
		count uint32
	}{
		{"0-31,40,42-45", 64},
		{"0-3, 5", 64},
		{"42-45,0-31,40", 0},
		{"0-65535", 65536},
		{"65535", 0},
		{"", 64},
		{" ", 64},
		{"1,,2", 64},
		{"1,", 64},
		{"a", 64},
		{"1.5", 64},
		{"1-", 64},
		{"-", 64},
		{"1-2-3", 64},
		{"-1", 64},
		{"60-64", 64},
		{"5-3", 64},
		{"1-5,3", 64},
		{"2,2", 64},
		{"0-3,4-7", 64},
		{"007", 1},
		{"99999999999999999999", 0},
		{"\t1 ,\n2 , 3\t", 64},
	}
	for _, s := range seeds {
		f.Add(s.spec, s.count)
	}
	f.Fuzz(func(t *testing.T, spec string, rawCount uint32) {
		count := fuzzCount(rawCount)
		s, err := bucket.ParseSet(spec, count)
		if err != nil {
			if !errors.Is(err, bucket.ErrInvalidSet) {
				t.Fatalf("ParseSet(%q, %d) error %v does not match ErrInvalidSet", spec, count, err)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("ParseSet(%q, %d) error spans several lines: %q", spec, count, err)
			}
			if !s.Empty() {
				t.Fatalf("ParseSet(%q, %d) returned %q along with an error", spec, count, s)
			}
			return
		}
		if s.Empty() {
			t.Fatalf("ParseSet(%q, %d) accepted an empty set", spec, count)
		}
		if count > 0 {
			if s.Max() >= count {
				t.Fatalf("ParseSet(%q, %d) = %q holds a bucket beyond the count", spec, count, s)
			}
			if err := s.CheckRange(count); err != nil {
				t.Fatalf("ParseSet(%q, %d) = %q, but CheckRange refuses it: %v", spec, count, s, err)
			}
		}
		canonical := s.String()
		again, err := bucket.ParseSet(canonical, count)
		if err != nil {
			t.Fatalf("ParseSet(%q) = %q, which does not parse again: %v", spec, canonical, err)
		}
		if !again.Equal(s) || again.String() != canonical {
			t.Fatalf("ParseSet(%q) = %q, which parses again as %q", spec, canonical, again)
		}
		if again.Len() != s.Len() {
			t.Fatalf("Len of %q changed from %d to %d after a round trip", canonical, s.Len(), again.Len())
		}
	})
}

// FuzzSetRoundTrip builds a set from fuzzed bucket numbers (two bytes each)
// and checks it against a plain map, and its text form against ParseSet.
func FuzzSetRoundTrip(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 0})
	f.Add([]byte{0, 0, 1, 0, 2, 0, 5, 0})
	f.Add([]byte{0xff, 0xff, 0, 0, 0xfe, 0xff})
	f.Add([]byte{3, 0, 3, 0, 4, 0, 9, 1, 7})
	f.Fuzz(func(t *testing.T, data []byte) {
		var values []int
		for i := 0; i+1 < len(data); i += 2 {
			values = append(values, int(data[i])|int(data[i+1])<<8)
		}
		// Split the values between two sets to check Intersect and Minus.
		half := len(values) / 2
		a, b := bucket.Of(values[:half]...), bucket.Of(values[half:]...)
		inA, inB := map[int]bool{}, map[int]bool{}
		for _, v := range values[:half] {
			inA[v] = true
		}
		for _, v := range values[half:] {
			inB[v] = true
		}

		checkAgainst(t, "a", a, inA)
		checkAgainst(t, "b", b, inB)
		both, onlyA := map[int]bool{}, map[int]bool{}
		for v := range inA {
			if inB[v] {
				both[v] = true
			} else {
				onlyA[v] = true
			}
		}
		checkAgainst(t, "a ∩ b", a.Intersect(b), both)
		checkAgainst(t, "a − b", a.Minus(b), onlyA)

		for _, s := range []bucket.Set{a, b} {
			text, err := s.MarshalText()
			if err != nil {
				t.Fatal(err)
			}
			var back bucket.Set
			if err := back.UnmarshalText(text); err != nil {
				t.Fatalf("UnmarshalText(%q): %v", text, err)
			}
			if !back.Equal(s) || back.String() != s.String() {
				t.Fatalf("%q read back as %q", s, back)
			}
		}
	})
}

// checkAgainst compares a Set with the map of buckets it should hold.
func checkAgainst(t *testing.T, name string, s bucket.Set, want map[int]bool) {
	t.Helper()
	if s.Len() != len(want) {
		t.Fatalf("%s = %q has Len %d, want %d", name, s, s.Len(), len(want))
	}
	if s.Empty() != (len(want) == 0) {
		t.Fatalf("%s = %q: Empty is %v", name, s, s.Empty())
	}
	prev := -1
	for _, v := range s.Slice() {
		if v <= prev {
			t.Fatalf("%s.Slice() is not strictly ascending at %d", name, v)
		}
		if !want[v] {
			t.Fatalf("%s.Slice() holds %d, which was never added", name, v)
		}
		prev = v
	}
	if s.Max() != prev {
		t.Fatalf("%s.Max() = %d, want %d", name, s.Max(), prev)
	}
	for v := range want {
		if !s.Contains(v) {
			t.Fatalf("%s = %q does not contain %d", name, s, v)
		}
	}
}
