package bucket_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/flotilla-dev/flotilla/bucket"
)

// hashVector is a key with its hash and buckets, computed once and fixed
// here: if any of them changes, every deployed fleet would route keys
// differently, so a change is a breaking change, never a test to update.
type hashVector struct {
	key string
	// display is how docs/bucket-vectors.md shows the key.
	display   string
	xxhash64  uint64
	bucket64  int
	bucket1k  int
	bucket64k int
}

var hashVectors = []hashVector{
	{"", `""`, 0xef46db3751d8e999, 25, 409, 59801},
	{"a", `"a"`, 0xd24ec4f1a98c6e5b, 27, 603, 28251},
	{"abc", `"abc"`, 0x44bc2cf5ad770999, 25, 409, 2457},
	{"tenant-1", `"tenant-1"`, 0xe5af04048faa8656, 22, 598, 34390},
	{"tenant-7", `"tenant-7"`, 0xbbca4da734d085ff, 63, 511, 34303},
	{"order:42", `"order:42"`, 0xaa1f6214e0a40ff4, 52, 1012, 4084},
	{"user/1001", `"user/1001"`, 0xdb4b3d540fcaa2a8, 40, 680, 41640},
	{"日本", `"日本"`, 0x80c2e40b8486afab, 43, 939, 44971},
	{"café", `"café"`, 0x9a40a9b974d85a6a, 42, 618, 23146},
	{"🚀", `"🚀"`, 0x9c2eef218fef6af5, 53, 757, 27381},
	{"hello world", `"hello world"`, 0x45ab6734b21e6968, 40, 360, 26984},
	{"The quick brown fox jumps over the lazy dog", `"The quick brown fox jumps over the lazy dog"`, 0x0b242d361fda71bc, 60, 444, 29116},
	{strings.Repeat("x", 100), `"x"` + " repeated 100 times", 0x92f0de5a88a3c094, 20, 148, 49300},
	{strings.Repeat("0123456789", 26), `"0123456789"` + " repeated 26 times", 0xd243c137d7b40c98, 24, 152, 3224},
}

func mustPolicy(t testing.TB, count int) bucket.Policy {
	t.Helper()
	p, err := bucket.NewPolicy(count)
	if err != nil {
		t.Fatalf("NewPolicy(%d): %v", count, err)
	}
	return p
}

func TestPolicyOfMatchesVectors(t *testing.T) {
	p64, p1k, p64k := mustPolicy(t, 64), mustPolicy(t, 1024), mustPolicy(t, 65536)
	for _, v := range hashVectors {
		t.Run(v.display, func(t *testing.T) {
			if got := xxhash.Sum64String(v.key); got != v.xxhash64 {
				t.Errorf("xxhash64(%q) = %016x, want %016x", v.key, got, v.xxhash64)
			}
			if got := p64.Of(v.key); got != v.bucket64 {
				t.Errorf("Of(%q) with 64 buckets = %d, want %d", v.key, got, v.bucket64)
			}
			if got := p1k.Of(v.key); got != v.bucket1k {
				t.Errorf("Of(%q) with 1024 buckets = %d, want %d", v.key, got, v.bucket1k)
			}
			if got := p64k.Of(v.key); got != v.bucket64k {
				t.Errorf("Of(%q) with 65536 buckets = %d, want %d", v.key, got, v.bucket64k)
			}
		})
	}
}

// The vectors are published for implementations in other languages, so the
// published copy must not drift from the one tested here.
func TestVectorsDocMatchesTable(t *testing.T) {
	doc, err := os.ReadFile("../docs/bucket-vectors.md")
	if err != nil {
		t.Fatalf("reading the published vectors: %v", err)
	}
	for _, v := range hashVectors {
		row := fmt.Sprintf("| `%s` | %d | `%016x` | %d | %d | %d |",
			v.display, len(v.key), v.xxhash64, v.bucket64, v.bucket1k, v.bucket64k)
		if !strings.Contains(string(doc), row) {
			t.Errorf("docs/bucket-vectors.md has no row\n%s", row)
		}
	}
}

func TestPolicyOfStaysInRange(t *testing.T) {
	for _, count := range []int{1, 2, 3, 7, 64, 1000, 65536} {
		p := mustPolicy(t, count)
		for i := range 200 {
			key := fmt.Sprintf("key-%d", i)
			if b := p.Of(key); b < 0 || b >= count {
				t.Fatalf("Of(%q) with %d buckets = %d, outside 0-%d", key, count, b, count-1)
			}
		}
	}
}

func TestPolicyWithOneBucketPutsEveryKeyInBucketZero(t *testing.T) {
	p := mustPolicy(t, 1)
	for _, v := range hashVectors {
		if b := p.Of(v.key); b != 0 {
			t.Errorf("Of(%q) = %d, want 0", v.key, b)
		}
	}
}

func TestNewPolicyRefusesCountsOutsideRange(t *testing.T) {
	for _, count := range []int{-1, 0, 65537, 1 << 40} {
		_, err := bucket.NewPolicy(count)
		if err == nil {
			t.Errorf("NewPolicy(%d) succeeded, want an error", count)
			continue
		}
		if !errors.Is(err, bucket.ErrInvalidCount) {
			t.Errorf("NewPolicy(%d): errors.Is(%v, ErrInvalidCount) is false", count, err)
		}
		for _, want := range []string{fmt.Sprint(count), "1", "65536"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("NewPolicy(%d) error %q does not mention %q", count, err, want)
			}
		}
	}
}

func TestNewPolicyAcceptsBounds(t *testing.T) {
	for _, count := range []int{bucket.MinCount, bucket.DefaultCount, bucket.MaxCount} {
		if got := mustPolicy(t, count).Count(); got != count {
			t.Errorf("NewPolicy(%d).Count() = %d", count, got)
		}
	}
}

func TestZeroPolicyIsDefault(t *testing.T) {
	var zero bucket.Policy
	def := mustPolicy(t, bucket.DefaultCount)
	if zero.Count() != bucket.DefaultCount {
		t.Errorf("zero Policy Count() = %d, want %d", zero.Count(), bucket.DefaultCount)
	}
	for _, v := range hashVectors {
		if zero.Of(v.key) != def.Of(v.key) {
			t.Errorf("zero Policy and default Policy disagree on %q", v.key)
		}
	}
	if !zero.All().IsAll(bucket.DefaultCount) {
		t.Errorf("zero Policy All() = %q", zero.All())
	}
}

func TestPolicyAll(t *testing.T) {
	all := mustPolicy(t, 64).All()
	if got := all.String(); got != "0-63" {
		t.Errorf("All() = %q, want \"0-63\"", got)
	}
	if all.Len() != 64 || !all.IsAll(64) {
		t.Errorf("All() = %q, Len %d, IsAll(64) %v", all, all.Len(), all.IsAll(64))
	}
}

func TestForeignBucketError(t *testing.T) {
	owned, _ := bucket.ParseSet("0-31", 64)
	var err error = &bucket.ForeignBucketError{Key: "tenant-7", Bucket: 63, Owned: owned}
	want := `key "tenant-7" hashes to bucket 63, which this node does not own (it owns buckets 0-31)`
	if err.Error() != want {
		t.Errorf("Error() =\n%s\nwant\n%s", err, want)
	}
	if !errors.Is(err, bucket.ErrForeignBucket) {
		t.Error("errors.Is(ForeignBucketError, ErrForeignBucket) is false")
	}
	if errors.Is(err, bucket.ErrInvalidSet) {
		t.Error("errors.Is(ForeignBucketError, ErrInvalidSet) is true")
	}
	wrapped := fmt.Errorf("submit: %w", err)
	var foreign *bucket.ForeignBucketError
	if !errors.As(wrapped, &foreign) || foreign.Bucket != 63 {
		t.Errorf("errors.As through a wrap gave %+v", foreign)
	}
}

func TestMissingKeyError(t *testing.T) {
	tests := []struct {
		owned bucket.Set
		want  string
	}{
		{bucket.Of(0, 1, 2, 3), "task has no key, and this node owns only buckets 0-3: give the task a key, or submit it through a node that owns every bucket"},
		{bucket.Of(5), "task has no key, and this node owns only bucket 5: give the task a key, or submit it through a node that owns every bucket"},
		{bucket.Set{}, "task has no key, and this node owns no buckets: give the task a key, or submit it through a node that owns every bucket"},
	}
	for _, tt := range tests {
		var err error = &bucket.MissingKeyError{Owned: tt.owned}
		if err.Error() != tt.want {
			t.Errorf("Error() =\n%s\nwant\n%s", err, tt.want)
		}
		if !errors.Is(fmt.Errorf("submit: %w", err), bucket.ErrForeignBucket) {
			t.Error("errors.Is(MissingKeyError, ErrForeignBucket) is false")
		}
	}
}

func BenchmarkPolicyOf(b *testing.B) {
	p := mustPolicy(b, bucket.DefaultCount)
	for b.Loop() {
		p.Of("tenant-1")
	}
}
