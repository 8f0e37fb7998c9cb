package schedule

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
)

// ErrInvalidDefinition is matched, through errors.Is, by every error of
// Definition.Resolve that is not about the expression itself (those match
// ErrInvalidSpec).
var ErrInvalidDefinition = errors.New("invalid schedule definition")

// Definition is a schedule as an application declares it in code or an
// operator adds it with `worker schedule add`.
type Definition struct {
	// Name identifies the schedule across the fleet.
	Name string
	// Cron is a cron expression (5 fields, or 6 with seconds first) or a
	// descriptor such as "@hourly". Exactly one of Cron and Every is set.
	Cron string
	// Every is a fixed period of whole seconds, at least MinEvery; its
	// ticks are anchored at the Unix epoch, so a period of one minute ticks
	// at whole minutes.
	Every time.Duration
	// Timezone is the IANA zone the cron fields are read in; "" is UTC.
	Timezone string
	// CatchUp is the policy for ticks missed while no node held the
	// schedule's bucket: Skip (the default) or Latest.
	CatchUp string

	// The task each tick fires.
	Kind string
	// Key routes the schedule, and the tasks it fires, to a bucket. It
	// defaults to Name.
	Key         string
	Payload     json.RawMessage
	Priority    int
	MaxAttempts int           // 0: the store's default
	Timeout     time.Duration // 0: none

	// Paused creates the schedule paused. It changes an existing schedule
	// only when the caller says so (store.UpsertReplaceEnabled, or
	// `worker schedule add --replace --paused`); a node's declaration
	// never does, so that an operator's pause outlives restarts.
	Paused bool
}

// Expr is the definition's schedule expression: Cron, or "@every" Every.
func (d Definition) Expr() string {
	if d.Every != 0 {
		return "@every " + formatDuration(d.Every)
	}
	return d.Cron
}

// Resolve checks d and returns the schedule to store, routed by policy and
// due first at the first tick after now. Every refusal names the bad value
// and what would be valid.
func (d Definition) Resolve(policy bucket.Policy, now time.Time) (store.Schedule, error) {
	bad := func(format string, args ...any) (store.Schedule, error) {
		return store.Schedule{}, fmt.Errorf("schedule %q: %s: %w", d.Name, fmt.Sprintf(format, args...), ErrInvalidDefinition)
	}
	switch {
	case strings.TrimSpace(d.Name) == "":
		return store.Schedule{}, fmt.Errorf("schedule: the name is empty: %w", ErrInvalidDefinition)
	case d.Name != strings.TrimSpace(d.Name):
		return bad("the name has leading or trailing spaces")
	case d.Cron == "" && d.Every == 0:
		return bad("no timing: give a cron expression or a period (every)")
	case d.Cron != "" && d.Every != 0:
		return bad("both a cron expression (%q) and a period (%s): give one", d.Cron, d.Every)
	case d.Every != 0 && d.Every < MinEvery:
		return bad("period %s is shorter than the minimum of %s", d.Every, MinEvery)
	case d.Every%time.Second != 0:
		return bad("period %s is not a whole number of seconds: give whole seconds, such as %s or %s",
			d.Every, formatDuration(d.Every.Truncate(time.Second)), formatDuration(d.Every.Truncate(time.Second)+time.Second))
	case d.Kind == "":
		return bad("no task kind")
	case d.MaxAttempts < 0:
		return bad("max attempts %d is negative: give 0 for the default, or a positive count", d.MaxAttempts)
	case d.Timeout < 0:
		return bad("timeout %s is negative: give 0 for none, or a positive duration", d.Timeout)
	case len(d.Payload) > 0 && !json.Valid(d.Payload):
		return bad("the payload is not valid JSON: %s", abbreviate(string(d.Payload)))
	}
	policyName, err := ParsePolicy(d.CatchUp)
	if err != nil {
		return bad("%v", err)
	}
	spec, err := Parse(d.Expr(), d.Timezone)
	if err != nil {
		return store.Schedule{}, fmt.Errorf("schedule %q: %w", d.Name, err)
	}
	key := d.Key
	if key == "" {
		key = d.Name
	}
	return store.Schedule{
		Name: d.Name, Spec: spec.String(), Timezone: d.Timezone, CatchUp: policyName,
		Kind: d.Kind, Key: key, Bucket: policy.Of(key), Payload: d.Payload, Priority: d.Priority,
		MaxAttempts: d.MaxAttempts, Timeout: d.Timeout, Enabled: !d.Paused, NextFireAt: spec.First(now),
	}, nil
}

// abbreviate shortens s for an error message.
func abbreviate(s string) string {
	const max = 60
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}
