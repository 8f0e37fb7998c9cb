package store_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/flotilla-dev/flotilla/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestCheckNewTasksRefusesWhatNoStoreCouldKeep(t *testing.T) {
	ok := store.NewTask{Kind: "noop", Key: "k", Bucket: 1}
	with := func(change func(*store.NewTask)) store.NewTask {
		nt := ok
		change(&nt)
		return nt
	}
	tests := []struct {
		name     string
		task     store.NewTask
		mentions []string
	}{
		{"no kind", with(func(nt *store.NewTask) { nt.Kind = "" }), []string{`kind "" is empty`}},
		{"kind with a newline", with(func(nt *store.NewTask) { nt.Kind = "no\nop" }), []string{`kind "no\nop"`, "control character U+000A at byte 2"}},
		{"key not UTF-8", with(func(nt *store.NewTask) { nt.Key = "a\xffb" }), []string{`key "a\xffb" is not valid UTF-8`}},
		{"key too long", with(func(nt *store.NewTask) { nt.Key = strings.Repeat("k", 4000) }), []string{"(4000 bytes)", "is 4000 bytes long", "at most 512 bytes"}},
		{"blank key", with(func(nt *store.NewTask) { nt.Key = "  " }), []string{`key "  " is blank`}},
		{"key with a NUL", with(func(nt *store.NewTask) { nt.Key = "a\x00" }), []string{`key "a\x00"`, "U+0000"}},
		{"unique key too long", with(func(nt *store.NewTask) { nt.UniqueKey = strings.Repeat("u", 513) }), []string{"unique key", "513 bytes"}},
		{"payload NUL escape", with(func(nt *store.NewTask) { nt.Payload = json.RawMessage(`{"a":"x\u0000"}`) }), []string{`\u0000`}},
		{"payload NUL in a key", with(func(nt *store.NewTask) { nt.Payload = json.RawMessage(`{"\u0000":1}`) }), []string{`\u0000`}},
		{"payload lone surrogate", with(func(nt *store.NewTask) { nt.Payload = json.RawMessage(`"\udc00"`) }), []string{`unpaired surrogate escape \udc00`}},
		{"payload high surrogate alone", with(func(nt *store.NewTask) { nt.Payload = json.RawMessage(`"\ud800x"`) }), []string{`unpaired surrogate escape \ud800`}},
		{"payload not JSON", with(func(nt *store.NewTask) { nt.Payload = json.RawMessage(`{"a":`) }), []string{"is not valid JSON"}},
		{"payload not UTF-8", with(func(nt *store.NewTask) { nt.Payload = json.RawMessage("\"\xff\"") }), []string{"not valid UTF-8"}},
		{"payload too big", with(func(nt *store.NewTask) {
			nt.Payload = json.RawMessage(`"` + strings.Repeat("p", store.MaxPayloadBytes) + `"`)
		}), []string{"is 1048578 bytes long", "at most 1 MiB"}},
		{"priority", with(func(nt *store.NewTask) { nt.Priority = 1 << 40 }), []string{"priority 1099511627776", "-2147483648 to 2147483647"}},
		{"negative max attempts", with(func(nt *store.NewTask) { nt.MaxAttempts = -1 }), []string{"max attempts -1 is out of range"}},
		{"too many attempts", with(func(nt *store.NewTask) { nt.MaxAttempts = 1001 }), []string{"1001", "give 1 to 1000"}},
		{"negative delay", with(func(nt *store.NewTask) { nt.Delay = -time.Second }), []string{"delay -1s is negative"}},
		{"delay and run-at", with(func(nt *store.NewTask) { nt.Delay = time.Second; nt.RunAt = time.Now() }), []string{"give one of them"}},
		{"run-at year 10000", with(func(nt *store.NewTask) { nt.RunAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) }), []string{"years 1970 to 9999"}},
		{"bucket", with(func(nt *store.NewTask) { nt.Bucket = 64 }), []string{"bucket 64 does not exist", "0-63"}},
		{"timeout", with(func(nt *store.NewTask) { nt.Timeout = time.Nanosecond }), []string{"timeout 1ns"}},
		{"schedule without tick", with(func(nt *store.NewTask) { nt.Schedule = "s" }), []string{"give both or neither"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := store.CheckNewTasks([]store.NewTask{tt.task}, 64)
			if !errors.Is(err, store.ErrInvalid) {
				t.Fatalf("CheckNewTasks = %v, want store.ErrInvalid", err)
			}
			for _, want := range tt.mentions {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("%q does not say %q", err, want)
				}
			}
		})
	}
}

func TestCheckNewTasksAcceptsTheLimits(t *testing.T) {
	good := []store.NewTask{
		{Kind: "noop"},
		{Kind: "noop", Key: strings.Repeat("é", store.MaxNameBytes/2), UniqueKey: "u1"},
		{Kind: "noop", Key: "-starts-with-a-dash", Payload: json.RawMessage(`{"a":"\\u0000 is text here","b":"\ud83d\ude00"}`)},
		{Kind: "noop", Payload: json.RawMessage(`"` + strings.Repeat("p", store.MaxPayloadBytes-2) + `"`)},
		{Kind: "noop", Priority: store.MinPriority, MaxAttempts: store.MaxMaxAttempts, Timeout: time.Millisecond},
		{Kind: "noop", RunAt: time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC), Bucket: 63},
	}
	if err := store.CheckNewTasks(good, 64); err != nil {
		t.Fatal(err)
	}
}

func TestCheckNewTasksNamesTheIndexAndRefusesAUniqueKeyGivenTwice(t *testing.T) {
	err := store.CheckNewTasks([]store.NewTask{{Kind: "noop", UniqueKey: "u"}, {Kind: "noop", UniqueKey: "u"}}, 0)
	if !errors.Is(err, store.ErrDuplicate) || !strings.Contains(err.Error(), "task at index 1") ||
		!strings.Contains(err.Error(), "index 0") {
		t.Errorf("CheckNewTasks = %v, want store.ErrDuplicate naming indexes 1 and 0", err)
	}
	err = store.CheckNewTasks([]store.NewTask{{Kind: "noop"}, {Kind: ""}}, 0)
	var ie *store.InvalidError
	if !errors.As(err, &ie) || ie.Field != "kind" || !strings.Contains(err.Error(), "task at index 1") {
		t.Errorf("CheckNewTasks = %v, want an *InvalidError for the kind of the task at index 1", err)
	}
}

func TestShorten(t *testing.T) {
	if got := store.Shorten("a\tb", 10); got != `"a\tb"` {
		t.Errorf("Shorten = %s", got)
	}
	if got := store.Shorten(strings.Repeat("x", 100), 5); got != `"xxxxx"… (100 bytes)` {
		t.Errorf("Shorten = %s", got)
	}
}

func TestCheckScheduleInput(t *testing.T) {
	ok := store.Schedule{Name: "nightly", Spec: "0 3 * * *", Kind: "noop", Key: "nightly"}
	if err := store.CheckScheduleInput(ok); err != nil {
		t.Fatal(err)
	}
	for name, change := range map[string]func(*store.Schedule){
		"name":         func(sc *store.Schedule) { sc.Name = strings.Repeat("n", 600) },
		"no name":      func(sc *store.Schedule) { sc.Name = "" },
		"key":          func(sc *store.Schedule) { sc.Key = "a\xff" },
		"payload":      func(sc *store.Schedule) { sc.Payload = json.RawMessage(`"\u0000"`) },
		"max attempts": func(sc *store.Schedule) { sc.MaxAttempts = -1 },
	} {
		sc := ok
		change(&sc)
		if err := store.CheckScheduleInput(sc); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("%s: %v, want store.ErrInvalid", name, err)
		}
	}
}
