// Package balance decides which node should hold each bucket of a fleet.
//
//	a := balance.Assign(balance.Input{
//		Buckets: 64,
//		Nodes: []balance.Node{
//			{ID: "a", Declared: bucket.All(64), Balance: true},
//			{ID: "b", Declared: bucket.All(64), Balance: true},
//		},
//		Holders: map[int]string{0: "a", 1: "a" /* ... */},
//	})
//	a.Target(5) // "a" or "b": the node that should hold bucket 5
//
// # What it owns
//
// One pure function, [Assign], from what every node can read in the store
// (the live nodes with their declarations, who holds each bucket, the
// operators' pins) to a target holder for each bucket. It does no I/O and
// keeps no state: every node computes the same assignment from the same
// inputs, so the fleet agrees on who should hold what without electing
// anyone to decide it.
//
// # The rules
//
//   - A bucket pinned to a live node that declares it goes to that node.
//   - A bucket held by a node that does not balance (it opted out, or its
//     version predates balancing) stays where it is: such a node holds what
//     it can and gives nothing away.
//   - Every other bucket that some balancing node declares goes to one of
//     the balancing nodes that declare it, so that their loads are as even as
//     the declarations allow: no bucket could move, directly or along a
//     chain of moves, from a node to one holding two or more fewer (an
//     optimal semi-matching, which makes the largest load as small as it can
//     be and, below it, the next largest, and so on). Nodes whose
//     declarations are the same therefore differ by at most one bucket, and
//     nodes whose declarations do not overlap are never compared.
//   - Sticky: a bucket stays with its holder unless balance needs it
//     elsewhere, and what must move moves along the shortest chains, so a
//     node joining n-1 nodes that declare what it declares takes at most
//     ceil(buckets/n) buckets, each from one of them, and a node leaving
//     moves only its own. A bucket nobody holds goes, in runs, to the least
//     loaded node that declares it.
//   - A bucket no balancing node declares has no target ("").
//
// A node that must give a bucket hands it to its target; a node never takes
// a bucket that another live node holds. Nodes that read the store at
// different moments may compute different targets for a while: that delays
// a move, never makes two holders, since the leases, not the assignment,
// decide who holds a bucket.
package balance
