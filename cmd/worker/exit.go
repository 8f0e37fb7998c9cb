package main

import (
	"errors"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/benchmark"
	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/commands"
	"github.com/flotilla-dev/flotilla/schedule"
	"github.com/flotilla-dev/flotilla/store"
)

// Exit statuses (DESIGN §9). exitStatuses says what each means; exitTable
// says which errors end with which.
const (
	exitOK       = 0
	exitRuntime  = 1
	exitInvalid  = 2
	exitRefused  = 3
	exitNotFound = 4
	exitTooLate  = 5
)

// Marks for the conditions cmd/worker finds itself, such as a flag value it
// refuses before connecting. invalid, refused and notFound attach them;
// exitTable gives them their status like any library error.
var (
	errInvalidInput = errors.New("invalid input")
	errRefused      = errors.New("refused by the fleet's state")
	errNotFound     = errors.New("not found")
)

// exitRow is one line of the error-to-status table: an error whose chain
// holds one of errs ends the process with status.
type exitRow struct {
	status int
	errs   []error
}

// exitTable maps every error a command returns to its exit status. Nothing
// else decides a status: commands return the library's errors as they are,
// or mark their own with invalid, refused or notFound.
//
// An error's status is that of the first error of its chain, walked from
// the outside in, that a row names: a command that wraps a library error in
// its own mark decides, as in invalid(fmt.Errorf("--payload: %w", err)).
// Where one link is named by two rows, the earlier row wins. An error no
// row names is a failure at run time, status 1.
var exitTable = []exitRow{
	{exitTooLate, []error{commands.ErrTooLate}},
	{exitNotFound, []error{errNotFound, store.ErrNotFound}},
	{exitInvalid, []error{errInvalidInput, store.ErrInvalid, store.ErrBucketCount,
		bucket.ErrInvalidSet, bucket.ErrInvalidCount,
		schedule.ErrInvalidDefinition, schedule.ErrInvalidSpec, schedule.ErrInvalidPolicy}},
	{exitRefused, []error{errRefused, flotilla.ErrRefused, store.ErrDuplicate, store.ErrSchema,
		store.ErrNodeAlive, store.ErrSkippedStep, commands.ErrWrongState, benchmark.ErrFleetBusy}},
}

// exitStatuses says what each status means, in the order of the help text.
var exitStatuses = []struct {
	status  int
	meaning string
}{
	{exitOK, "done"},
	{exitRuntime, "a failure at run time: the database unreachable, an error it returned"},
	{exitInvalid, "invalid input (a flag, an argument, a payload): nothing was written"},
	{exitRefused, "refused by the fleet's state (a live node with the same id, a bucket nobody holds, ...)"},
	{exitNotFound, "not found"},
	{exitTooLate, "too late: the task had already finished"},
}

// exitStatus is the status the process ends with after err.
func exitStatus(err error) int {
	if err == nil {
		return exitOK
	}
	if status, ok := statusOf(err); ok {
		return status
	}
	return exitRuntime
}

// statusOf walks err's chain depth first, from the outside in, and returns
// the status of the first link exitTable names.
func statusOf(err error) (int, bool) {
	for _, row := range exitTable {
		for _, e := range row.errs {
			if err == e {
				return row.status, true
			}
			// An error type that stands for a sentinel through its Is
			// method, such as store.BucketCountError.
			if is, ok := err.(interface{ Is(error) bool }); ok && is.Is(e) {
				return row.status, true
			}
		}
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		if inner := u.Unwrap(); inner != nil {
			return statusOf(inner)
		}
	case interface{ Unwrap() []error }:
		for _, inner := range u.Unwrap() {
			if status, ok := statusOf(inner); ok {
				return status, true
			}
		}
	}
	return 0, false
}

// markedError is an error with a mark from the list above: it reads as the
// error it carries, and the table finds the mark first.
type markedError struct {
	mark error
	err  error
}

func (e *markedError) Error() string   { return e.err.Error() }
func (e *markedError) Unwrap() []error { return []error{e.mark, e.err} }

func invalid(err error) error  { return &markedError{mark: errInvalidInput, err: err} }
func refused(err error) error  { return &markedError{mark: errRefused, err: err} }
func notFound(err error) error { return &markedError{mark: errNotFound, err: err} }
