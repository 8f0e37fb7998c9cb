package node

import (
	"testing"

	"github.com/flotilla-dev/flotilla/store"
)

// TestAResumedSubscriptionWakesEveryLoop holds that a node whose
// subscription listens again after losing its connection (as through a
// database failover) looks at once for what it missed meanwhile: the claim,
// lease, command and schedule loops are each woken, and the balance is
// looked at again. The node is not started, so no loop takes its wake-up
// before the test sees it.
func TestAResumedSubscriptionWakesEveryLoop(t *testing.T) {
	b := setup(t)
	n := b.newNode(t, b.config(t, "a", 0, 1), nil)

	n.notified(store.Notification{Topic: store.TopicTasks, Resumed: true})

	for name, l := range map[string]*loop{
		"claim": n.claimLoop, "lease": n.leaseLoop, "command": n.commander.loop, "schedule": n.scheduleLoop,
	} {
		select {
		case <-l.wake:
		default:
			t.Errorf("the %s loop was not woken by a resumed subscription", name)
		}
	}
	if !n.balancer.dirty.Load() {
		t.Error("the balance is not looked at again after a resumed subscription")
	}
}
