package dashboard

import (
	"fmt"
	"strings"

	"github.com/flotilla-dev/flotilla/bucket"
)

// A fleet of more than gridMaxBuckets buckets gets no cell per bucket, which
// would make a page of megabytes: its map is drawn as runs of buckets by
// holder on one bar, at most summaryBins of them, with each holder's share
// beside it.
const (
	gridMaxBuckets = 1024
	summaryBins    = 512
	summaryWidth   = 1000.0
	// maxRangesText bounds a holder's list of ranges on the page.
	maxRangesText = 160
)

type mapSummary struct {
	Buckets int
	Runs    []bucketRun
	Holders []holderShare
	Width   float64
}

// bucketRun is a run of buckets on the bar: held by one node, or, when the
// map has more runs than summaryBins, a bin shown in its main holder's
// colour.
type bucketRun struct {
	From, To int
	Class    string
	Holder   string
	X, W     float64
	Title    string
}

type holderShare struct {
	Holder  string // "" for the buckets nobody holds
	Class   string
	Buckets int
	Ranges  string
	Queued  int
	Waiting int
	Running int
}

func summarise(cells []bucketCell) *mapSummary {
	n := len(cells)
	sum := &mapSummary{Buckets: n, Width: summaryWidth}
	scale := summaryWidth / float64(n)
	var runs []bucketRun
	for i := 0; i < n; {
		j := i
		for j+1 < n && cells[j+1].Holder == cells[i].Holder {
			j++
		}
		runs = append(runs, bucketRun{From: cells[i].Bucket, To: cells[j].Bucket, Class: cells[i].Class, Holder: cells[i].Holder})
		i = j + 1
	}
	if len(runs) > summaryBins {
		runs = bins(cells)
	}
	for i := range runs {
		r := &runs[i]
		r.X, r.W = float64(r.From)*scale, float64(r.To-r.From+1)*scale
		if r.Title == "" {
			r.Title = fmt.Sprintf("buckets %d-%d: %s", r.From, r.To, holderName(r.Holder))
		}
	}
	sum.Runs = runs

	byHolder := map[string]*holderShare{}
	held := map[string][]int{}
	var order []string
	for _, c := range cells {
		h := byHolder[c.Holder]
		if h == nil {
			h = &holderShare{Holder: c.Holder, Class: c.Class}
			byHolder[c.Holder] = h
			order = append(order, c.Holder)
		}
		h.Buckets++
		h.Queued += c.Queued
		h.Waiting += c.Waiting
		h.Running += c.Running
		held[c.Holder] = append(held[c.Holder], c.Bucket)
	}
	for _, k := range order {
		h := byHolder[k]
		h.Ranges = shorten(bucket.Of(held[k]...).String(), maxRangesText)
		sum.Holders = append(sum.Holders, *h)
	}
	return sum
}

// bins splits the map into summaryBins equal bins, each shown in the
// colour of the holder of most of its buckets.
func bins(cells []bucketCell) []bucketRun {
	n := len(cells)
	out := make([]bucketRun, 0, summaryBins)
	for b := range summaryBins {
		from, to := b*n/summaryBins, (b+1)*n/summaryBins-1
		if to < from {
			continue
		}
		count := map[string]int{}
		best := cells[from]
		for _, c := range cells[from : to+1] {
			count[c.Holder]++
			if count[c.Holder] > count[best.Holder] {
				best = c
			}
		}
		out = append(out, bucketRun{From: cells[from].Bucket, To: cells[to].Bucket, Class: best.Class, Holder: best.Holder,
			Title: fmt.Sprintf("buckets %d-%d: %d of %d held by %s", cells[from].Bucket, cells[to].Bucket,
				count[best.Holder], to-from+1, holderName(best.Holder))})
	}
	return out
}

func holderName(h string) string {
	if h == "" {
		return "nobody"
	}
	return h
}

// shorten cuts a long list at a comma, saying how much is left out.
func shorten(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := strings.LastIndexByte(s[:max], ',')
	if cut < 0 {
		cut = max
	}
	return fmt.Sprintf("%s, … (%d more ranges)", s[:cut], strings.Count(s[cut:], ","))
}
