package kinds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"

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
