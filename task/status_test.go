package task

import (
	"errors"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// expected is DESIGN §4 written out a second time, pair by pair, so that a
// change to the table in status.go is caught here.
var expected = map[Status]string{
	Pending:   "queued scheduled skipped cancelled paused",
	Scheduled: "running paused cancelled",
	Queued:    "running paused cancelled",
	Running:   "succeeded failed timed_out retrying stopping pausing stopped lost queued paused",
	Stopping:  "stopped succeeded",
	Pausing:   "paused succeeded failed timed_out retrying lost stopping stopped",
	Paused:    "queued scheduled cancelled pending skipped",
	Retrying:  "running paused cancelled",
}

func TestEveryPairAgainstTheTable(t *testing.T) {
	if got := len(All()); got != 15 {
		t.Fatalf("All() has %d states, want 15", got)
	}
	for _, from := range All() {
		allowed := map[Status]bool{}
		for _, s := range strings.Fields(expected[from]) {
			allowed[Status(s)] = true
		}
		for _, to := range All() {
			if got, want := CanTransition(from, to), allowed[to]; got != want {
				t.Errorf("CanTransition(%s, %s) = %v, want %v", from, to, got, want)
			}
		}
	}
}

func TestTerminalStates(t *testing.T) {
	want := "succeeded failed timed_out stopped cancelled lost skipped"
	var got []string
	for _, s := range TerminalStates() {
		got = append(got, string(s))
	}
	if strings.Join(got, " ") != want {
		t.Errorf("terminal states = %v, want %s", got, want)
	}
	for _, s := range TerminalStates() {
		for _, to := range All() {
			if CanTransition(s, to) {
				t.Errorf("terminal %s may move to %s", s, to)
			}
		}
	}
	if Status("bogus").Terminal() {
		t.Error("an unknown status reports terminal")
	}
}

func TestActiveAndClaimable(t *testing.T) {
	for _, s := range All() {
		wantActive := s == Running || s == Stopping || s == Pausing
		if s.Active() != wantActive {
			t.Errorf("%s.Active() = %v", s, s.Active())
		}
		wantClaimable := s == Queued || s == Scheduled || s == Retrying
		if s.Claimable() != wantClaimable {
			t.Errorf("%s.Claimable() = %v", s, s.Claimable())
		}
		// Every claimable state can become running, and only those can.
		if CanTransition(s, Running) != wantClaimable {
			t.Errorf("CanTransition(%s, running) disagrees with Claimable", s)
		}
	}
}

func TestParseStatus(t *testing.T) {
	for _, s := range All() {
		got, err := ParseStatus(" " + strings.ToUpper(string(s)) + " ")
		if err != nil || got != s {
			t.Errorf("ParseStatus(%q) = %q, %v", s, got, err)
		}
	}
	_, err := ParseStatus("done")
	if err == nil || !strings.Contains(err.Error(), `"done"`) || !strings.Contains(err.Error(), "succeeded") {
		t.Errorf("ParseStatus(done) error = %v; want it to name the input and the valid statuses", err)
	}
}

func TestTransitionErrorNamesTheWayOut(t *testing.T) {
	var err error = &TransitionError{ID: 7, From: Queued, To: Succeeded}
	var te *TransitionError
	if !errors.As(err, &te) {
		t.Fatal("errors.As failed")
	}
	msg := err.Error()
	for _, want := range []string{"task 7", "queued", "succeeded", "running, paused, cancelled"} {
		if !strings.Contains(msg, want) {
			t.Errorf("%q does not mention %q", msg, want)
		}
	}
	final := (&TransitionError{ID: 8, From: Lost, To: Queued}).Error()
	if !strings.Contains(final, "final state") {
		t.Errorf("%q does not say lost is final", final)
	}
}
