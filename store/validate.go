package store

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Limits on what a user gives, the same in every store, in the client and in
// the node, so that a value one accepts no other refuses. They are
// documented in DESIGN §9.
const (
	// MaxNameBytes bounds keys, unique keys, kinds, schedule names and node
	// ids. Each is indexed, printed in every table and carried in every
	// notification: PostgreSQL's btree refuses index rows over about 2,700
	// bytes, and a table with one 80,000-character key is unreadable.
	MaxNameBytes = 512
	// MaxPayloadBytes bounds a task's payload. Payloads travel with every
	// claim; bigger documents belong in the application's own storage,
	// named by the payload.
	MaxPayloadBytes = 1 << 20
	// MinPriority and MaxPriority bound a priority: stores keep it as a
	// 32-bit integer.
	MinPriority = math.MinInt32
	MaxPriority = math.MaxInt32
	// MaxMaxAttempts bounds MaxAttempts: a task retried more often than this
	// is a loop, not a retry policy.
	MaxMaxAttempts = 1000
	// MaxMetadataEntries and MaxMetadataBytes bound a task's metadata (the
	// bytes of its keys and values together). It is read with every claim,
	// like the payload, and holds a trace context or a request id, not
	// data.
	MaxMetadataEntries = 32
	MaxMetadataBytes   = 8 << 10
)

// RunAt must fall within these years: a store's timestamps, and the
// arithmetic on them, hold no more.
const (
	minRunAtYear = 1970
	maxRunAtYear = 9999
)

// InvalidError refuses a value a user gave. It names the value's field and
// the value itself (shortened when long, with control characters and
// invalid bytes escaped), says what is wrong and what would be valid. It
// matches ErrInvalid.
type InvalidError struct {
	Field   string // "key", "payload", "max attempts", ...
	Value   any    // as given; Error shortens and escapes a string
	Problem string // "is empty", "is not valid UTF-8", ...
	Valid   string // what would be accepted
}

func (e *InvalidError) Error() string {
	v := fmt.Sprint(e.Value)
	if s, ok := e.Value.(string); ok {
		v = Shorten(s, 60)
	}
	return fmt.Sprintf("%s %s %s: %s", e.Field, v, e.Problem, e.Valid)
}

// Is makes every *InvalidError match ErrInvalid.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

// Shorten quotes s for a message or a table cell: control characters and
// bytes that are not UTF-8 are escaped, and a value longer than max
// characters keeps its start, followed by an ellipsis and its length.
func Shorten(s string, max int) string {
	r := []rune(s)
	if len(r) <= max {
		return strconv.Quote(s)
	}
	return strconv.Quote(string(r[:max])) + fmt.Sprintf("… (%d bytes)", len(s))
}

// nameValid says what CheckName accepts.
const nameValid = "give at most 512 bytes of valid UTF-8 with no control characters"

// CheckName refuses a key, unique key, kind, schedule name or node id that
// some store could not keep or some table could not print: longer than
// MaxNameBytes, not valid UTF-8, holding a control character, or blank
// (only white space). An empty name is refused only when required: an empty
// key means "no key". field names the value in the error.
func CheckName(field, s string, required bool) error {
	bad := func(problem string) error {
		return &InvalidError{Field: field, Value: s, Problem: problem, Valid: nameValid}
	}
	switch {
	case s == "" && required:
		return &InvalidError{Field: field, Value: s, Problem: "is empty", Valid: nameValid + ", and not empty"}
	case s == "":
		return nil
	case len(s) > MaxNameBytes:
		return bad(fmt.Sprintf("is %d bytes long", len(s)))
	case !utf8.ValidString(s):
		return bad("is not valid UTF-8")
	case strings.TrimSpace(s) == "":
		return bad("is blank")
	}
	for i, r := range s {
		if unicode.IsControl(r) {
			return bad(fmt.Sprintf("holds the control character %U at byte %d", r, i))
		}
	}
	return nil
}

// payloadValid says what CheckPayload accepts.
const payloadValid = "give a JSON document of at most 1 MiB, in UTF-8, without \\u0000 or unpaired surrogate escapes"

// CheckPayload refuses a JSON document some store could not keep: not JSON,
// larger than MaxPayloadBytes, not UTF-8, or holding an escape that
// PostgreSQL's jsonb refuses (\u0000, an unpaired UTF-16 surrogate). Nil or
// empty stands for null and is accepted. field names the document.
func CheckPayload(field string, doc json.RawMessage) error {
	bad := func(problem string) error {
		return &InvalidError{Field: field, Value: string(doc), Problem: problem, Valid: payloadValid}
	}
	switch {
	case len(doc) == 0:
		return nil
	case len(doc) > MaxPayloadBytes:
		return bad(fmt.Sprintf("is %d bytes long", len(doc)))
	case !utf8.Valid(doc):
		return bad("is not valid UTF-8")
	case !json.Valid(doc):
		var v any
		err := json.Unmarshal(doc, &v)
		return bad(fmt.Sprintf("is not valid JSON (%v)", err))
	}
	if problem := badEscape(doc); problem != "" {
		return bad(problem)
	}
	return nil
}

// badEscape finds, in a valid JSON document, a \u escape that PostgreSQL's
// jsonb refuses, and describes it; "" when there is none.
func badEscape(doc []byte) string {
	inString := false
	for i := 0; i < len(doc); i++ {
		switch c := doc[i]; {
		case c == '"':
			inString = !inString
		case c == '\\' && inString:
			if doc[i+1] != 'u' {
				i++ // \" \\ \n ...: skip the escaped character
				continue
			}
			r := hex4(doc[i+2 : i+6])
			switch {
			case r == 0:
				return `holds the escape \u0000, which PostgreSQL cannot store`
			case r >= 0xDC00 && r <= 0xDFFF:
				return fmt.Sprintf(`holds an unpaired surrogate escape \u%04x`, r)
			case r >= 0xD800 && r <= 0xDBFF:
				next := i + 6
				if next+6 > len(doc) || doc[next] != '\\' || doc[next+1] != 'u' {
					return fmt.Sprintf(`holds an unpaired surrogate escape \u%04x`, r)
				}
				if lo := hex4(doc[next+2 : next+6]); lo < 0xDC00 || lo > 0xDFFF {
					return fmt.Sprintf(`holds an unpaired surrogate escape \u%04x`, r)
				}
				i = next + 5
				continue
			}
			i += 5
		}
	}
	return ""
}

// hex4 reads the four hexadecimal digits of a \u escape that json.Valid
// has accepted.
func hex4(b []byte) rune {
	v, _ := strconv.ParseUint(string(b), 16, 32)
	return rune(v)
}

// CheckNewTasks refuses a batch of new tasks that some store could not carry
// out as asked, naming the first bad task by its index (when the batch has
// more than one) and its bad field: a missing kind, a name or payload that
// CheckName or CheckPayload refuses, a priority or MaxAttempts out of range,
// a negative Delay or one given with RunAt, a RunAt outside the years
// 1970-9999, a timeout CheckTimeout refuses, a bucket the fleet does not
// have (numBuckets 0: not checked), a schedule without its tick, or two
// tasks of the batch with one unique key (ErrDuplicate). Every store calls
// it before writing anything, and so do the client and the node, so that
// they all accept the same tasks and a Go caller gets the same typed
// errors as the command line.
func CheckNewTasks(tasks []NewTask, numBuckets int) error {
	seen := make(map[string]int)
	for i, nt := range tasks {
		at := func(err error) error {
			if len(tasks) == 1 {
				return err
			}
			return fmt.Errorf("task at index %d: %w", i, err)
		}
		if err := checkNewTask(nt, numBuckets); err != nil {
			return at(err)
		}
		if nt.UniqueKey != "" {
			if j, dup := seen[nt.UniqueKey]; dup {
				return at(fmt.Errorf("%w: unique key %s is also used by the task at index %d",
					ErrDuplicate, Shorten(nt.UniqueKey, 60), j))
			}
			seen[nt.UniqueKey] = i
		}
	}
	return nil
}

func checkNewTask(nt NewTask, numBuckets int) error {
	if err := CheckName("kind", nt.Kind, true); err != nil {
		return err
	}
	if err := CheckName("key", nt.Key, false); err != nil {
		return err
	}
	if err := CheckName("unique key", nt.UniqueKey, false); err != nil {
		return err
	}
	if err := CheckName("limit key", nt.LimitKey, false); err != nil {
		return err
	}
	if err := CheckResources("resources", nt.Resources); err != nil {
		return err
	}
	if err := CheckPayload("payload", nt.Payload); err != nil {
		return err
	}
	if err := CheckMetadata(nt.Metadata); err != nil {
		return err
	}
	if err := CheckName("schedule", nt.Schedule, false); err != nil {
		return err
	}
	num := func(field string, v any, problem, valid string) error {
		return &InvalidError{Field: field, Value: v, Problem: problem, Valid: valid}
	}
	switch {
	case nt.Priority < MinPriority || nt.Priority > MaxPriority:
		return num("priority", nt.Priority, "is out of range", fmt.Sprintf("give %d to %d", MinPriority, MaxPriority))
	case nt.MaxAttempts < 0 || nt.MaxAttempts > MaxMaxAttempts:
		return num("max attempts", nt.MaxAttempts, "is out of range",
			fmt.Sprintf("give 1 to %d, or 0 for the default of %d", MaxMaxAttempts, DefaultMaxAttempts))
	case nt.Delay < 0:
		return num("delay", nt.Delay, "is negative", "give 0 for none, or a positive duration")
	case nt.Delay > 0 && !nt.RunAt.IsZero():
		return num("delay", nt.Delay, "is given with a run-at time", "give one of them")
	case !nt.RunAt.IsZero() && (nt.RunAt.Year() < minRunAtYear || nt.RunAt.Year() > maxRunAtYear):
		return num("run-at time", nt.RunAt.UTC().Format(time.RFC3339Nano), "is out of range",
			fmt.Sprintf("give a time in the years %d to %d", minRunAtYear, maxRunAtYear))
	case numBuckets > 0 && (nt.Bucket < 0 || nt.Bucket >= numBuckets):
		return num("bucket", nt.Bucket, "does not exist", fmt.Sprintf("this fleet has buckets 0-%d", numBuckets-1))
	case nt.ScheduledFor.IsZero() != (nt.Schedule == ""):
		return num("schedule", nt.Schedule, "and its tick go together", "give both or neither")
	}
	if err := CheckTimeout(nt.Timeout); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// metadataValid says what CheckMetadata accepts.
var metadataValid = fmt.Sprintf("give at most %d entries and %d bytes in all; each key a name (%s), "+
	"each value valid UTF-8 without a NUL", MaxMetadataEntries, MaxMetadataBytes, nameValid)

// CheckMetadata refuses task metadata some store could not keep: more than
// MaxMetadataEntries entries or MaxMetadataBytes bytes, a key CheckName
// refuses (or an empty one), a value that is not UTF-8 or holds a NUL,
// which PostgreSQL's jsonb refuses. Keys are checked in sorted order, so
// that the same bad map always gets the same error.
func CheckMetadata(md map[string]string) error {
	if len(md) > MaxMetadataEntries {
		return &InvalidError{Field: "metadata entry count", Value: len(md), Problem: "is too high", Valid: metadataValid}
	}
	size := 0
	for _, k := range slices.Sorted(maps.Keys(md)) {
		v := md[k]
		if err := CheckName("metadata key", k, true); err != nil {
			return err
		}
		if !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
			return &InvalidError{Field: "metadata value of " + strconv.Quote(k), Value: v,
				Problem: "is not valid UTF-8 or holds a NUL", Valid: metadataValid}
		}
		size += len(k) + len(v)
	}
	if size > MaxMetadataBytes {
		return &InvalidError{Field: "metadata size", Value: size, Problem: "is too large", Valid: metadataValid}
	}
	return nil
}

// NoEmptyMetadata is a copy of md, or nil when md has no entry: every store
// reads back a task given empty metadata as one given none.
func NoEmptyMetadata(md map[string]string) map[string]string {
	if len(md) == 0 {
		return nil
	}
	return maps.Clone(md)
}

// CheckScheduleInput refuses a schedule's user-given values that some store
// could not keep, as CheckNewTasks does for the tasks it fires: its name,
// kind, key, time zone and spec (CheckName), payload (CheckPayload),
// priority and MaxAttempts. The spec's meaning is package schedule's to
// check.
func CheckScheduleInput(sc Schedule) error {
	if err := CheckName("schedule name", sc.Name, true); err != nil {
		return err
	}
	for _, f := range []struct{ field, value string }{
		{"schedule kind", sc.Kind}, {"schedule key", sc.Key}, {"schedule time zone", sc.Timezone}, {"schedule spec", sc.Spec},
	} {
		if err := CheckName(f.field, f.value, false); err != nil {
			return err
		}
	}
	if err := CheckPayload("schedule payload", sc.Payload); err != nil {
		return err
	}
	return checkNewTask(NewTask{Kind: sc.Kind, Priority: sc.Priority, MaxAttempts: sc.MaxAttempts, Timeout: sc.Timeout}, 0)
}
