package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// SubmitRequest is a task to submit, through a node or through the client
// (flotilla.TaskRequest is the same type). store.CheckNewTasks says what is
// valid.
type SubmitRequest struct {
	Kind string
	// Key routes the task to its bucket. Through a node it may be empty
	// only on a node that declares every bucket; through the client, ""
	// places the task in a served bucket at random.
	Key     string
	Payload json.RawMessage // nil means null; otherwise valid JSON
	// Priority: higher runs first; FIFO within a priority.
	Priority int
	// RunAt, or Delay from the database's now, makes the task wait; give
	// at most one. Zero means at once.
	RunAt time.Time
	Delay time.Duration
	// MaxAttempts is the number of attempts allowed (0 means
	// store.DefaultMaxAttempts).
	MaxAttempts int
	// Timeout bounds each attempt: 0 means none, else whole milliseconds
	// from 1ms (see store.CheckTimeout).
	Timeout time.Duration
	// UniqueKey, when set, refuses the task (store.ErrDuplicate) while an
	// unfinished task has the same one.
	UniqueKey string
	// LimitKey is the key per-key limits count the task under (default
	// Key). When set it picks the bucket instead of Key, so that the one
	// holder of its bucket enforces its limits.
	LimitKey string
	// Resources the task needs free on a node to start (gpu=1).
	Resources store.Resources
	// Metadata travels with the task apart from its payload: a trace
	// context, a request id (see store.CheckMetadata).
	Metadata map[string]string
}

// RoutingKey is the key that picks the task's bucket: LimitKey when set,
// else Key.
func (r SubmitRequest) RoutingKey() string { return store.LimitKeyOf(r.Key, r.LimitKey) }

// NewTask is the request in the store's form, in the given bucket.
func (r SubmitRequest) NewTask(bucket int) store.NewTask {
	return store.NewTask{
		Kind:        r.Kind,
		Key:         r.Key,
		Bucket:      bucket,
		Priority:    r.Priority,
		RunAt:       r.RunAt,
		Delay:       r.Delay,
		MaxAttempts: r.MaxAttempts,
		Timeout:     r.Timeout,
		Payload:     r.Payload,
		UniqueKey:   r.UniqueKey,
		LimitKey:    r.LimitKey,
		Resources:   r.Resources,
		Metadata:    r.Metadata,
	}
}

// ErrUnknownKind is matched by every *UnknownKindError.
var ErrUnknownKind = errors.New("unknown task kind")

// UnknownKindError refuses a task of a kind this node has not registered:
// it would wait in a bucket whose holder cannot run it.
type UnknownKindError struct {
	Kind       string
	Registered []string
}

func (e *UnknownKindError) Error() string {
	if len(e.Registered) == 0 {
		return fmt.Sprintf("kind %q is not registered on this node, which registers no kinds", e.Kind)
	}
	return fmt.Sprintf("kind %q is not registered on this node (it runs %s)", e.Kind, strings.Join(e.Registered, ", "))
}

func (e *UnknownKindError) Is(target error) bool { return target == ErrUnknownKind }

// Submit creates one task; see SubmitMany.
func (n *Node) Submit(ctx context.Context, req SubmitRequest) (*task.Task, error) {
	tasks, err := n.submit(ctx, []SubmitRequest{req}, false)
	if err != nil {
		return nil, err
	}
	return tasks[0], nil
}

// SubmitMany creates tasks atomically, all or none, and returns them in
// input order.
//
// Every task is checked before anything is written (invariant 6): its kind
// must be registered here (*UnknownKindError); on a node that does not
// declare every bucket, its key must hash to a declared bucket
// (*bucket.ForeignBucketError) and must not be empty (*bucket.MissingKeyError);
// and it must pass store.CheckNewTasks (*store.InvalidError, which matches
// store.ErrInvalid, or store.ErrDuplicate for a unique key given twice). A node that declares every
// bucket accepts a task without a key and puts it in a random bucket: such
// tasks have no ordering to keep, and spreading them keeps them from
// queueing behind each other in one bucket. The stored key stays "".
// Errors name the index of the refused task in the batch.
func (n *Node) SubmitMany(ctx context.Context, reqs []SubmitRequest) ([]*task.Task, error) {
	return n.submit(ctx, reqs, true)
}

func (n *Node) submit(ctx context.Context, reqs []SubmitRequest, many bool) ([]*task.Task, error) {
	n.mu.Lock()
	stopped := n.state == stateStopped
	n.mu.Unlock()
	if stopped {
		return nil, fmt.Errorf("node %s: %w", n.id, ErrStopped)
	}
	if len(reqs) == 0 {
		return []*task.Task{}, nil
	}
	// What every store would refuse is refused first, whatever the node
	// declares; the bucket is checked once it is known.
	unrouted := make([]store.NewTask, len(reqs))
	for i, req := range reqs {
		unrouted[i] = req.NewTask(0)
	}
	if err := store.CheckNewTasks(unrouted, 0); err != nil {
		return nil, err
	}
	meta, err := n.fleetMeta(ctx)
	if err != nil {
		return nil, err
	}
	policy, err := bucket.NewPolicy(meta.NumBuckets)
	if err != nil {
		return nil, fmt.Errorf("the fleet's bucket count: %w", err)
	}
	owned, all := n.ownership(meta.NumBuckets)
	kinds := n.registeredKinds()

	news := make([]store.NewTask, len(reqs))
	for i, req := range reqs {
		nt, err := checkSubmit(req, policy, owned, all, kinds)
		if err != nil {
			if many {
				return nil, fmt.Errorf("task at index %d: %w", i, err)
			}
			return nil, err
		}
		news[i] = nt
	}
	created, err := n.store.CreateTasks(ctx, news)
	if err != nil {
		return nil, err
	}
	if _, notifies := n.store.(store.Notifier); !notifies {
		// Without notifications, at least this node's own work need not
		// wait for the poll.
		n.claimLoop.poke()
	}
	return created, nil
}

// checkSubmit refuses a request that this node must not accept, and
// otherwise returns the task to create.
func checkSubmit(req SubmitRequest, policy bucket.Policy, owned bucket.Set, all bool, kinds []string) (store.NewTask, error) {
	if !slices.Contains(kinds, req.Kind) {
		return store.NewTask{}, &UnknownKindError{Kind: req.Kind, Registered: kinds}
	}

	var b int
	switch {
	case req.RoutingKey() == "" && !all:
		return store.NewTask{}, &bucket.MissingKeyError{Owned: owned}
	case req.RoutingKey() == "":
		b = rand.IntN(policy.Count())
	default:
		b = policy.Of(req.RoutingKey())
		if !owned.Contains(b) {
			return store.NewTask{}, &bucket.ForeignBucketError{Key: req.RoutingKey(), Bucket: b, Owned: owned}
		}
	}
	return req.NewTask(b), nil
}
