package node

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/internal/clock"
	"github.com/flotilla-dev/flotilla/store"
)

// pruner is the node's retention loop: every PruneInterval, jittered so
// that the fleet's nodes do not prune at the same moment, it removes the
// finished tasks of each bucket the node holds that have outlived their
// retention, a batch of PruneBatch at a time, until a batch comes back
// short. The store fences every batch by the bucket's epoch: a node that
// has lost a bucket prunes nothing there, so no two pruners meet.
type pruner struct {
	n    *Node
	loop *loop
	// passes counts finished passes; tests wait on it.
	passes atomic.Int64
}

func newPruner(n *Node) *pruner {
	return &pruner{n: n, loop: newLoop("retention")}
}

// run waits a jittered interval, then passes; a poke passes at once.
func (p *pruner) run(ctx context.Context) {
	n := p.n
	for {
		// Between half and one and a half intervals.
		wait := n.cfg.PruneInterval/2 + n.jitter(n.cfg.PruneInterval)
		if !sleepOrWake(ctx, n.cfg.Clock, wait, p.loop.wake) {
			return
		}
		p.pass(ctx)
	}
}

// sleepOrWake waits d on clk, or a poke on wake; it reports false when ctx
// ended first.
func sleepOrWake(ctx context.Context, clk clock.Clock, d time.Duration, wake chan struct{}) bool {
	fired := make(chan struct{})
	t := clk.AfterFunc(d, func() { close(fired) })
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-fired:
	case <-wake:
	}
	return ctx.Err() == nil
}

// pass prunes every bucket held now.
func (p *pruner) pass(ctx context.Context) {
	defer p.passes.Add(1)
	n := p.n
	if n.cfg.Retention.Keeps() {
		return
	}
	for _, h := range n.keeper.Held() {
		if ctx.Err() != nil {
			return
		}
		p.prune(ctx, h)
	}
}

// prune removes a held bucket's prunable tasks in batches until a batch
// comes back short, the bucket is lost, or something fails (the next pass
// tries again).
func (p *pruner) prune(ctx context.Context, h store.HeldBucket) {
	n := p.n
	for ctx.Err() == nil {
		sctx, cancel := context.WithTimeout(ctx, n.stmtTimeout)
		res, err := n.store.PruneFinished(sctx, store.PruneRequest{Owner: n.incarnation, Bucket: h.Bucket,
			Epoch: h.Epoch, Retention: n.cfg.Retention, Limit: n.cfg.PruneBatch})
		cancel()
		n.metrics.Pruned(h.Bucket, res, err)
		fields := []zap.Field{zap.Int("bucket", h.Bucket), zap.Int64("epoch", h.Epoch)}
		switch {
		case errors.Is(err, store.ErrFenced):
			n.log.Info("retention skipped a bucket this node no longer holds under its epoch", fields...)
			return
		case err != nil:
			if ctx.Err() == nil {
				n.log.Warn("pruning finished tasks failed; the next pass tries again", append(fields, zap.Error(err))...)
			}
			return
		}
		if res.Tasks > 0 {
			for st, c := range res.ByStatus {
				fields = append(fields, zap.Int(string(st), c.Tasks))
			}
			n.log.Info("pruned finished tasks past their retention", append(fields,
				zap.Int("tasks", res.Tasks), zap.Int("events", res.Events), zap.Int("commands", res.Commands))...)
		}
		if res.Tasks < n.cfg.PruneBatch {
			return
		}
	}
}
