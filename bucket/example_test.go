package bucket_test

import (
	"errors"
	"fmt"

	"github.com/flotilla-dev/flotilla/bucket"
)

func ExampleParseSet() {
	owned, err := bucket.ParseSet("42-45, 0-31, 40", 64)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(owned)
	fmt.Println(owned.Len(), "buckets")
	fmt.Println(owned.Contains(40), owned.Contains(41))
	// Output:
	// 0-31,40,42-45
	// 37 buckets
	// true false
}

func ExampleParseSet_refused() {
	for _, spec := range []string{"1,,2", "5-3", "1-5,3", "60-64", ""} {
		_, err := bucket.ParseSet(spec, 64)
		fmt.Println(err)
	}
	// Output:
	// invalid bucket set "1,,2": element 2 is empty (two commas in a row); give buckets like "0-31,40,42-45"
	// invalid bucket set "5-3": range "5-3" runs backwards; write it as "3-5"; give buckets like "0-31,40,42-45"
	// invalid bucket set "1-5,3": "3" overlaps "1-5" (bucket 3 is in both); give buckets like "0-31,40,42-45"
	// invalid bucket set "60-64": bucket 64 in "60-64" is out of range: this fleet has 64 buckets, numbered 0-63
	// bucket set is empty; give buckets like "0-31,40,42-45"
}

// A flag can be read before the fleet's bucket count is known, and checked
// against it later.
func ExampleSet_CheckRange() {
	owned, err := bucket.ParseSet("0-99", 0)
	if err != nil {
		fmt.Println(err)
		return
	}
	err = owned.CheckRange(64)
	var rangeErr *bucket.RangeError
	if errors.As(err, &rangeErr) {
		fmt.Println("first missing bucket:", rangeErr.Bucket)
	}
	fmt.Println(err)
	// Output:
	// first missing bucket: 64
	// invalid bucket set "0-99": bucket 64 in "0-99" is out of range: this fleet has 64 buckets, numbered 0-63
}

func ExamplePolicy_Of() {
	policy, err := bucket.NewPolicy(64)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, key := range []string{"tenant-1", "order:42", "日本"} {
		fmt.Printf("%s -> %d\n", key, policy.Of(key))
	}
	// Output:
	// tenant-1 -> 22
	// order:42 -> 52
	// 日本 -> 43
}

func ExampleSet_String() {
	fmt.Println(bucket.Of(40, 0, 1, 2, 3, 5, 7, 8))
	fmt.Printf("%q\n", bucket.Of())
	// Output:
	// 0-3,5,7-8,40
	// ""
}

func ExampleSet_Minus() {
	all := bucket.All(64)
	owned, _ := bucket.ParseSet("0-31,40", 64)
	fmt.Println("unowned:", all.Minus(owned))
	// Output:
	// unowned: 32-39,41-63
}

func ExampleForeignBucketError() {
	policy, _ := bucket.NewPolicy(64)
	owned, _ := bucket.ParseSet("0-31", 64)
	key := "tenant-7"
	if b := policy.Of(key); !owned.Contains(b) {
		err := &bucket.ForeignBucketError{Key: key, Bucket: b, Owned: owned}
		fmt.Println(err)
		fmt.Println(errors.Is(err, bucket.ErrForeignBucket))
	}
	// Output:
	// key "tenant-7" hashes to bucket 63, which this node does not own (it owns buckets 0-31)
	// true
}
