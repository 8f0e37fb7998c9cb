package commands

import (
	"errors"
	"fmt"

	"github.com/flotilla-dev/flotilla/task"
)

// ErrTooLate is matched by *TooLateError.
var ErrTooLate = errors.New("the task had already finished")

// TooLateError says that a command came after its task had finished.
type TooLateError struct {
	ID     int64
	Status task.Status // the task's final state
}

func (e *TooLateError) Error() string {
	return fmt.Sprintf("task %d had already finished: it is %s", e.ID, e.Status)
}

func (e *TooLateError) Is(target error) bool { return target == ErrTooLate }

// ErrWrongState is matched by *StateError.
var ErrWrongState = errors.New("the task is not in a state the command applies to")

// StateError refuses a command that does not apply to the task's state: a
// resume of a task that is not paused, a pause of a task that is stopping or
// waits for its pipeline parents.
type StateError struct {
	ID     int64
	Kind   string // the command
	Status task.Status
	Want   string // what the command needs, in words
}

func (e *StateError) Error() string {
	return fmt.Sprintf("cannot %s task %d: it is %s; %s", e.Kind, e.ID, e.Status, e.Want)
}

func (e *StateError) Is(target error) bool { return target == ErrWrongState }
