package flotillatest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// Submitted is a task RequireSubmitted found, with its payload decoded.
type Submitted[T flotilla.Args] struct {
	Task *task.Task
	Args T
}

// RequireOption narrows the tasks RequireSubmitted and RequireNotSubmitted
// look for.
type RequireOption struct {
	what  string
	key   string // also given to the store's filter
	match func(t *task.Task) bool
}

// Key keeps the tasks of key.
func Key(key string) RequireOption {
	return RequireOption{what: fmt.Sprintf("key %q", key), key: key,
		match: func(t *task.Task) bool { return t.Key == key }}
}

// Priority keeps the tasks of priority p.
func Priority(p int) RequireOption {
	return RequireOption{what: fmt.Sprintf("priority %d", p), match: func(t *task.Task) bool { return t.Priority == p }}
}

// MaxAttempts keeps the tasks allowed n attempts.
func MaxAttempts(n int) RequireOption {
	return RequireOption{what: fmt.Sprintf("max attempts %d", n), match: func(t *task.Task) bool { return t.MaxAttempts == n }}
}

// UniqueKey keeps the tasks of unique key k.
func UniqueKey(k string) RequireOption {
	return RequireOption{what: fmt.Sprintf("unique key %q", k), match: func(t *task.Task) bool { return t.UniqueKey == k }}
}

// Status keeps the tasks now in state s.
func Status(s task.Status) RequireOption {
	return RequireOption{what: "state " + string(s), match: func(t *task.Task) bool { return t.Status == s }}
}

// Due keeps the tasks due at at, to the second: a task submitted WithRunAt.
func Due(at time.Time) RequireOption {
	return RequireOption{what: "due at " + at.UTC().Format(time.RFC3339), match: func(t *task.Task) bool {
		d := t.RunAt.Sub(at)
		return d > -time.Second && d < time.Second
	}}
}

// Args keeps the tasks whose payload is args, as JSON: equal values, not
// only equal types.
func Args[T flotilla.Args](args T) RequireOption {
	want, err := json.Marshal(args)
	return RequireOption{what: fmt.Sprintf("arguments %s", want), match: func(t *task.Task) bool {
		return err == nil && jsonEqual(t.Payload, want)
	}}
}

// jsonEqual compares two JSON documents as values, so that PostgreSQL's
// jsonb, which orders keys its own way, compares equal to what was sent.
func jsonEqual(a, b []byte) bool {
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return bytes.Equal(a, b)
	}
	ja, _ := json.Marshal(va)
	jb, _ := json.Marshal(vb)
	return bytes.Equal(ja, jb)
}

// RequireSubmitted fails the test unless exactly one task of T's kind that
// matches opts was submitted through c's store, and returns it with its
// payload decoded. The failure lists the tasks of the kind there are.
func RequireSubmitted[T flotilla.Args](t testing.TB, c *flotilla.Client, opts ...RequireOption) *Submitted[T] {
	t.Helper()
	var zero T
	found, all := submitted(t, c, zero.Kind(), opts)
	if len(found) != 1 {
		t.Fatalf("flotillatest: want 1 task of kind %q%s, found %d; %s", zero.Kind(), describe(opts), len(found), list(zero.Kind(), all))
	}
	s := &Submitted[T]{Task: found[0]}
	if err := json.Unmarshal(found[0].Payload, &s.Args); err != nil {
		t.Fatalf("flotillatest: task %d's payload %s does not decode into %T: %v", found[0].ID, found[0].Payload, s.Args, err)
	}
	return s
}

// RequireNotSubmitted fails the test if a task of T's kind that matches
// opts was submitted through c's store.
func RequireNotSubmitted[T flotilla.Args](t testing.TB, c *flotilla.Client, opts ...RequireOption) {
	t.Helper()
	var zero T
	if found, all := submitted(t, c, zero.Kind(), opts); len(found) > 0 {
		t.Fatalf("flotillatest: want no task of kind %q%s, found %d; %s", zero.Kind(), describe(opts), len(found), list(zero.Kind(), all))
	}
}

// submitted reads the tasks of kind, and returns those that match opts and
// all of them.
func submitted(t testing.TB, c *flotilla.Client, kind string, opts []RequireOption) (found, all []*task.Task) {
	t.Helper()
	f := store.TaskFilter{Kind: kind, Limit: 1000}
	for _, o := range opts {
		if o.key != "" {
			f.Key = o.key
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	all, err := c.List(ctx, f)
	if err != nil {
		t.Fatalf("flotillatest: list the tasks of kind %q: %v", kind, err)
	}
	for _, tk := range all {
		ok := true
		for _, o := range opts {
			ok = ok && o.match(tk)
		}
		if ok {
			found = append(found, tk)
		}
	}
	return found, all
}

func describe(opts []RequireOption) string {
	if len(opts) == 0 {
		return ""
	}
	parts := make([]string, len(opts))
	for i, o := range opts {
		parts[i] = o.what
	}
	return " with " + strings.Join(parts, ", ")
}

// list describes the tasks of a kind, at most ten, for a failure.
func list(kind string, all []*task.Task) string {
	if len(all) == 0 {
		return fmt.Sprintf("no task of kind %q was submitted", kind)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "the tasks of kind %q are:", kind)
	for i, t := range all {
		if i == 10 {
			fmt.Fprintf(&b, "\n\t... and %d more", len(all)-10)
			break
		}
		fmt.Fprintf(&b, "\n\ttask %d, key %q, %s, priority %d, max attempts %d, payload %s",
			t.ID, t.Key, t.Status, t.Priority, t.MaxAttempts, t.Payload)
	}
	return b.String()
}
