package balance

import (
	"github.com/flotilla-dev/flotilla/store"
)

// FromStore builds the assignment's input from what the store lists, the
// one reading of the fleet that nodes, the command line and the dashboard
// share:
//
//   - the nodes are those alive and not leaving;
//   - a bucket's holder is the node of its lease's holder, when that
//     incarnation is the node's live one (a lease left by a process that
//     died, or restarted, counts as nobody's), or, when the holder is
//     handing the bucket to a live node, that successor;
//   - the pins are the leases' pins.
func FromStore(buckets int, nodes []store.NodeInfo, leases []store.BucketLease) Input {
	in := Input{Buckets: buckets, Holders: map[int]string{}, Pins: map[int]string{}}
	live := map[string]string{} // node id -> its live incarnation
	for _, n := range nodes {
		if n.Alive && !n.Leaving {
			in.Nodes = append(in.Nodes, Node{ID: n.ID, Declared: n.Buckets, Balance: n.Balance})
			live[n.ID] = n.Incarnation
		}
	}
	for _, l := range leases {
		if l.Pin != "" {
			in.Pins[l.Bucket] = l.Pin
		}
		switch {
		case l.Successor != "" && live[l.Successor] == l.SuccessorOwner:
			in.Holders[l.Bucket] = l.Successor
		case l.Holder != "" && live[l.Node] == l.Holder:
			in.Holders[l.Bucket] = l.Node
		}
	}
	return in
}
