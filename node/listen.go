package node

import (
	"context"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
)

// listen turns the store's notifications into pokes: new work in a held
// bucket wakes the claim loop, a command for this node (or for a task that
// nobody ran when it was issued) wakes the command loop, a schedule changed
// in a held bucket wakes the schedule loop, and a bucket this node declares
// released, handed over or pinned wakes the lease loop, so that a standby
// takes over, and a successor takes a bucket handed to it, at once instead
// of at its next heartbeat. Notifications are hints; the loops poll
// anyway, so one that is missed delays work and loses none.
func (n *Node) listen(ctx context.Context, nt store.Notifier, sub store.Subscription) {
	pause := n.cfg.PollInterval
	for {
		if sub != nil {
			n.listening.Store(true)
			n.consume(ctx, sub)
			n.listening.Store(false)
			_ = sub.Close()
			if ctx.Err() != nil {
				return
			}
			// The subscription ended on its own: whatever was announced
			// meanwhile is found by looking again.
			n.log.Warn("notification subscription ended; listening again")
			n.claimLoop.poke()
			n.leaseLoop.poke()
			n.commander.loop.poke()
			n.scheduleLoop.poke()
		}
		if !sleep(ctx, n.cfg.Clock, pause) {
			return
		}
		sub = n.subscribe(ctx, nt)
	}
}

// subscribe listens to the topics a node acts on; nil when it failed, and
// the node polls meanwhile. The bucket topic stays last: the integration
// tests know a node is listening once a session's last statement is its
// LISTEN.
func (n *Node) subscribe(ctx context.Context, nt store.Notifier) store.Subscription {
	sub, err := nt.Listen(ctx, store.TopicTasks, store.TopicCommands, store.TopicSchedules, store.TopicBuckets)
	if err != nil {
		if ctx.Err() == nil {
			n.log.Warn("listening for notifications failed; polling meanwhile", zap.Error(err))
		}
		return nil
	}
	return sub
}

// consume handles notifications until the subscription or ctx ends.
func (n *Node) consume(ctx context.Context, sub store.Subscription) {
	for {
		select {
		case <-ctx.Done():
			return
		case note, open := <-sub.C():
			if !open {
				return
			}
			n.notified(note)
		}
	}
}

func (n *Node) notified(note store.Notification) {
	if note.Resumed {
		// The subscription was down, as through a database failover, and
		// listens again: whatever was announced meanwhile is found by
		// looking now rather than at the next poll.
		n.log.Info("notification subscription resumed; polling at once", zap.String("topic", string(note.Topic)))
		n.balancer.dirty.Store(true)
		n.claimLoop.poke()
		n.leaseLoop.poke()
		n.commander.loop.poke()
		n.scheduleLoop.poke()
		return
	}
	if note.Topic == store.TopicCommands {
		n.commander.noted(note.Payload)
		return
	}
	buckets, err := bucket.ParseSet(note.Payload, 0)
	whole := err != nil // an unreadable payload: assume it concerns us
	switch note.Topic {
	case store.TopicTasks:
		if whole || n.keeper.holdsAny(buckets) {
			n.claimLoop.poke()
		}
	case store.TopicSchedules:
		if whole || n.keeper.holdsAny(buckets) {
			n.scheduleLoop.poke()
		}
	case store.TopicBuckets:
		// A release, a hand-off or a pin among the buckets this node
		// declares: it may take one, hold one handed to it, or owe one to
		// a pin, and the fleet's balance may have changed.
		if whole || !buckets.Intersect(n.declared).Empty() {
			n.balancer.dirty.Store(true)
			n.leaseLoop.poke()
		}
	}
}
