package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"time"
)

// The documented shapes of what the read commands print under --json: a
// script may rely on every field named here, with its type, and on no
// other. docs/cli.md shows them; TestJSONOutputMatchesItsDocumentedShape
// holds the commands to them.

// jsonType is the type of a field's value.
type jsonType string

const (
	jsonString  jsonType = "string"
	jsonInteger jsonType = "integer"
	jsonBoolean jsonType = "boolean"
	// jsonTimestamp is a time in JSONTimeFormat (RFC 3339 in UTC with six
	// digits of fraction), or null when there is none.
	jsonTimestamp jsonType = "time or null"
	// jsonValue is any JSON value: a payload or result as the task gave it.
	jsonValue   jsonType = "any JSON value"
	jsonStrings jsonType = "array of strings"
	// jsonCounts is an object from names to integers, as resources are.
	jsonCounts  jsonType = "object of integers"
	jsonObjects jsonType = "array of objects"
)

// jsonField is one field of an object. Fields holds the fields of the
// objects of a jsonObjects field.
type jsonField struct {
	Name     string
	Type     jsonType
	Required bool // false: left out when empty
	Fields   []jsonField
	Meaning  string
}

// jsonShape is the output of one read command: an object, or an array of
// objects.
type jsonShape struct {
	Command string // as typed after "worker"
	Array   bool
	Fields  []jsonField
}

func field(name string, t jsonType, meaning string) jsonField {
	return jsonField{Name: name, Type: t, Required: true, Meaning: meaning}
}

func optional(name string, t jsonType, meaning string) jsonField {
	return jsonField{Name: name, Type: t, Meaning: meaning}
}

func objects(name string, required bool, meaning string, fields ...jsonField) jsonField {
	return jsonField{Name: name, Type: jsonObjects, Required: required, Fields: fields, Meaning: meaning}
}

// taskFields are a task's fields, as get and list print them.
var taskFields = []jsonField{
	field("id", jsonInteger, "the task's id"),
	field("kind", jsonString, "the handler that runs it"),
	field("key", jsonString, "routes it to its bucket; empty when none was given"),
	field("bucket", jsonInteger, "the bucket it lives in"),
	field("status", jsonString, "one of the fifteen states (docs/concepts.md)"),
	field("attempt", jsonInteger, "attempts started so far"),
	field("max_attempts", jsonInteger, "attempts before it fails"),
	field("priority", jsonInteger, "higher runs first"),
	field("node", jsonString, "the node of its latest attempt; empty before the first"),
	field("epoch", jsonInteger, "the bucket lease epoch of its latest attempt (the fencing token)"),
	field("payload", jsonValue, "the JSON given to the handler, null when none"),
	field("result", jsonValue, "the JSON the handler returned, null when none"),
	field("error", jsonString, "the latest attempt's error; empty when none"),
	field("schedule", jsonString, "the schedule that fired it; empty when none"),
	optional("unique_key", jsonString, "the key no other unfinished task may hold, when one was given"),
	field("timeout", jsonString, `the per-attempt timeout, e.g. "1.5s"; empty when none`),
	optional("pipeline", jsonInteger, "the pipeline it is a step of"),
	optional("step", jsonString, "the name of its step in that pipeline"),
	optional("progress", jsonValue, "the progress its handler saved, which the next attempt sees"),
	optional("limit_key", jsonString, "the key per-key limits count it under, when one was given"),
	optional("resources", jsonCounts, "what it needs free on a node to start"),
	optional("wait_reason", jsonString, "the latest reason its bucket's holder gave for not starting it"),
	field("scheduled_for", jsonTimestamp, "the schedule tick that fired it"),
	field("run_at", jsonTimestamp, "no sooner than this"),
	field("created_at", jsonTimestamp, "when it was submitted"),
	field("started_at", jsonTimestamp, "when its latest attempt started"),
	field("finished_at", jsonTimestamp, "when it reached a final state"),
}

var eventFields = []jsonField{
	field("seq", jsonInteger, "the event's order within the task"),
	field("from", jsonString, "the state it left"),
	field("to", jsonString, "the state it entered"),
	field("at", jsonTimestamp, "when"),
	field("node", jsonString, "the node that made the change; empty for a client"),
	field("epoch", jsonInteger, "the bucket lease epoch it was made under"),
	field("attempt", jsonInteger, "the attempt it belongs to"),
	field("reason", jsonString, "why, in words"),
	field("error", jsonString, "the attempt's error, when it failed"),
}

// jsonShapes is every read command's output under --json, in the order
// docs/cli.md lists them.
var jsonShapes = []jsonShape{
	{Command: "get", Fields: append(slices.Clone(taskFields),
		optional("waiting", jsonString, "why the task is not running though it could"),
		objects("events", false, "the audit trail, oldest first", eventFields...),
	)},
	{Command: "list", Array: true, Fields: taskFields},
	{Command: "buckets", Array: true, Fields: []jsonField{
		field("bucket", jsonInteger, "the bucket"),
		field("holder", jsonString, "the node holding its lease; empty when none"),
		field("target", jsonString, "the node the fleet's balance gives it to; empty when none in particular"),
		field("successor", jsonString, "the node its holder is handing it to while its tasks finish; empty when none"),
		field("handoff_since", jsonTimestamp, "when that hand-off began; null when none"),
		field("handed_by", jsonString, "the node that handed it to its holder, until the holder takes it up; empty otherwise"),
		field("pin", jsonString, "the node an operator moved it to (buckets move); empty when not pinned"),
		field("epoch", jsonInteger, "its lease epoch, raised on every change of holder"),
		field("expires_at", jsonTimestamp, "when the lease expires unless renewed"),
		field("standby", jsonStrings, "live nodes that declare it and would take it over"),
		field("queued", jsonInteger, "tasks ready to run"),
		field("waiting", jsonInteger, "tasks waiting for a time, a retry or a parent"),
		field("running", jsonInteger, "tasks running"),
	}},
	{Command: "nodes", Array: true, Fields: []jsonField{
		field("id", jsonString, "the node's id"),
		field("incarnation", jsonString, "this run of the node; a restart has a new one"),
		field("buckets", jsonString, "the buckets it declares, e.g. 0-31"),
		field("held", jsonString, "the buckets it holds now"),
		field("share", jsonInteger, "the buckets the fleet's balance gives it; 0 when not live"),
		field("balance", jsonBoolean, "it shares the buckets it declares (false: --no-balance, or an older version)"),
		field("leaving", jsonBoolean, "it is shutting down and handing its buckets on"),
		field("kinds", jsonStrings, "the kinds it runs"),
		field("version", jsonString, "its build"),
		field("alive", jsonBoolean, "its liveness has not expired"),
		field("started_at", jsonTimestamp, "when it started"),
		field("heartbeat_at", jsonTimestamp, "its latest liveness renewal"),
		field("stopped_at", jsonTimestamp, "when it stopped; null while it runs"),
	}},
	{Command: "bucket-of", Fields: []jsonField{
		field("key", jsonString, "the key"),
		field("bucket", jsonInteger, "the bucket it hashes to"),
		field("holder", jsonString, "the node holding that bucket; empty when none or without a database"),
	}},
	{Command: "schedule list", Array: true, Fields: []jsonField{
		field("name", jsonString, "the schedule's name"),
		field("spec", jsonString, `a cron expression, or "@every D"`),
		field("timezone", jsonString, "the cron expression's time zone; empty for UTC"),
		field("catch_up", jsonString, "what a missed tick does"),
		field("kind", jsonString, "the kind of the tasks it fires"),
		field("key", jsonString, "the key of the tasks it fires"),
		field("bucket", jsonInteger, "the bucket whose holder fires it"),
		field("payload", jsonValue, "the tasks' payload, null when none"),
		field("priority", jsonInteger, "the tasks' priority"),
		field("max_attempts", jsonInteger, "the tasks' attempts"),
		field("timeout", jsonString, "the tasks' per-attempt timeout; empty when none"),
		field("enabled", jsonBoolean, "false while paused"),
		field("next_fire_at", jsonTimestamp, "its next tick"),
		field("last_fire_at", jsonTimestamp, "its latest tick fired"),
		field("holder", jsonString, "the node that fires it; empty when none"),
		optional("waiting", jsonString, "why it would not fire on time"),
	}},
	{Command: "limit list", Array: true, Fields: []jsonField{
		field("name", jsonString, "the limit's name"),
		field("kind", jsonString, "the kind it limits"),
		field("per", jsonString, `"key" or "fleet"`),
		optional("concurrency", jsonInteger, "tasks running at once"),
		optional("rate", jsonInteger, "starts per period"),
		optional("period", jsonString, "the rate's period"),
		optional("burst", jsonInteger, "starts allowed at once above the rate"),
		field("created_at", jsonTimestamp, "when it was set first"),
		field("updated_at", jsonTimestamp, "when it was last set"),
		objects("holders", true, "each node's use of the limit, from the running tasks of its kind",
			field("node", jsonString, "the node"),
			field("running", jsonInteger, "tasks of the kind it runs"),
			field("keys", jsonInteger, "limit keys among them"),
			field("keys_at_limit", jsonInteger, "keys at a per-key concurrency limit"),
		),
		objects("shares", true, "each holder's share of a fleet-wide limit",
			field("node", jsonString, "the node"),
			field("owner", jsonString, "its incarnation"),
			field("share", jsonInteger, "how many it may run"),
			field("demand", jsonInteger, "how many it would run"),
			field("expires_at", jsonTimestamp, "when the share lapses unless renewed"),
			field("alive", jsonBoolean, "the share has not lapsed"),
		),
	}},
	{Command: "pipeline get", Fields: []jsonField{
		field("id", jsonInteger, "the pipeline's id"),
		field("name", jsonString, "its name"),
		field("key", jsonString, "the key all its steps share"),
		field("bucket", jsonInteger, "the bucket they live in"),
		field("status", jsonString, "running, succeeded or failed (every step finished, not all succeeded)"),
		field("created_at", jsonTimestamp, "when it was submitted"),
		objects("tasks", true, "its steps",
			field("name", jsonString, "the step's name"),
			field("task_id", jsonInteger, "its task"),
			field("kind", jsonString, "its kind"),
			field("status", jsonString, "its task's state"),
			field("attempt", jsonInteger, "attempts started"),
			field("tries", jsonInteger, "the tasks the step has had: 1, plus one per retry that ran it again"),
			objects("depends_on", true, "the steps it waits for",
				field("step", jsonString, "the parent step"),
				optional("on", jsonString, "the parent outcome it needs; success when left out"),
			),
			optional("error", jsonString, "its latest error"),
			optional("result", jsonValue, "its result"),
			field("started_at", jsonTimestamp, "when its latest attempt started"),
			field("finished_at", jsonTimestamp, "when it finished"),
		),
	}},
}

// check reports how v, an output decoded with UseNumber, departs from the
// shape: documented fields missing or of another type, fields the shape
// does not name.
func (s jsonShape) check(v any) []string {
	if s.Array {
		items, ok := v.([]any)
		if !ok {
			return []string{fmt.Sprintf("the output is %s, not an array", typeName(v))}
		}
		var problems []string
		for i, item := range items {
			for _, p := range checkObject(s.Fields, item) {
				problems = append(problems, fmt.Sprintf("[%d]%s", i, p))
			}
		}
		return problems
	}
	return checkObject(s.Fields, v)
}

func checkObject(fields []jsonField, v any) []string {
	obj, ok := v.(map[string]any)
	if !ok {
		return []string{fmt.Sprintf(": %s, not an object", typeName(v))}
	}
	var problems []string
	for _, f := range fields {
		value, present := obj[f.Name]
		if !present {
			if f.Required {
				problems = append(problems, fmt.Sprintf(".%s: missing", f.Name))
			}
			continue
		}
		for _, p := range f.check(value) {
			problems = append(problems, "."+f.Name+p)
		}
	}
	for name := range obj {
		if !slices.ContainsFunc(fields, func(f jsonField) bool { return f.Name == name }) {
			problems = append(problems, fmt.Sprintf(".%s: not documented", name))
		}
	}
	slices.Sort(problems)
	return problems
}

func (f jsonField) check(v any) []string {
	wrong := []string{fmt.Sprintf(": %s, want %s", typeName(v), f.Type)}
	switch f.Type {
	case jsonString:
		if _, ok := v.(string); !ok {
			return wrong
		}
	case jsonInteger:
		if !isInteger(v) {
			return wrong
		}
	case jsonBoolean:
		if _, ok := v.(bool); !ok {
			return wrong
		}
	case jsonTimestamp:
		if v == nil {
			return nil
		}
		s, ok := v.(string)
		if !ok {
			return wrong
		}
		if t, err := time.Parse(JSONTimeFormat, s); err != nil || !jsonTimePattern.MatchString(s) || t.IsZero() {
			return []string{fmt.Sprintf(": %q is not a time as %s", s, JSONTimeFormat)}
		}
	case jsonValue:
		// Any value is one.
	case jsonStrings:
		items, ok := v.([]any)
		if !ok {
			return wrong
		}
		for i, item := range items {
			if _, ok := item.(string); !ok {
				return []string{fmt.Sprintf("[%d]: %s, want string", i, typeName(item))}
			}
		}
	case jsonCounts:
		obj, ok := v.(map[string]any)
		if !ok {
			return wrong
		}
		for name, n := range obj {
			if !isInteger(n) {
				return []string{fmt.Sprintf(".%s: %s, want integer", name, typeName(n))}
			}
		}
	case jsonObjects:
		items, ok := v.([]any)
		if !ok {
			return wrong
		}
		var problems []string
		for i, item := range items {
			for _, p := range checkObject(f.Fields, item) {
				problems = append(problems, fmt.Sprintf("[%d]%s", i, p))
			}
		}
		return problems
	default:
		return []string{fmt.Sprintf(": the shape names an unknown type %q", f.Type)}
	}
	return nil
}

// jsonTimePattern is JSONTimeFormat's one width: six digits of fraction,
// and Z.
var jsonTimePattern = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$`)

func isInteger(v any) bool {
	n, ok := v.(json.Number)
	if !ok {
		return false
	}
	_, err := n.Int64()
	return err == nil
}

func typeName(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case string:
		return "string"
	case bool:
		return "boolean"
	case json.Number:
		if isInteger(v) {
			return "integer"
		}
		return "number"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}
