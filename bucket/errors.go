package bucket

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// setExample is the hint appended to every refused set, so that the error
// alone shows the reader what to type instead.
const setExample = "0-31,40,42-45"

// ErrInvalidSet is matched by errors.Is for every refused bucket set: each
// *SetError and each *RangeError.
var ErrInvalidSet = errors.New("invalid bucket set")

// SetError reports a bucket set that cannot be parsed. The message does not
// name a flag or setting; callers add where the set came from.
type SetError struct {
	// Spec is the whole set as given.
	Spec string
	// Token is the offending element, trimmed of surrounding whitespace.
	// It is "" when the offending element, or the whole set, is empty.
	Token string
	// Reason says what is wrong with Token, and names it.
	Reason string
}

func (e *SetError) Error() string {
	if strings.TrimSpace(e.Spec) == "" {
		// Quoting an empty or blank spec back to the reader adds nothing.
		return fmt.Sprintf("%s; give buckets like %q", e.Reason, setExample)
	}
	return fmt.Sprintf("invalid bucket set %q: %s; give buckets like %q", e.Spec, e.Reason, setExample)
}

// Is makes errors.Is(err, ErrInvalidSet) true for every SetError.
func (e *SetError) Is(target error) bool {
	return target == ErrInvalidSet
}

// RangeError reports a bucket that does not exist in the fleet: its number is
// at least the fleet's bucket count.
type RangeError struct {
	// Spec is the whole set as given, or the set's canonical form when the
	// error comes from Set.CheckRange.
	Spec string
	// Token is the element holding the bucket, such as "60-64".
	Token string
	// Bucket is the first bucket of Token that is out of range.
	Bucket int
	// Count is the fleet's bucket count. It is 0 when the count was not
	// known yet, in which case the bound was MaxCount.
	Count int
}

func (e *RangeError) Error() string {
	where := ""
	if e.Token != strconv.Itoa(e.Bucket) {
		where = fmt.Sprintf(" in %q", e.Token)
	}
	var valid string
	switch e.Count {
	case 0:
		valid = fmt.Sprintf("no fleet has more than %d buckets, numbered 0-%d", MaxCount, MaxCount-1)
	case 1:
		valid = "this fleet has 1 bucket, numbered 0"
	default:
		valid = fmt.Sprintf("this fleet has %d buckets, numbered 0-%d", e.Count, e.Count-1)
	}
	return fmt.Sprintf("invalid bucket set %q: bucket %d%s is out of range: %s", e.Spec, e.Bucket, where, valid)
}

// Is makes errors.Is(err, ErrInvalidSet) true for every RangeError.
func (e *RangeError) Is(target error) bool {
	return target == ErrInvalidSet
}

// ErrForeignBucket is matched by errors.Is for every task a node refuses
// because the task may belong to buckets the node does not own: each
// *ForeignBucketError and each *MissingKeyError.
var ErrForeignBucket = errors.New("task is in a bucket this node does not own")

// ForeignBucketError reports a task whose key hashes to a bucket the node
// does not own, so the node must not run or accept it.
type ForeignBucketError struct {
	Key    string
	Bucket int
	Owned  Set
}

func (e *ForeignBucketError) Error() string {
	return fmt.Sprintf("key %q hashes to bucket %d, which this node does not own (it owns %s)",
		e.Key, e.Bucket, describeOwned(e.Owned))
}

// Is makes errors.Is(err, ErrForeignBucket) true for every ForeignBucketError.
func (e *ForeignBucketError) Is(target error) bool {
	return target == ErrForeignBucket
}

// MissingKeyError reports a task without a key on a node that does not own
// every bucket. Such a task has no bucket of its own, so only a node that
// owns all of them can be sure it is the task's owner.
type MissingKeyError struct {
	Owned Set
}

func (e *MissingKeyError) Error() string {
	owns := "only " + describeOwned(e.Owned)
	if e.Owned.Empty() {
		owns = describeOwned(e.Owned)
	}
	return fmt.Sprintf("task has no key, and this node owns %s: give the task a key, or submit it through a node that owns every bucket", owns)
}

// Is makes errors.Is(err, ErrForeignBucket) true for every MissingKeyError.
func (e *MissingKeyError) Is(target error) bool {
	return target == ErrForeignBucket
}

// describeOwned phrases a node's ownership for an error message.
func describeOwned(owned Set) string {
	switch owned.Len() {
	case 0:
		return "no buckets"
	case 1:
		return "bucket " + owned.String()
	default:
		return "buckets " + owned.String()
	}
}
