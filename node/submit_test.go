package node

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// Invariant 6: a node whose buckets are limited refuses, at submit time, a
// task that would wait in a bucket it does not serve.
func TestALimitedNodeRefusesWhatItWouldNotServe(t *testing.T) {
	b := setup(t)
	owned := bucket.Of(span(0, 31)...)
	n := b.startNode(t, b.config(t, "limited", span(0, 31)...), map[string]Handler{"work": noop, "mail": noop})
	foreign := b.keysIn(bucket.Of(span(32, 63)...), 1)[0]
	foreignBucket := b.policy.Of(foreign)

	cases := []struct {
		name  string
		req   SubmitRequest
		check func(t *testing.T, err error)
	}{
		{"a key of a foreign bucket", SubmitRequest{Kind: "work", Key: foreign}, func(t *testing.T, err error) {
			var fe *bucket.ForeignBucketError
			if !errors.As(err, &fe) || fe.Key != foreign || fe.Bucket != foreignBucket || !fe.Owned.Equal(owned) {
				t.Fatalf("error %v, want *bucket.ForeignBucketError{%q, %d, %s}", err, foreign, foreignBucket, owned)
			}
			if msg := err.Error(); !strings.Contains(msg, strconv.Itoa(foreignBucket)) || !strings.Contains(msg, "0-31") {
				t.Errorf("%q does not name the bucket and the owned set", msg)
			}
		}},
		{"no key", SubmitRequest{Kind: "work"}, func(t *testing.T, err error) {
			var me *bucket.MissingKeyError
			if !errors.As(err, &me) || !me.Owned.Equal(owned) || !errors.Is(err, bucket.ErrForeignBucket) {
				t.Fatalf("error %v, want *bucket.MissingKeyError owning %s", err, owned)
			}
		}},
		{"an unknown kind", SubmitRequest{Kind: "sms", Key: "k"}, func(t *testing.T, err error) {
			var ue *UnknownKindError
			if !errors.As(err, &ue) || !errors.Is(err, ErrUnknownKind) {
				t.Fatalf("error %v, want *UnknownKindError", err)
			}
			for _, want := range []string{`"sms"`, "mail, work"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("%q does not mention %s", err, want)
				}
			}
		}},
		{"a payload that is not JSON", SubmitRequest{Kind: "work", Key: b.keysIn(owned, 1)[0], Payload: json.RawMessage(`{"a":`)},
			func(t *testing.T, err error) {
				if !errors.Is(err, store.ErrInvalid) {
					t.Fatalf("error %v, want store.ErrInvalid", err)
				}
			}},
		{"an empty kind", SubmitRequest{Key: "k"}, func(t *testing.T, err error) {
			if !errors.Is(err, store.ErrInvalid) {
				t.Fatalf("error %v, want store.ErrInvalid", err)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := n.Submit(b.ctx, c.req)
			if got != nil {
				t.Errorf("Submit returned task %+v with a refusal", got)
			}
			c.check(t, err)
			assertNoTasks(t, b)
		})
	}

	t.Run("a batch with one refusal writes nothing", func(t *testing.T) {
		mine := b.keysIn(owned, 2)
		_, err := n.SubmitMany(b.ctx, []SubmitRequest{
			{Kind: "work", Key: mine[0]}, {Kind: "work", Key: foreign}, {Kind: "work", Key: mine[1]},
		})
		var fe *bucket.ForeignBucketError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), "index 1") {
			t.Fatalf("error %v, want a foreign bucket at index 1", err)
		}
		assertNoTasks(t, b)
	})

	t.Run("its own keys are accepted", func(t *testing.T) {
		key := b.keysIn(owned, 1)[0]
		tk := submit(t, n, SubmitRequest{Kind: "work", Key: key})
		if tk.Bucket != b.policy.Of(key) || tk.Key != key {
			t.Errorf("task in bucket %d with key %q, want %d and %q", tk.Bucket, tk.Key, b.policy.Of(key), key)
		}
		eventually(t, "it ran", b.statusIs(t, tk.ID, task.Succeeded))
	})
}

func assertNoTasks(t *testing.T, b *testBundle) {
	t.Helper()
	tasks, err := b.store.ListTasks(b.ctx, store.TaskFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(tasks) != 0 {
		t.Errorf("a refused submit wrote %d tasks", len(tasks))
	}
}

func TestANodeOfEveryBucketAcceptsTasksWithoutAKey(t *testing.T) {
	for name, cfg := range map[string]func(*testBundle, *testing.T) Config{
		"AllBuckets": func(b *testBundle, t *testing.T) Config { return b.config(t, "all") },
		"every bucket listed": func(b *testBundle, t *testing.T) Config {
			return b.config(t, "listed", span(0, testBuckets-1)...)
		},
	} {
		t.Run(name, func(t *testing.T) {
			b := setup(t)
			n := b.startNode(t, cfg(b, t), map[string]Handler{"work": noop})
			tk := submit(t, n, SubmitRequest{Kind: "work", Payload: json.RawMessage(`{"n":1}`)})
			if tk.Key != "" || tk.Bucket < 0 || tk.Bucket >= testBuckets {
				t.Errorf("keyless task stored with key %q in bucket %d", tk.Key, tk.Bucket)
			}
			eventually(t, "it ran", b.statusIs(t, tk.ID, task.Succeeded))
		})
	}
}

func TestSubmitBeforeStartChecksAgainstTheFleet(t *testing.T) {
	b := setup(t)
	n := b.newNode(t, b.config(t, "early", span(0, 31)...), map[string]Handler{"work": noop})
	foreign := b.keysIn(bucket.Of(span(32, 63)...), 1)[0]
	if _, err := n.Submit(b.ctx, SubmitRequest{Kind: "work", Key: foreign}); !errors.Is(err, bucket.ErrForeignBucket) {
		t.Errorf("foreign key before Start: %v", err)
	}
	tk := submit(t, n, SubmitRequest{Kind: "work", Key: b.keysIn(bucket.Of(span(0, 31)...), 1)[0]})
	if err := n.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the early task ran", b.statusIs(t, tk.ID, task.Succeeded))
}

func TestAHandlersResultIsRecorded(t *testing.T) {
	b := setup(t)
	n := b.startNode(t, b.config(t, "resulting"), map[string]Handler{
		"sum": func(_ context.Context, tk *task.Task) error {
			tk.Result = json.RawMessage(`{"sum":3}`)
			return nil
		},
		"garbage": func(_ context.Context, tk *task.Task) error {
			tk.Result = json.RawMessage(`{"sum":`)
			return nil
		},
	})
	ok := submit(t, n, SubmitRequest{Kind: "sum", Key: "a"})
	bad := submit(t, n, SubmitRequest{Kind: "garbage", Key: "b", MaxAttempts: 1})
	eventually(t, "the task succeeded", b.statusIs(t, ok.ID, task.Succeeded))
	if got := string(b.get(t, ok.ID).Result); got != `{"sum":3}` {
		t.Errorf("result %s", got)
	}
	// A result that cannot be stored fails the attempt rather than losing
	// it silently.
	eventually(t, "the garbage task failed", b.statusIs(t, bad.ID, task.Failed))
	if got := b.get(t, bad.ID).Error; !strings.Contains(got, "not valid JSON") {
		t.Errorf("error %q", got)
	}
}
