package bucket_test

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/flotilla-dev/flotilla/bucket"
)

func mustParse(t testing.TB, spec string, count int) bucket.Set {
	t.Helper()
	s, err := bucket.ParseSet(spec, count)
	if err != nil {
		t.Fatalf("ParseSet(%q, %d): %v", spec, count, err)
	}
	return s
}

func TestParseSetAccepts(t *testing.T) {
	tests := []struct {
		spec  string
		count int
		want  string // canonical form
		len   int
	}{
		{"0-31,40,42-45", 64, "0-31,40,42-45", 37},
		{"0-3, 5", 64, "0-3,5", 5},
		{"  7  ", 64, "7", 1},
		{"\t1 ,\n2 , 3\t", 64, "1-3", 3},
		{"42-45,0-31,40", 64, "0-31,40,42-45", 37},
		{"0-3,4-7", 64, "0-7", 8},
		{"3,2,1,0", 64, "0-3", 4},
		{"5-5", 64, "5", 1},
		{"4,5", 64, "4-5", 2},
		{"007", 64, "7", 1},
		{"0-63", 64, "0-63", 64},
		{"0", 1, "0", 1},
		{"0-65535", 65536, "0-65535", 65536},
		// Count 0 leaves the upper bound for CheckRange.
		{"1000-2000", 0, "1000-2000", 1001},
		{"65535", 0, "65535", 1},
	}
	for _, tt := range tests {
		s := mustParse(t, tt.spec, tt.count)
		if got := s.String(); got != tt.want {
			t.Errorf("ParseSet(%q, %d) = %q, want %q", tt.spec, tt.count, got, tt.want)
		}
		if got := s.Len(); got != tt.len {
			t.Errorf("ParseSet(%q, %d).Len() = %d, want %d", tt.spec, tt.count, got, tt.len)
		}
	}
}

func TestParseSetRefuses(t *testing.T) {
	tests := []struct {
		name  string
		spec  string
		count int
		// mentions are strings the message must contain: the offending
		// element, or for an empty element, its position.
		mentions []string
		// rangeErr is set when the refusal is a *RangeError.
		rangeErr *bucket.RangeError
	}{
		{name: "empty", spec: "", count: 64, mentions: []string{"bucket set is empty", `give buckets like "0-31,40,42-45"`}},
		{name: "blank", spec: " \t ", count: 64, mentions: []string{"bucket set is empty"}},
		{name: "two commas", spec: "1,,2", count: 64, mentions: []string{`"1,,2"`, "element 2 is empty", "two commas in a row"}},
		{name: "trailing comma", spec: "1,2,", count: 64, mentions: []string{"element 3 is empty", "ends with a comma"}},
		{name: "leading comma", spec: ",1", count: 64, mentions: []string{"element 1 is empty", "starts with a comma"}},
		{name: "blank element", spec: "1, ,2", count: 64, mentions: []string{"element 2 is empty"}},
		{name: "only commas", spec: ",", count: 64, mentions: []string{"element 1 is empty"}},
		{name: "letter", spec: "a", count: 64, mentions: []string{`"a" is not a bucket number`}},
		{name: "letter among numbers", spec: "0-3, x7 ,9", count: 64, mentions: []string{`"x7"`}},
		{name: "fraction", spec: "1.5", count: 64, mentions: []string{`"1.5"`}},
		{name: "plus sign", spec: "+1", count: 64, mentions: []string{`"+1"`}},
		{name: "hex", spec: "0x10", count: 64, mentions: []string{`"0x10"`}},
		{name: "space inside", spec: "1 2", count: 64, mentions: []string{`"1 2" has a space inside it`}},
		{name: "space around dash", spec: "0 - 31", count: 64, mentions: []string{`"0 - 31" has a space inside it`}},
		{name: "no upper end", spec: "1-", count: 64, mentions: []string{`"1-"`, "no upper end"}},
		{name: "no lower end", spec: "-", count: 64, mentions: []string{`"-"`}},
		{name: "three parts", spec: "1-2-3", count: 64, mentions: []string{`"1-2-3"`, "more than one"}},
		{name: "letter range", spec: "a-b", count: 64, mentions: []string{`"a-b"`}},
		{name: "negative", spec: "-1", count: 64, mentions: []string{`"-1" is negative`, "numbered from 0"}},
		{name: "negative range start", spec: "-3-5", count: 64, mentions: []string{`"-3-5"`}},
		{name: "huge number", spec: "99999999999999999999999", count: 64, mentions: []string{`"99999999999999999999999"`, "too large"}},
		{name: "reversed", spec: "5-3", count: 64, mentions: []string{`"5-3" runs backwards`, `"3-5"`}},
		{name: "overlap", spec: "1-5,3", count: 64, mentions: []string{`"3" overlaps "1-5"`, "bucket 3"}},
		{name: "overlap written first", spec: "3,1-5", count: 64, mentions: []string{`"1-5" overlaps "3"`}},
		{name: "overlapping ranges", spec: "0-10, 8-20", count: 64, mentions: []string{`"8-20" overlaps "0-10"`, "bucket 8"}},
		{name: "contained far back", spec: "0-40,10,50,20", count: 64, mentions: []string{`"10" overlaps "0-40"`}},
		{name: "duplicate", spec: "2,2", count: 64, mentions: []string{`"2" is listed twice`}},
		{name: "duplicate with spaces", spec: "2, 2", count: 64, mentions: []string{`"2" is listed twice`}},
		{
			name: "end out of range", spec: "60-64", count: 64,
			mentions: []string{`bucket 64 in "60-64" is out of range: this fleet has 64 buckets, numbered 0-63`},
			rangeErr: &bucket.RangeError{Spec: "60-64", Token: "60-64", Bucket: 64, Count: 64},
		},
		{
			name: "single out of range", spec: "0-3,64", count: 64,
			mentions: []string{`invalid bucket set "0-3,64": bucket 64 is out of range`},
			rangeErr: &bucket.RangeError{Spec: "0-3,64", Token: "64", Bucket: 64, Count: 64},
		},
		{
			name: "whole range out", spec: "70-80", count: 64,
			mentions: []string{`bucket 70 in "70-80"`},
			rangeErr: &bucket.RangeError{Spec: "70-80", Token: "70-80", Bucket: 70, Count: 64},
		},
		{
			name: "one bucket fleet", spec: "1", count: 1,
			mentions: []string{"this fleet has 1 bucket, numbered 0"},
			rangeErr: &bucket.RangeError{Spec: "1", Token: "1", Bucket: 1, Count: 1},
		},
		{
			name: "beyond any fleet", spec: "65536", count: 0,
			mentions: []string{"bucket 65536 is out of range", "no fleet has more than 65536 buckets"},
			rangeErr: &bucket.RangeError{Spec: "65536", Token: "65536", Bucket: 65536, Count: 0},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := bucket.ParseSet(tt.spec, tt.count)
			if err == nil {
				t.Fatalf("ParseSet(%q, %d) = %q, want an error", tt.spec, tt.count, s)
			}
			msg := err.Error()
			for _, want := range tt.mentions {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q does not contain %q", msg, want)
				}
			}
			if strings.Contains(msg, "\n") {
				t.Errorf("error %q spans several lines", msg)
			}
			if strings.Contains(msg, "--buckets") {
				t.Errorf("error %q names a flag; that is the caller's job", msg)
			}
			if !errors.Is(err, bucket.ErrInvalidSet) {
				t.Errorf("errors.Is(%q, ErrInvalidSet) is false", msg)
			}
			var rangeErr *bucket.RangeError
			isRange := errors.As(err, &rangeErr)
			var setErr *bucket.SetError
			isSet := errors.As(err, &setErr)
			switch {
			case tt.rangeErr != nil && !isRange:
				t.Errorf("error %q (%T) is not a *RangeError", msg, err)
			case tt.rangeErr != nil && *rangeErr != *tt.rangeErr:
				t.Errorf("RangeError = %+v, want %+v", *rangeErr, *tt.rangeErr)
			case tt.rangeErr == nil && !isSet:
				t.Errorf("error %q (%T) is not a *SetError", msg, err)
			case tt.rangeErr == nil && setErr.Spec != tt.spec:
				t.Errorf("SetError.Spec = %q, want %q", setErr.Spec, tt.spec)
			}
		})
	}
}

func TestSetErrorMessage(t *testing.T) {
	_, err := bucket.ParseSet("1,,2", 64)
	want := `invalid bucket set "1,,2": element 2 is empty (two commas in a row); give buckets like "0-31,40,42-45"`
	if err == nil || err.Error() != want {
		t.Errorf("ParseSet(\"1,,2\") error =\n%v\nwant\n%s", err, want)
	}
	_, err = bucket.ParseSet("  ", 64)
	want = `bucket set is empty; give buckets like "0-31,40,42-45"`
	if err == nil || err.Error() != want {
		t.Errorf("ParseSet(\"  \") error =\n%v\nwant\n%s", err, want)
	}
}

func TestSetErrorToken(t *testing.T) {
	tests := map[string]string{
		"0-3, x7 ,9": "x7",
		"1-5,3":      "3",
		"3,1-5":      "1-5",
		"1,,2":       "",
	}
	for spec, token := range tests {
		_, err := bucket.ParseSet(spec, 64)
		var setErr *bucket.SetError
		if !errors.As(err, &setErr) {
			t.Errorf("ParseSet(%q) error %v is not a *SetError", spec, err)
			continue
		}
		if setErr.Token != token {
			t.Errorf("ParseSet(%q) SetError.Token = %q, want %q", spec, setErr.Token, token)
		}
	}
}

func TestParseSetRefusesBadCount(t *testing.T) {
	for _, count := range []int{-1, 65537} {
		_, err := bucket.ParseSet("0", count)
		if !errors.Is(err, bucket.ErrInvalidCount) {
			t.Errorf("ParseSet(\"0\", %d) error = %v, want ErrInvalidCount", count, err)
		}
	}
}

func TestCheckRange(t *testing.T) {
	s := mustParse(t, "0-31,40,100-200", 0)
	if err := s.CheckRange(201); err != nil {
		t.Errorf("CheckRange(201) = %v", err)
	}
	err := s.CheckRange(64)
	var rangeErr *bucket.RangeError
	if !errors.As(err, &rangeErr) {
		t.Fatalf("CheckRange(64) = %v, want a *RangeError", err)
	}
	want := bucket.RangeError{Spec: "0-31,40,100-200", Token: "100-200", Bucket: 100, Count: 64}
	if *rangeErr != want {
		t.Errorf("CheckRange(64) = %+v, want %+v", *rangeErr, want)
	}
	if !errors.Is(err, bucket.ErrInvalidSet) {
		t.Error("errors.Is(CheckRange error, ErrInvalidSet) is false")
	}
	err = s.CheckRange(150)
	if !errors.As(err, &rangeErr) || rangeErr.Bucket != 150 || rangeErr.Token != "100-200" {
		t.Errorf("CheckRange(150) = %v, want bucket 150 in \"100-200\"", err)
	}
	if err := s.CheckRange(0); !errors.Is(err, bucket.ErrInvalidCount) {
		t.Errorf("CheckRange(0) = %v, want ErrInvalidCount", err)
	}
	if err := (bucket.Set{}).CheckRange(1); err != nil {
		t.Errorf("empty set CheckRange(1) = %v", err)
	}
}

// Parsing with the count known and parsing first, checking later, must agree.
func TestParseThenCheckRangeMatchesParseWithCount(t *testing.T) {
	for _, spec := range []string{"0-63", "0-64", "63", "64,1", "10-20,30", "1000"} {
		for _, count := range []int{1, 63, 64, 65, 1024} {
			_, direct := bucket.ParseSet(spec, count)
			s, err := bucket.ParseSet(spec, 0)
			if err == nil {
				err = s.CheckRange(count)
			}
			if (direct == nil) != (err == nil) {
				t.Errorf("spec %q count %d: ParseSet gave %v, ParseSet+CheckRange gave %v", spec, count, direct, err)
			}
		}
	}
}

func TestStringIsCanonical(t *testing.T) {
	tests := []struct {
		set  bucket.Set
		want string
	}{
		{bucket.Set{}, ""},
		{bucket.Of(), ""},
		{bucket.Of(5), "5"},
		{bucket.Of(4, 5), "4-5"},
		{bucket.Of(0, 1, 2, 3, 5, 7, 8, 40), "0-3,5,7-8,40"},
		{bucket.Of(40, 8, 7, 5, 3, 2, 1, 0, 3, 3), "0-3,5,7-8,40"},
		{bucket.Of(-1, 0, 65535, 65536), "0,65535"},
		{bucket.All(64), "0-63"},
		{bucket.All(1), "0"},
	}
	for _, tt := range tests {
		got := tt.set.String()
		if got != tt.want {
			t.Errorf("String() = %q, want %q", got, tt.want)
		}
		if got == "" {
			continue
		}
		back := mustParse(t, got, 0)
		if !back.Equal(tt.set) || back.String() != got {
			t.Errorf("ParseSet(%q) = %q, not equal to the original", got, back)
		}
	}
}

func TestAll(t *testing.T) {
	for _, count := range []int{1, 2, 64, 65536} {
		all := bucket.All(count)
		if all.Len() != count || !all.IsAll(count) || all.Max() != count-1 {
			t.Errorf("All(%d) = %q, Len %d, Max %d", count, all, all.Len(), all.Max())
		}
		if !all.Contains(0) || !all.Contains(count-1) || all.Contains(count) || all.Contains(-1) {
			t.Errorf("All(%d) Contains is wrong at the edges", count)
		}
		if all.IsAll(count+1) || (count > 1 && all.IsAll(count-1)) {
			t.Errorf("All(%d).IsAll accepts another count", count)
		}
	}
	if !bucket.All(0).Empty() || !bucket.All(-5).Empty() {
		t.Error("All of a non-positive count is not empty")
	}
	if bucket.All(1<<20).Len() != bucket.MaxCount {
		t.Error("All does not stop at MaxCount")
	}
}

func TestIsAllRequiresEveryBucket(t *testing.T) {
	if mustParse(t, "0-31,33-63", 64).IsAll(64) {
		t.Error("a set missing bucket 32 IsAll(64)")
	}
	if !mustParse(t, "32-63,0-31", 64).IsAll(64) {
		t.Error("0-31 and 32-63 together are not IsAll(64)")
	}
	if (bucket.Set{}).IsAll(64) {
		t.Error("the empty set IsAll(64)")
	}
}

func TestContainsLenSliceMax(t *testing.T) {
	s := mustParse(t, "0-3,10,20-22", 64)
	want := []int{0, 1, 2, 3, 10, 20, 21, 22}
	if got := s.Slice(); !slices.Equal(got, want) {
		t.Errorf("Slice() = %v, want %v", got, want)
	}
	if s.Len() != len(want) {
		t.Errorf("Len() = %d, want %d", s.Len(), len(want))
	}
	if s.Max() != 22 {
		t.Errorf("Max() = %d, want 22", s.Max())
	}
	for b := -2; b < 30; b++ {
		if got := s.Contains(b); got != slices.Contains(want, b) {
			t.Errorf("Contains(%d) = %v", b, got)
		}
	}
	// Slice hands out a copy: changing it must not change the set.
	got := s.Slice()
	got[0] = 99
	if s.Contains(99) || !s.Contains(0) {
		t.Error("changing the result of Slice changed the set")
	}

	var empty bucket.Set
	if !empty.Empty() || empty.Len() != 0 || empty.Max() != -1 || len(empty.Slice()) != 0 || empty.Contains(0) {
		t.Error("the zero Set is not empty")
	}
	if s.Empty() {
		t.Error("a non-empty set is Empty")
	}
}

func TestEqual(t *testing.T) {
	a := mustParse(t, "0-3,5", 64)
	if !a.Equal(bucket.Of(5, 3, 2, 1, 0)) {
		t.Error("the same buckets built differently are not Equal")
	}
	if a.Equal(mustParse(t, "0-3", 64)) || a.Equal(mustParse(t, "0-3,6", 64)) || a.Equal(bucket.Set{}) {
		t.Error("different sets are Equal")
	}
	if !(bucket.Set{}).Equal(bucket.Of()) {
		t.Error("two empty sets are not Equal")
	}
}

func TestIntersectAndMinus(t *testing.T) {
	tests := []struct {
		a, b, intersect, minus string
	}{
		{"0-31", "16-47", "16-31", "0-15"},
		{"0-31", "0-31", "0-31", ""},
		{"0-31", "40-50", "", "0-31"},
		{"0-63", "10,20-29,40", "10,20-29,40", "0-9,11-19,30-39,41-63"},
		{"0-9,20-29", "5-24", "5-9,20-24", "0-4,25-29"},
		{"0-9,20-29,40-49", "5-44", "5-9,20-29,40-44", "0-4,45-49"},
		{"1,3,5,7", "0-10", "1,3,5,7", ""},
		{"5", "5", "5", ""},
		{"", "0-10", "", ""},
		{"0-10", "", "", "0-10"},
	}
	parse := func(spec string) bucket.Set {
		if spec == "" {
			return bucket.Set{}
		}
		return mustParse(t, spec, 64)
	}
	for _, tt := range tests {
		a, b := parse(tt.a), parse(tt.b)
		if got := a.Intersect(b).String(); got != tt.intersect {
			t.Errorf("%q Intersect %q = %q, want %q", tt.a, tt.b, got, tt.intersect)
		}
		if got := b.Intersect(a).String(); got != tt.intersect {
			t.Errorf("%q Intersect %q = %q, want %q", tt.b, tt.a, got, tt.intersect)
		}
		if got := a.Minus(b).String(); got != tt.minus {
			t.Errorf("%q Minus %q = %q, want %q", tt.a, tt.b, got, tt.minus)
		}
		// Neither operation may change its operands.
		if a.String() != tt.a || b.String() != tt.b {
			t.Errorf("operands changed to %q and %q", a, b)
		}
	}
}

func TestJSON(t *testing.T) {
	type config struct {
		Owned bucket.Set `json:"owned"`
	}
	in := config{Owned: mustParse(t, "42-45, 0-31,40", 64)}
	data, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"owned":"0-31,40,42-45"}`; string(data) != want {
		t.Errorf("Marshal = %s, want %s", data, want)
	}
	var out config
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	if !out.Owned.Equal(in.Owned) {
		t.Errorf("round trip gave %q, want %q", out.Owned, in.Owned)
	}

	// The empty set is written as "" and must read back as empty.
	data, err = json.Marshal(config{})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"owned":""}`; string(data) != want {
		t.Errorf("Marshal of empty set = %s, want %s", data, want)
	}
	out = config{Owned: bucket.Of(1)}
	if err := json.Unmarshal(data, &out); err != nil || !out.Owned.Empty() {
		t.Errorf("Unmarshal of empty set = %q, %v", out.Owned, err)
	}

	// Unmarshalling leaves the bucket count for CheckRange.
	if err := json.Unmarshal([]byte(`{"owned":"0-100"}`), &out); err != nil {
		t.Errorf("Unmarshal of 0-100 = %v", err)
	}
	err = json.Unmarshal([]byte(`{"owned":"5-3"}`), &out)
	if !errors.Is(err, bucket.ErrInvalidSet) {
		t.Errorf("Unmarshal of a reversed range = %v, want ErrInvalidSet", err)
	}
}

func TestRangesYieldsEachRangeInOrder(t *testing.T) {
	set := bucket.Of(9, 0, 1, 2, 5, 7, 8)
	var got [][2]int
	for lo, hi := range set.Ranges() {
		got = append(got, [2]int{lo, hi})
	}
	want := [][2]int{{0, 2}, {5, 5}, {7, 9}}
	if !slices.Equal(got, want) {
		t.Errorf("Ranges of %s = %v, want %v", set, got, want)
	}
	for range (bucket.Set{}).Ranges() {
		t.Error("the empty set yielded a range")
	}
	for lo := range set.Ranges() {
		if lo != 0 {
			t.Errorf("stopping after the first range still yielded %d", lo)
		}
		break
	}
}
