package balance_test

import (
	"fmt"
	"testing"

	"github.com/flotilla-dev/flotilla/balance"
)

// BenchmarkAssign is what one balance pass costs a node in computation: a
// settled fleet of n nodes declaring every bucket, and the same fleet as a
// node joins it (a join's moves are the most work the assignment does).
//
//	go test -run '^$' -bench Assign ./balance/
func BenchmarkAssign(b *testing.B) {
	for _, c := range []struct{ buckets, nodes int }{{64, 4}, {1024, 16}, {65536, 64}} {
		ids := nodeIDs(c.nodes + 1)
		nodes := all(ids...)
		for i := range nodes {
			nodes[i].Declared = allOf(c.buckets)
		}
		settled := balance.Assign(balance.Input{Buckets: c.buckets, Nodes: nodes[:c.nodes]})
		holders := map[int]string{}
		for bk := range c.buckets {
			holders[bk] = settled.Target(bk)
		}
		b.Run(fmt.Sprintf("settled/%d-buckets/%d-nodes", c.buckets, c.nodes), func(b *testing.B) {
			in := balance.Input{Buckets: c.buckets, Nodes: nodes[:c.nodes], Holders: holders}
			for b.Loop() {
				balance.Assign(in)
			}
		})
		b.Run(fmt.Sprintf("join/%d-buckets/%d-nodes", c.buckets, c.nodes), func(b *testing.B) {
			in := balance.Input{Buckets: c.buckets, Nodes: nodes, Holders: holders}
			for b.Loop() {
				balance.Assign(in)
			}
		})
	}
}
