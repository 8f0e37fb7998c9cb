package flotilla

import (
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/flotilla-dev/flotilla/store"
)

// SubmitOption sets what a submit does: a field of the task (WithKey,
// WithPriority, ...), applied over the request given, or a check it relaxes
// (AllowUnowned, AllowUnknownKind). Every submit takes them: SubmitArgs and
// NewRequest, Submit and SubmitMany (where a field option applies to every
// task), and the pipeline calls (which take only the checks).
type SubmitOption func(*submitOptions)

type submitOptions struct {
	allowUnowned     bool
	allowUnknownKind bool
	// fields set the task's fields; named lists the options that gave
	// them, for the calls they do not apply to.
	fields []func(*TaskRequest)
	named  []string
}

func (o *submitOptions) field(name string, set func(*TaskRequest)) {
	o.fields = append(o.fields, set)
	o.named = append(o.named, name)
}

func newSubmitOptions(opts []SubmitOption) submitOptions {
	var o submitOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// apply sets the options' fields on r, in the order they were given.
func (o *submitOptions) apply(r TaskRequest) TaskRequest {
	for _, set := range o.fields {
		set(&r)
	}
	return r
}

// noFields refuses field options where there is no task to set them on.
func (o *submitOptions) noFields(call, instead string) error {
	if len(o.named) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s does not take %s: %s", store.ErrInvalid, call, strings.Join(o.named, ", "), instead)
}

// AllowUnowned accepts a task whose bucket no live node holds; it waits
// until a node takes the bucket.
func AllowUnowned() SubmitOption { return func(o *submitOptions) { o.allowUnowned = true } }

// AllowUnknownKind accepts a task whose kind the bucket's holder does not
// run; it waits until a node that runs it holds the bucket.
func AllowUnknownKind() SubmitOption { return func(o *submitOptions) { o.allowUnknownKind = true } }

// WithKey sets the task's key: it picks the task's bucket, so tasks of one
// key are claimed by one node, in priority and submit order. Without a key
// the task goes to a bucket a live node serves, at random.
func WithKey(key string) SubmitOption {
	return func(o *submitOptions) { o.field("WithKey", func(r *TaskRequest) { r.Key = key }) }
}

// WithPriority sets the task's priority: higher runs first, FIFO within a
// priority. The default is 0.
func WithPriority(priority int) SubmitOption {
	return func(o *submitOptions) { o.field("WithPriority", func(r *TaskRequest) { r.Priority = priority }) }
}

// WithMaxAttempts sets how many attempts the task has before it fails
// (store.DefaultMaxAttempts when not given).
func WithMaxAttempts(n int) SubmitOption {
	return func(o *submitOptions) { o.field("WithMaxAttempts", func(r *TaskRequest) { r.MaxAttempts = n }) }
}

// WithRunAt makes the task wait until at. It replaces a WithDelay given
// before it.
func WithRunAt(at time.Time) SubmitOption {
	return func(o *submitOptions) {
		o.field("WithRunAt", func(r *TaskRequest) { r.RunAt, r.Delay = at, 0 })
	}
}

// WithDelay makes the task wait d from the database's now. It replaces a
// WithRunAt given before it.
func WithDelay(d time.Duration) SubmitOption {
	return func(o *submitOptions) {
		o.field("WithDelay", func(r *TaskRequest) { r.Delay, r.RunAt = d, time.Time{} })
	}
}

// WithTimeout bounds each attempt: its handler's context ends with cause
// node.ErrTimeout after d (whole milliseconds; 0 means none).
func WithTimeout(d time.Duration) SubmitOption {
	return func(o *submitOptions) { o.field("WithTimeout", func(r *TaskRequest) { r.Timeout = d }) }
}

// WithUniqueKey refuses the task (store.ErrDuplicate) while an unfinished
// task has the same unique key.
func WithUniqueKey(key string) SubmitOption {
	return func(o *submitOptions) { o.field("WithUniqueKey", func(r *TaskRequest) { r.UniqueKey = key }) }
}

// WithLimitKey sets the key per-key limits count the task under (its key by
// default). It then picks the task's bucket instead of the key, so that one
// node enforces each limit key.
func WithLimitKey(key string) SubmitOption {
	return func(o *submitOptions) { o.field("WithLimitKey", func(r *TaskRequest) { r.LimitKey = key }) }
}

// WithResources sets what the task needs free on a node to start, against
// the node's node.Config.Capacity.
func WithResources(res store.Resources) SubmitOption {
	return func(o *submitOptions) {
		o.field("WithResources", func(r *TaskRequest) { r.Resources = maps.Clone(res) })
	}
}

// WithMetadata adds entries to the task's metadata, which travels with the
// task apart from its payload (store.CheckMetadata says what fits). Package
// otel keeps the submitter's trace context there.
func WithMetadata(md map[string]string) SubmitOption {
	return func(o *submitOptions) {
		o.field("WithMetadata", func(r *TaskRequest) {
			if r.Metadata == nil {
				r.Metadata = make(map[string]string, len(md))
			} else {
				r.Metadata = maps.Clone(r.Metadata)
			}
			maps.Copy(r.Metadata, md)
		})
	}
}
