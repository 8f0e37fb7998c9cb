// Package bucket is the bucket arithmetic of flotilla.
//
// # Buckets
//
// Every task has a key, and every key belongs to exactly one of a fixed
// number N of buckets. Buckets are how work is divided between worker
// processes: each worker declares the buckets it owns, and only runs tasks
// whose keys fall into them. Tasks with the same key always land in the same
// bucket, so they are always handled by the same owner.
//
// # The hash
//
// A key's bucket is
//
//	xxhash64(key) mod N
//
// where xxhash64 is XXH64 with seed 0 (as computed by
// github.com/cespare/xxhash/v2's Sum64String) over the key's UTF-8 bytes, and
// the modulo is taken on the unsigned 64-bit hash. The key is hashed exactly
// as given: no trimming, case folding or Unicode normalisation. Test vectors
// for other implementations are in docs/bucket-vectors.md.
//
// N is fixed for a fleet. Changing it moves nearly every key to a different
// bucket, which would hand in-flight tasks to owners that do not expect them;
// a fleet that needs a different N has to be migrated, not reconfigured.
// N is between [MinCount] and [MaxCount]; [DefaultCount] is used when nothing
// else is configured. A [Policy] carries N and maps keys to buckets.
//
// # Sets of buckets
//
// A [Set] is an immutable set of bucket numbers, written as a comma-separated
// list of single buckets and inclusive ranges:
//
//	0-31,40,42-45
//
// Whitespace around each element is ignored ("0-3, 5"); elements may come in
// any order but may not overlap or repeat. Bucket numbers are plain decimal
// digits, numbered from 0 to N-1. [ParseSet] reads this syntax and explains
// every refusal with a *[SetError] or *[RangeError]; [Set.String] writes the
// canonical form, which ParseSet reads back to an equal set.
package bucket
