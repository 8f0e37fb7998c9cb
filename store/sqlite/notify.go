package sqlite

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/flotilla-dev/flotilla/store"
)

// DefaultOutboxPoll is how often a handle with listeners reads the outbox
// for other processes' notifications.
const DefaultOutboxPoll = 20 * time.Millisecond

// subscriptionBuffer is how many notifications a subscriber may fall behind
// before new ones are dropped. Notifications are hints (callers poll), so
// dropping is safe, and it keeps a slow listener from blocking the writer.
const subscriptionBuffer = 256

type subscription struct {
	s      *Store
	topics map[store.Topic]bool
	ch     chan store.Notification
	once   sync.Once
}

var _ store.Subscription = (*subscription)(nil)

// Listen subscribes to topics until ctx ends or the subscription (or the
// store) is closed. Notifications of this handle's own writes are delivered
// when they commit; those of other processes on the same file within a poll
// interval of their commit, from the outbox. It needs no schema.
func (s *Store) Listen(ctx context.Context, topics ...store.Topic) (store.Subscription, error) {
	if len(topics) == 0 {
		return nil, fmt.Errorf("%w: listen needs at least one topic", store.ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sub := &subscription{s: s, topics: map[store.Topic]bool{}, ch: make(chan store.Notification, subscriptionBuffer)}
	for _, t := range topics {
		sub.topics[t] = true
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	s.subs[sub] = struct{}{}
	s.mu.Unlock()
	if err := s.poller.start(ctx); err != nil {
		_ = sub.Close()
		return nil, err
	}
	// AfterFunc starts no goroutine until ctx ends, and the one it starts
	// then only closes the subscription; closing it first makes that a
	// no-op.
	context.AfterFunc(ctx, func() { _ = sub.Close() })
	return sub, nil
}

func (sub *subscription) C() <-chan store.Notification { return sub.ch }

// Close ends the subscription. Closing twice is harmless.
func (sub *subscription) Close() error {
	sub.once.Do(func() {
		s := sub.s
		s.mu.Lock()
		delete(s.subs, sub)
		// Closed under the lock that deliver holds while it sends, so a
		// send never meets a closed channel.
		close(sub.ch)
		s.mu.Unlock()
	})
	return nil
}

// deliver sends notifications to this handle's subscribers, dropping one
// for a subscriber whose buffer is full.
func (s *Store) deliver(notes []store.Notification) {
	if len(notes) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for sub := range s.subs {
		for _, n := range notes {
			if !sub.topics[n.Topic] {
				continue
			}
			select {
			case sub.ch <- n:
			default:
			}
		}
	}
}

// poller reads other processes' notifications from the outbox while the
// handle has subscribers. It starts with the first Listen and runs until
// the store closes; with no subscribers it reads nothing.
type poller struct {
	s     *Store
	every time.Duration

	mu      sync.Mutex
	started bool
	lastID  int64
	cancel  context.CancelFunc
	done    chan struct{}
}

func newPoller(s *Store, every time.Duration) *poller {
	return &poller{s: s, every: every}
}

// start begins polling, from the outbox's newest row: a subscription hears
// what commits after it, as with LISTEN.
func (p *poller) start(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.started {
		return nil
	}
	last, err := p.newest(ctx)
	if err != nil {
		return err
	}
	p.lastID = last
	pctx, cancel := context.WithCancel(context.Background())
	p.cancel, p.done, p.started = cancel, make(chan struct{}), true
	go p.loop(pctx)
	return nil
}

func (p *poller) stop() {
	p.mu.Lock()
	started, cancel, done := p.started, p.cancel, p.done
	p.mu.Unlock()
	if started {
		cancel()
		<-done
	}
}

// newest is the highest outbox id, 0 on an unmigrated file.
func (p *poller) newest(ctx context.Context) (int64, error) {
	var id int64
	err := p.s.rdb.QueryRowContext(ctx, `SELECT coalesce(max(id), 0) FROM flotilla_notifications`).Scan(&id)
	if isNoSuchTable(err) {
		return 0, nil
	}
	if err != nil {
		return 0, wrap(err, "read the outbox")
	}
	return id, nil
}

func (p *poller) loop(ctx context.Context) {
	defer close(p.done)
	t := time.NewTicker(p.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.poll(ctx)
	}
}

// poll reads the rows above the last one seen; an error (the file not yet
// migrated, a busy moment) waits for the next tick, and the claim loop's
// own poll covers what is missed.
func (p *poller) poll(ctx context.Context) {
	p.s.mu.Lock()
	listening := len(p.s.subs) > 0
	p.s.mu.Unlock()
	if !listening {
		return
	}
	rows, err := p.s.rdb.QueryContext(ctx,
		`SELECT id, topic, payload, origin FROM flotilla_notifications WHERE id > ? ORDER BY id LIMIT 1000`, p.lastID)
	if err != nil {
		return
	}
	defer rows.Close()
	var notes []store.Notification
	for rows.Next() {
		var (
			id             int64
			topic, payload string
			origin         string
		)
		if err := rows.Scan(&id, &topic, &payload, &origin); err != nil {
			return
		}
		p.lastID = id
		if origin != p.s.origin { // this handle delivered its own at commit
			notes = append(notes, store.Notification{Topic: store.Topic(topic), Payload: payload})
		}
	}
	p.s.deliver(notes)
}
