package flotilla

import (
	"context"
	"fmt"

	"github.com/flotilla-dev/flotilla/balance"
	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
)

// MoveRefusedError refuses to move buckets to a node that is not live (or
// is leaving), or that does not declare some of them: its holders could
// never hand them there. It matches ErrRefused.
type MoveRefusedError struct {
	Node       string
	NotLive    bool
	Undeclared bucket.Set // the buckets Node does not declare
	Declared   bucket.Set // what Node declares
}

func (e *MoveRefusedError) Error() string {
	if e.NotLive {
		return fmt.Sprintf("cannot move buckets to node %s: it is not a live node (see worker nodes)", e.Node)
	}
	return fmt.Sprintf("cannot move buckets %s to node %s: it does not declare them (it declares %s)",
		e.Undeclared, e.Node, e.Declared)
}

func (e *MoveRefusedError) Is(target error) bool { return target == ErrRefused }

// MoveBuckets pins buckets to node: their holders hand them to it through
// the live hand-off, and they stay there until UnpinBuckets, whatever
// balance would do. node must be live and declare every bucket
// (*MoveRefusedError otherwise); a bucket the fleet does not have matches
// bucket.ErrInvalidSet.
func (c *Client) MoveBuckets(ctx context.Context, buckets bucket.Set, node string) error {
	if err := buckets.CheckRange(c.Policy().Count()); err != nil {
		return err
	}
	nodes, err := c.store.ListNodes(ctx)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if n.ID != node {
			continue
		}
		if !n.Alive || n.Leaving {
			break
		}
		if missing := buckets.Minus(n.Buckets); !missing.Empty() {
			return &MoveRefusedError{Node: node, Undeclared: missing, Declared: n.Buckets}
		}
		return c.store.PinBuckets(ctx, buckets, node)
	}
	return &MoveRefusedError{Node: node, NotLive: true}
}

// UnpinBuckets removes the pins of buckets: balance places them again, and,
// being sticky, leaves them where they are unless it must move them.
func (c *Client) UnpinBuckets(ctx context.Context, buckets bucket.Set) error {
	if err := buckets.CheckRange(c.Policy().Count()); err != nil {
		return err
	}
	return c.store.PinBuckets(ctx, buckets, "")
}

// NodeReport is a registered node with its share of the fleet.
type NodeReport struct {
	store.NodeInfo
	// Held is the buckets it holds now.
	Held bucket.Set
	// Share is how many buckets the fleet's assignment gives it
	// (package balance): what it holds once the moves under way are done.
	Share int
}

// NodeReports lists the registered nodes, each with what it holds and its
// share, by id.
func (c *Client) NodeReports(ctx context.Context) ([]NodeReport, error) {
	nodes, err := c.store.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	leases, err := c.store.ListBuckets(ctx)
	if err != nil {
		return nil, err
	}
	shares := balance.Assign(balance.FromStore(len(leases), nodes, leases)).Shares()
	held := map[string][]int{}
	for _, l := range leases {
		if l.Holder != "" {
			held[l.Holder] = append(held[l.Holder], l.Bucket)
		}
	}
	out := make([]NodeReport, len(nodes))
	for i, n := range nodes {
		out[i] = NodeReport{NodeInfo: n, Held: bucket.Of(held[n.Incarnation]...)}
		if n.Alive && !n.Leaving {
			out[i].Share = shares[n.ID]
		}
	}
	return out, nil
}
