// Package bench holds flotilla's side-by-side comparison with River, in a
// module of its own so that the main module never depends on River. The
// comparison itself is the command in cmd/compare:
//
//	go run ./cmd/compare -runs 3 > compare.txt
//	benchstat compare.txt
//
// It runs the workloads of package benchmark for both systems on the same
// PostgreSQL server, one after the other within each run, each in a fresh
// database.
package bench
