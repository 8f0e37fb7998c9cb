// Command charts redraws the benchmark charts of docs/benchmarks.md from
// their saved data: every data file of -data (the comparison with River
// that cmd/compare -charts saves, and the curves other benchmarks save) is
// drawn as SVG into -out.
//
//	go run ./cmd/charts -data ../docs/charts/data -out ../docs/charts
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/flotilla-dev/flotilla/bench/charts"
)

func main() {
	data := flag.String("data", "../docs/charts/data", "directory of the data files")
	out := flag.String("out", "../docs/charts", "directory the SVG files are written to")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "charts: unexpected argument %q: the only inputs are -data and -out\n", flag.Arg(0))
		os.Exit(2)
	}
	for name, dir := range map[string]string{"data": *data, "out": *out} {
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			fmt.Fprintf(os.Stderr, "charts: -%s %q: it must be an existing directory\n", name, dir)
			os.Exit(2)
		}
	}
	written, err := charts.Render(*data, *out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "charts:", err)
		os.Exit(1)
	}
	if len(written) == 0 {
		fmt.Fprintf(os.Stderr, "charts: no data in %s: nothing drawn\n", *data)
		return
	}
	for _, w := range written {
		fmt.Println(w)
	}
}
