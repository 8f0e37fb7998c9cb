//go:build race

package integration

// raceEnabled says that the tests run with -race, and so does the worker
// binary they build.
const raceEnabled = true
