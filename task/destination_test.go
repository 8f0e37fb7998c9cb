package task

import (
	"errors"
	"testing"
)

func TestDestinationAppliesThePendingRequests(t *testing.T) {
	for _, c := range []struct {
		from         Status
		stop, pause  bool
		want, expect Status
	}{
		{from: Running, want: Retrying, expect: Retrying},
		{from: Running, stop: true, want: Retrying, expect: Stopped},
		{from: Running, stop: true, want: Failed, expect: Stopped},
		{from: Running, stop: true, want: Queued, expect: Stopped},
		{from: Running, stop: true, want: Succeeded, expect: Succeeded}, // the work was done
		{from: Stopping, want: Lost, expect: Stopped},
		{from: Running, pause: true, want: Retrying, expect: Paused},
		{from: Running, pause: true, want: Queued, expect: Paused},
		{from: Running, pause: true, want: Failed, expect: Failed},
		{from: Pausing, want: Queued, expect: Paused},
		{from: Pausing, stop: true, want: Paused, expect: Stopped}, // a stop wins over the pause
		{from: Running, pause: true, stop: true, want: Retrying, expect: Stopped},
	} {
		tk := &Task{ID: 1, Status: c.from, StopRequested: c.stop, PauseRequested: c.pause}
		got, err := Destination(tk, c.want)
		if err != nil || got != c.expect {
			t.Errorf("%s (stop %v, pause %v) asked for %s: %s %v, want %s", c.from, c.stop, c.pause, c.want, got, err, c.expect)
		}
	}
	var te *TransitionError
	if _, err := Destination(&Task{ID: 1, Status: Queued, StopRequested: true}, Succeeded); !errors.As(err, &te) {
		t.Errorf("queued -> succeeded: %v, want a *TransitionError (requests apply to active tasks only)", err)
	}
}

func TestResumeDestinationSendsAWaitingStepBackToPending(t *testing.T) {
	cases := []struct {
		from, want Status
		depsLeft   int
		to         Status
	}{
		{Paused, Queued, 2, Pending},
		{Paused, Scheduled, 1, Pending},
		{Paused, Queued, 0, Queued},
		{Paused, Scheduled, 0, Scheduled},
		{Paused, Cancelled, 3, Cancelled},
		{Queued, Paused, 0, Paused},
	}
	for _, c := range cases {
		if got := ResumeDestination(c.from, c.want, c.depsLeft); got != c.to {
			t.Errorf("ResumeDestination(%s, %s, %d) = %s, want %s", c.from, c.want, c.depsLeft, got, c.to)
		}
	}
}
