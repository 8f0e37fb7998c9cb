package memory

import (
	"context"
	"fmt"

	"github.com/flotilla-dev/flotilla/store"
)

// subscriptionBuffer is how many notifications a subscriber may fall behind
// before new ones are dropped. Notifications are hints (callers poll), so
// dropping is safe, and it keeps a slow listener from blocking writers.
const subscriptionBuffer = 256

// subscription is one Listen. Its fields other than ch are guarded by the
// database mutex, which publishers hold, so a send never races the close.
type subscription struct {
	db     *database
	handle *Store // the handle whose Close ends it
	topics map[store.Topic]bool
	ch     chan store.Notification
	ended  bool
	// stopWatching detaches the subscription from its context.
	stopWatching func() bool
}

var _ store.Subscription = (*subscription)(nil)

// Listen subscribes to topics until ctx ends, the subscription is closed,
// or the handle is closed; then the channel is closed. It needs no schema,
// like PostgreSQL's LISTEN.
func (s *Store) Listen(ctx context.Context, topics ...store.Topic) (store.Subscription, error) {
	if len(topics) == 0 {
		return nil, fmt.Errorf("%w: listen needs at least one topic", store.ErrInvalid)
	}
	db, err := s.beginUnmigrated(ctx)
	if err != nil {
		return nil, err
	}
	defer db.mu.Unlock()

	sub := &subscription{
		db:     db,
		handle: s,
		topics: map[store.Topic]bool{},
		ch:     make(chan store.Notification, subscriptionBuffer),
	}
	for _, t := range topics {
		sub.topics[t] = true
	}
	db.subscriptions[sub] = struct{}{}
	// AfterFunc starts no goroutine until ctx ends, and the one it starts
	// then only closes the subscription, so nothing outlives it.
	sub.stopWatching = context.AfterFunc(ctx, func() {
		db.mu.Lock()
		defer db.mu.Unlock()
		db.endSubscription(sub)
	})
	return sub, nil
}

// C delivers the notifications; it is closed when the subscription ends.
func (sub *subscription) C() <-chan store.Notification { return sub.ch }

// Close ends the subscription. Closing twice is harmless.
func (sub *subscription) Close() error {
	sub.stopWatching()
	sub.db.mu.Lock()
	defer sub.db.mu.Unlock()
	sub.db.endSubscription(sub)
	return nil
}

// endSubscription closes sub's channel once. db.mu must be held.
func (db *database) endSubscription(sub *subscription) {
	if sub.ended {
		return
	}
	sub.ended = true
	delete(db.subscriptions, sub)
	close(sub.ch)
}

// publish sends a notification to every subscriber of topic, dropping it for
// a subscriber whose buffer is full. db.mu must be held: notifications go
// out with the change they announce, as NOTIFY is delivered at commit.
func (db *database) publish(topic store.Topic, payload string) {
	n := store.Notification{Topic: topic, Payload: payload}
	for sub := range db.subscriptions {
		if !sub.topics[topic] {
			continue
		}
		select {
		case sub.ch <- n:
		default:
		}
	}
}
