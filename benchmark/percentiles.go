package benchmark

import (
	"slices"
	"time"
)

// Percentiles summarises a set of latencies.
type Percentiles struct {
	N             int
	P50, P90, P99 time.Duration
	Max           time.Duration
}

// PercentilesOf computes the percentiles of samples (nearest rank, lower).
// samples is sorted in place.
func PercentilesOf(samples []time.Duration) Percentiles {
	if len(samples) == 0 {
		return Percentiles{}
	}
	slices.Sort(samples)
	at := func(q float64) time.Duration { return samples[int(q*float64(len(samples)-1))] }
	return Percentiles{N: len(samples), P50: at(0.50), P90: at(0.90), P99: at(0.99), Max: samples[len(samples)-1]}
}

// Millis renders a duration in milliseconds, for reports.
func Millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// PerSecond is n over d.
func PerSecond(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}
