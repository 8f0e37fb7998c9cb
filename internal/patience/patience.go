// Package patience scales how long tests wait for a condition to the
// machine they run on.
//
// A test's deadline for an outcome (a node holds its buckets, a task ends)
// bounds how long a failing run takes to say so; a passing run waits only
// as long as the outcome needs. On a quiet machine a few seconds would do;
// on a loaded 2-core machine, under the race detector and beside other
// builds, the same outcome can take many times longer. So every wait of the
// suite goes through [Scale]: the deadline written in the test is for an
// unloaded machine of two cores, and is stretched by the load the machine
// shows when the wait begins, or by the factor FLOTILLA_TEST_PATIENCE
// gives.
//
// Only deadlines scale. A duration that is part of the scenario (a lease
// TTL, how long a partition lasts) must not: it is what the test is about.
package patience

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// EnvFactor names the environment variable that fixes the factor every
// deadline is multiplied by (a number at least 1, e.g. 3). Unset, the
// factor follows the machine's load.
const EnvFactor = "FLOTILLA_TEST_PATIENCE"

// MaxLoadFactor bounds the factor the load alone can give, so that a
// machine that is stuck (load in the hundreds) still fails a test in
// reasonable time.
const MaxLoadFactor = 6

// loadavgPath is where Linux publishes the load average.
const loadavgPath = "/proc/loadavg"

// Scale returns d stretched for this machine now: d times [Factor].
func Scale(d time.Duration) time.Duration {
	return time.Duration(float64(d) * Factor())
}

// Factor is the multiplier deadlines get: FLOTILLA_TEST_PATIENCE when set
// to a valid number, and otherwise the one-minute load average per CPU
// (a load of 6 on 2 CPUs gives 3), at least 1 and at most MaxLoadFactor. A value
// of FLOTILLA_TEST_PATIENCE that is not a number of at least 1 panics, so
// that a typo is not silently ignored.
func Factor() float64 {
	if v := os.Getenv(EnvFactor); v != "" {
		f, err := parseFactor(v)
		if err != nil {
			panic(err)
		}
		return f
	}
	return loadFactor(readLoad(), runtime.NumCPU())
}

func parseFactor(v string) (float64, error) {
	f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil || f < 1 || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, fmt.Errorf("patience: %s=%q: want a number of at least 1 (e.g. 3)", EnvFactor, v)
	}
	return f, nil
}

// loadFactor turns a one-minute load average into a factor: 1 up to one
// runnable process per CPU, then the load per CPU.
func loadFactor(load float64, cpus int) float64 {
	if cpus < 1 {
		cpus = 1
	}
	f := load / float64(cpus)
	if f < 1 || math.IsNaN(f) {
		return 1
	}
	return min(f, MaxLoadFactor)
}

// readLoad returns the one-minute load average, or 0 where it cannot be
// read (then deadlines are not stretched).
func readLoad() float64 {
	b, err := os.ReadFile(loadavgPath)
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(b), " ")
	load, err := strconv.ParseFloat(first, 64)
	if err != nil {
		return 0
	}
	return load
}
