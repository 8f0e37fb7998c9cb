package kinds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// testHelperEnv names the mode in which a test runs this test binary again
// as a process of its own (a node whose state the test process must not
// take on), instead of running the tests.
const testHelperEnv = "KINDS_TEST_HELPER"

// testHelpers are those modes, registered by the tests that use them.
var testHelpers = map[string]func() error{}

func TestMain(m *testing.M) {
	if mode := os.Getenv(testHelperEnv); mode != "" {
		helper, ok := testHelpers[mode]
		if !ok {
			fmt.Fprintf(os.Stderr, "%s=%s: no such test helper\n", testHelperEnv, mode)
			os.Exit(2)
		}
		if err := helper(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

func TestSleepHonoursItsContext(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	stop := errors.New("stopped by operator")
	cancel(stop)
	err := Sleep(ctx, &task.Task{Kind: "sleep", Payload: json.RawMessage(`{"duration":"1h"}`)})
	if !errors.Is(err, stop) {
		t.Errorf("Sleep with a cancelled context returned %v, want the cause", err)
	}
}

func TestSleepFinishes(t *testing.T) {
	tk := &task.Task{Kind: "sleep", Payload: json.RawMessage(`{"duration":"1ms"}`)}
	if err := Sleep(context.Background(), tk); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(tk.Result), "1ms") {
		t.Errorf("result %s", tk.Result)
	}
}

func TestSleepRefusesABadDuration(t *testing.T) {
	err := Sleep(context.Background(), &task.Task{Kind: "sleep", Payload: json.RawMessage(`{"duration":"soon"}`)})
	if err == nil || !strings.Contains(err.Error(), `"soon"`) {
		t.Errorf("err = %v, want it to name the bad duration", err)
	}
}

func TestFailUntilAttempt(t *testing.T) {
	for attempt, wantErr := range map[int]bool{1: true, 2: true, 3: false, 4: false} {
		err := Fail(context.Background(), &task.Task{Kind: "fail", Attempt: attempt, Payload: json.RawMessage(`{"until_attempt":3}`)})
		if (err != nil) != wantErr {
			t.Errorf("attempt %d: err = %v, want error %v", attempt, err, wantErr)
		}
	}
	if err := Fail(context.Background(), &task.Task{Kind: "fail", Attempt: 9}); err == nil {
		t.Error("fail without a payload succeeded; it should fail every attempt")
	}
}

func TestNoop(t *testing.T) {
	if err := Noop(context.Background(), &task.Task{}); err != nil {
		t.Fatal(err)
	}
}

func TestCheckPayloadRefusesWhatAStockKindCannotUse(t *testing.T) {
	tests := []struct {
		kind, payload string
		ok            bool
		mentions      string
	}{
		{"sleep", `{"duration":"2s"}`, true, ""},
		{"sleep", `{"duration":"banana"}`, false, `"banana" is not a duration`},
		{"sleep", `{"duration":"-1s"}`, false, `"-1s" is not a duration`},
		{"sleep", `{"durration":"1s"}`, false, `unknown field "durration"`},
		{"sleep", ``, false, `"" is not a duration`},
		{"fail", `{"until_attempt":2}`, true, ""},
		{"fail", ``, true, ""},
		{"fail", `{"until_attempt":-1}`, false, "until_attempt -1 is negative"},
		{"fail", `{"until_attempt":"x"}`, false, "does not decode"},
		{"exec", `{"argv":["/bin/echo"]}`, true, ""},
		{"exec", `{"argv":[]}`, false, "no command"},
		{"exec", `{}`, false, "no command"},
		{"noop", `{"anything":1}`, true, ""},
		{"app-kind", `{"anything":1}`, true, ""},
	}
	for _, tt := range tests {
		err := CheckPayload(tt.kind, json.RawMessage(tt.payload))
		if tt.ok {
			if err != nil {
				t.Errorf("%s %s: %v, want accepted", tt.kind, tt.payload, err)
			}
			continue
		}
		if !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), tt.mentions) {
			t.Errorf("%s %s: %v, want store.ErrInvalid saying %q", tt.kind, tt.payload, err, tt.mentions)
		}
	}
}

// pauseHooks is an attempt whose pause was requested: Checkpoint answers
// ErrPaused, and SaveProgress keeps what it is given.
type pauseHooks struct{ saved json.RawMessage }

func (h *pauseHooks) Checkpoint(context.Context) error { return task.ErrPaused }
func (h *pauseHooks) SaveProgress(_ context.Context, p json.RawMessage) error {
	h.saved = p
	return nil
}

func TestSleepPausesAtACheckpointAndResumesWithTheRest(t *testing.T) {
	tk := &task.Task{Kind: "sleep", Payload: json.RawMessage(`{"duration":"1h"}`)}
	hooks := &pauseHooks{}
	tk.BindAttempt(hooks)
	if err := Sleep(context.Background(), tk); !errors.Is(err, task.ErrPaused) {
		t.Fatalf("Sleep with a pause requested: %v, want task.ErrPaused", err)
	}
	var p SleepProgress
	if err := json.Unmarshal(hooks.saved, &p); err != nil || p.Slept == "" {
		t.Fatalf("saved progress %s: %v", hooks.saved, err)
	}
	// The attempt after the resume sleeps what is left: of 1h, with 1h
	// slept already, nothing.
	resumed := &task.Task{Kind: "sleep", Payload: json.RawMessage(`{"duration":"1h"}`),
		Progress: json.RawMessage(`{"slept":"1h"}`)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := Sleep(ctx, resumed); err != nil {
		t.Fatalf("resumed Sleep: %v, want it done at once", err)
	}
}
