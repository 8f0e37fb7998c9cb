//go:build race

package testenv

// RaceEnabled says that this binary was built with -race: a test that builds
// binaries to run builds them with it too, so that they are checked for
// races and reuse the packages the test's own build compiled.
const RaceEnabled = true
