package main

import (
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"time"
)

type metric struct {
	unit  string
	value float64
}

// line is one benchmark result: a Go benchmark line.
type line struct {
	name, system, settings string
	n                      int
	elapsed                time.Duration // 0: no ns/op
	metrics                []metric
}

func (l line) key() string {
	k := "Benchmark" + l.name + "/system=" + l.system
	if l.settings != "" {
		k += "/settings=" + l.settings
	}
	return k
}

func (l line) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s-%d\t%d", l.key(), runtime.GOMAXPROCS(0), l.n)
	if l.elapsed > 0 {
		fmt.Fprintf(&b, "\t%.1f ns/op", float64(l.elapsed.Nanoseconds())/float64(l.n))
	}
	for _, m := range l.metrics {
		fmt.Fprintf(&b, "\t%.4g %s", m.value, m.unit)
	}
	return b.String()
}

// results collects every line, printing each once.
type results struct {
	lines   []line
	printed int
}

func (r *results) add(name, system, settings string, n int, elapsed time.Duration, unit string, value float64, more ...metric) {
	r.lines = append(r.lines, line{
		name: name, system: system, settings: settings, n: n, elapsed: elapsed,
		metrics: append([]metric{{unit, value}}, more...),
	})
}

func (r *results) flush(w io.Writer) {
	for _, l := range r.lines[r.printed:] {
		fmt.Fprintln(w, l)
	}
	r.printed = len(r.lines)
}

// stat is the median and range of one metric of one benchmark.
type stat struct{ median, lo, hi float64 }

func (r *results) stat(key, unit string) (stat, bool) {
	var vs []float64
	for _, l := range r.lines {
		if l.key() != key {
			continue
		}
		for _, m := range l.metrics {
			if m.unit == unit {
				vs = append(vs, m.value)
			}
		}
	}
	if len(vs) == 0 {
		return stat{}, false
	}
	slices.Sort(vs)
	med := vs[len(vs)/2]
	if len(vs)%2 == 0 {
		med = (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
	}
	return stat{med, vs[0], vs[len(vs)-1]}, true
}

// summary prints every benchmark's medians with their spread, and the
// ratios the targets are stated in.
func (r *results) summary(w io.Writer) {
	var keys []string
	units := map[string][]string{}
	for _, l := range r.lines {
		if !slices.Contains(keys, l.key()) {
			keys = append(keys, l.key())
			for _, m := range l.metrics {
				units[l.key()] = append(units[l.key()], m.unit)
			}
		}
	}
	fmt.Fprintln(w, "\nmedians (min-max) over the runs:")
	for _, k := range keys {
		fmt.Fprintf(w, "  %s\n", strings.TrimPrefix(k, "Benchmark"))
		for _, u := range units[k] {
			s, _ := r.stat(k, u)
			fmt.Fprintf(w, "      %-18s %10.4g  (%.4g-%.4g)\n", u, s.median, s.lo, s.hi)
		}
	}
	fmt.Fprintln(w, "\nflotilla / River (medians), against the targets:")
	ratio := func(what, a, b, unit string, higherBetter bool, target float64) {
		sa, ok1 := r.stat(a, unit)
		sb, ok2 := r.stat(b, unit)
		if !ok1 || !ok2 || sb.median == 0 {
			return
		}
		q := sa.median / sb.median
		met := q >= target
		if !higherBetter {
			q = sb.median / sa.median
			met = q >= target
		}
		switch {
		case target == 0:
			fmt.Fprintf(w, "  %-52s %6.2fx\n", what, q)
		case met:
			fmt.Fprintf(w, "  %-52s %6.2fx  (target >= %.1fx: met)\n", what, q, target)
		default:
			fmt.Fprintf(w, "  %-52s %6.2fx  (target >= %.1fx: MISSED by %.0f%%)\n", what, q, target, 100*(1-q/target))
		}
	}
	ratio("bulk insert vs InsertManyFast", "BenchmarkBulkInsert/system=flotilla", "BenchmarkBulkInsert/system=river", "jobs/s", true, 1.0)
	ratio("bulk insert vs InsertMany", "BenchmarkBulkInsert/system=flotilla", "BenchmarkBulkInsertMany/system=river", "jobs/s", true, 1.0)
	ratio("burn-down, best settings", "BenchmarkBurnDown/system=flotilla/settings=best", "BenchmarkBurnDown/system=river/settings=best", "jobs/s", true, 1.0)
	ratio("burn-down, defaults", "BenchmarkBurnDown/system=flotilla/settings=default", "BenchmarkBurnDown/system=river/settings=default", "jobs/s", true, 5.0)
	ratio("SQLite bulk insert vs InsertMany", "BenchmarkSQLiteBulkInsert/system=flotilla", "BenchmarkSQLiteBulkInsert/system=river", "jobs/s", true, 1.5)
	ratio("SQLite burn-down, best settings", "BenchmarkSQLiteBurnDown/system=flotilla/settings=best", "BenchmarkSQLiteBurnDown/system=river/settings=best", "jobs/s", true, 1.5)
	for _, name := range []string{"StartLatency", "IdlePickup", "Cancel"} {
		for _, unit := range []string{"p50-ms", "p99-ms"} {
			ratio(fmt.Sprintf("%s %s, River default / flotilla", name, unit),
				"Benchmark"+name+"/system=flotilla/settings=default", "Benchmark"+name+"/system=river/settings=default", unit, false, 0)
			ratio(fmt.Sprintf("%s %s, River best / flotilla", name, unit),
				"Benchmark"+name+"/system=flotilla/settings=default", "Benchmark"+name+"/system=river/settings=best", unit, false, 0)
		}
	}
	abs := func(what, key, unit string, limit float64) {
		s, ok := r.stat(key, unit)
		if !ok {
			return
		}
		verdict := "met"
		if s.median > limit {
			verdict = "MISSED"
		}
		fmt.Fprintf(w, "  %-52s %6.2f ms (target <= %.0f ms: %s)\n", what, s.median, limit, verdict)
	}
	abs("flotilla at 1,000/s, p50", "BenchmarkStartLatency/system=flotilla/settings=default", "p50-ms", 5)
	abs("flotilla at 1,000/s, p99", "BenchmarkStartLatency/system=flotilla/settings=default", "p99-ms", 15)
	abs("flotilla idle pickup, p99", "BenchmarkIdlePickup/system=flotilla/settings=default", "p99-ms", 10)
}
