package postgres

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flotilla-dev/flotilla/store"
)

// Subscription buffering and reconnection.
const (
	// SubscriptionBuffer is the capacity of a subscription's channel. A
	// notification that finds it full is dropped: notifications are
	// wake-up hints, and every consumer also polls, so a slow reader is
	// delayed, never wrong.
	SubscriptionBuffer = 256

	reconnectMin = 100 * time.Millisecond
	reconnectMax = 5 * time.Second
	closeTimeout = 5 * time.Second
)

// Subscription is what Listen returns: store.Subscription, plus Err.
type Subscription interface {
	store.Subscription
	// Err reports why the subscription's connection is down while it is
	// reconnecting, and nil while it is connected. Notifications sent
	// while it was down are lost: poll after it comes back.
	Err() error
}

type subscription struct {
	store  *Store
	config *pgx.ConnConfig
	topics []store.Topic

	c      chan store.Notification
	cancel context.CancelFunc
	done   chan struct{}

	mu  sync.Mutex
	err error
}

var _ Subscription = (*subscription)(nil)

// Listen subscribes to topics on a dedicated connection (outside the pool),
// which is listening when Listen returns. The subscription ends, its channel
// closed, when ctx ends or Close is called. A dropped connection is
// reconnected with capped exponential backoff; Err tells why while it is
// down.
func (s *Store) Listen(ctx context.Context, topics ...store.Topic) (store.Subscription, error) {
	if len(topics) == 0 {
		return nil, fmt.Errorf("listen: no topics: %w", store.ErrInvalid)
	}
	sub := &subscription{
		store:  s,
		config: s.pool.Config().ConnConfig,
		topics: append([]store.Topic(nil), topics...),
		c:      make(chan store.Notification, SubscriptionBuffer),
		done:   make(chan struct{}),
	}
	conn, err := sub.connect(ctx)
	if err != nil {
		return nil, err
	}
	subCtx, cancel := context.WithCancel(ctx)
	sub.cancel = cancel

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		cancel()
		closeConn(conn)
		return nil, fmt.Errorf("listen: %w", errClosed)
	}
	s.subs[sub] = struct{}{}
	s.mu.Unlock()

	go sub.run(subCtx, conn)
	return sub, nil
}

// connect opens the subscription's connection and listens to its topics.
func (sub *subscription) connect(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, sub.config.Copy())
	if err != nil {
		return nil, fmt.Errorf("listen: cannot reach PostgreSQL: %w", err)
	}
	for _, topic := range sub.topics {
		// Channel names are identifiers; Sanitize quotes them, so a topic
		// is never SQL.
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{string(topic)}.Sanitize()); err != nil {
			closeConn(conn)
			return nil, wrap(err, "listen to %s", topic)
		}
	}
	return conn, nil
}

func (sub *subscription) run(ctx context.Context, conn *pgx.Conn) {
	defer close(sub.done)
	defer close(sub.c)
	defer func() {
		sub.store.mu.Lock()
		delete(sub.store.subs, sub)
		sub.store.mu.Unlock()
	}()

	for {
		n, err := conn.WaitForNotification(ctx)
		if err == nil {
			select {
			case sub.c <- store.Notification{Topic: store.Topic(n.Channel), Payload: n.Payload}:
			default: // full: dropped, see SubscriptionBuffer
			}
			continue
		}
		closeConn(conn)
		if ctx.Err() != nil {
			return
		}
		sub.setErr(err)
		if conn = sub.reconnect(ctx); conn == nil {
			return
		}
		// What was sent while the connection was down is lost: say so,
		// so that the consumer looks at once (see store.Notifier).
		for _, topic := range sub.topics {
			select {
			case sub.c <- store.Notification{Topic: topic, Resumed: true}:
			default: // full: what is queued wakes the consumer anyway
			}
		}
	}
}

// reconnect tries until it has a listening connection, with capped
// exponential backoff, or returns nil when ctx ends.
func (sub *subscription) reconnect(ctx context.Context) *pgx.Conn {
	wait := reconnectMin
	for {
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C:
		}
		conn, err := sub.connect(ctx)
		if err == nil {
			sub.setErr(nil)
			return conn
		}
		if ctx.Err() != nil {
			return nil
		}
		sub.setErr(err)
		wait = min(2*wait, reconnectMax)
	}
}

func (sub *subscription) setErr(err error) {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	if err != nil {
		err = fmt.Errorf("subscription connection lost, reconnecting: %w", err)
	}
	sub.err = err
}

// C delivers the notifications. It is closed when the subscription ends.
func (sub *subscription) C() <-chan store.Notification { return sub.c }

// Err reports why the connection is down, or nil while it is listening.
func (sub *subscription) Err() error {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	return sub.err
}

// Close ends the subscription and waits until its connection is closed.
// Closing twice is harmless.
func (sub *subscription) Close() error {
	sub.cancel()
	<-sub.done
	return nil
}

func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	_ = conn.Close(ctx)
}

// deliverLocally hands a notification to this Store's own subscriptions to
// topic at once, as the write it announces has committed: a node that
// submits through the store it listens on starts its own tasks without
// waiting for the announcing transaction's round trip and the server's
// delivery. The same notification still comes through the server, for
// every other process and again for this one (a second hint, which costs at
// most one more claim). Called only after the write's commit, never from
// inside a caller's transaction, whose tasks must not be announced before
// it commits.
func (s *Store) deliverLocally(topic store.Topic, payload string) {
	// s.mu is held while sending: a subscription leaves s.subs under it
	// before its channel is closed.
	s.mu.Lock()
	defer s.mu.Unlock()
	for sub := range s.subs {
		if !slices.Contains(sub.topics, topic) {
			continue
		}
		select {
		case sub.c <- store.Notification{Topic: topic, Payload: payload}:
		default: // full: dropped, see SubscriptionBuffer
		}
	}
}
