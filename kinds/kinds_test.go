package kinds

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/flotilla-dev/flotilla/task"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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
