package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/flotilla-dev/flotilla/kinds"
	"github.com/flotilla-dev/flotilla/store"
)

// Every value a user types is checked here, or by the library's own checks
// (store.CheckName, store.CheckPayload, store.CheckNewTasks), before a
// command connects: exit 2 means the input, and nothing was written.

// checkName refuses a key, kind, name or id that store.CheckName refuses,
// naming the flag.
func checkName(flag, value string, required bool) error {
	if err := store.CheckName(flag, value, required); err != nil {
		return invalid(err)
	}
	return nil
}

// checkNameFlag checks a flag holding a name: given, it must not be empty
// (an empty --key is a mistake, not "no key").
func checkNameFlag(c *cli.Context, name string, required bool) error {
	return checkName("--"+name, c.String(name), required || c.IsSet(name))
}

// readPayload reads --payload: JSON given inline, @FILE for a file's
// content, or - for standard input; and checks it as every store would.
func readPayload(c *cli.Context) (json.RawMessage, error) {
	arg := c.String("payload")
	var raw []byte
	switch {
	case !c.IsSet("payload"):
		return nil, nil
	case arg == "":
		return nil, invalid(errors.New(`--payload is empty: give a JSON document, @FILE or - (standard input), or leave it out for null`))
	case arg == "-":
		b, err := io.ReadAll(io.LimitReader(c.App.Reader, store.MaxPayloadBytes+1))
		if err != nil {
			return nil, invalid(fmt.Errorf("--payload -: cannot read standard input: %w", err))
		}
		raw = b
	case strings.HasPrefix(arg, "@"):
		f, err := os.Open(arg[1:])
		if err != nil {
			return nil, invalid(fmt.Errorf("--payload %s: cannot read the file: %w", store.Shorten(arg, 200), errors.Unwrap(err)))
		}
		b, err := io.ReadAll(io.LimitReader(f, store.MaxPayloadBytes+1))
		_ = f.Close()
		if err != nil {
			return nil, invalid(fmt.Errorf("--payload %s: cannot read the file: %w", store.Shorten(arg, 200), err))
		}
		raw = b
	default:
		raw = []byte(arg)
	}
	// A file or a pipe usually ends with a newline, which is not part of
	// the document.
	if arg == "-" || strings.HasPrefix(arg, "@") {
		raw = []byte(strings.TrimSpace(string(raw)))
		if len(raw) == 0 {
			return nil, invalid(fmt.Errorf("--payload %s is empty: it should hold a JSON document", store.Shorten(arg, 60)))
		}
	}
	if err := store.CheckPayload("--payload", raw); err != nil {
		return nil, invalid(err)
	}
	return raw, nil
}

// checkKindPayload refuses a payload that a stock kind could never use.
func checkKindPayload(kind string, payload json.RawMessage) error {
	if err := kinds.CheckPayload(kind, payload); err != nil {
		return invalid(fmt.Errorf("--%w", err))
	}
	return nil
}

// checkMaxAttempts refuses --max-attempts 0 or less, given: leaving the
// flag out is how the default is asked for, and 0 would silently become it.
func checkMaxAttempts(c *cli.Context) error {
	n := c.Int("max-attempts")
	if c.IsSet("max-attempts") && (n < 1 || n > store.MaxMaxAttempts) {
		return invalid(fmt.Errorf("--max-attempts %d is out of range: give 1 to %d, or leave it out for the default of %d",
			n, store.MaxMaxAttempts, store.DefaultMaxAttempts))
	}
	return nil
}

// checkPositive refuses a number flag that, given, is not positive.
func checkPositive(c *cli.Context, name string) error {
	if c.IsSet(name) && c.Int(name) < 1 {
		return invalid(fmt.Errorf("--%s %d is not positive: give 1 or more", name, c.Int(name)))
	}
	return nil
}

// checkDurationFlag refuses a duration flag that is negative, or not
// positive when it must be.
func checkDurationFlag(c *cli.Context, name string, positive bool) error {
	d := c.Duration(name)
	switch {
	case d < 0:
		return invalid(fmt.Errorf("--%s %v is negative", name, d))
	case positive && c.IsSet(name) && d == 0:
		return invalid(fmt.Errorf("--%s 0s is not positive: give a duration such as 10s", name))
	}
	return nil
}

// parseTaskID reads a task ID argument.
func parseTaskID(arg string) (int64, error) {
	id, err := strconv.ParseInt(arg, 10, 64)
	if err != nil || id <= 0 {
		return 0, invalid(fmt.Errorf("task ID %s is not a positive integer", store.Shorten(arg, 40)))
	}
	return id, nil
}

// checkCronLists refuses a cron field with an empty list element ("1,,2"),
// which the cron parser would read as if it were not there.
func checkCronLists(spec string) error {
	for _, field := range strings.Fields(spec) {
		for _, elem := range strings.Split(field, ",") {
			if elem == "" {
				return invalid(fmt.Errorf("--cron %s: field %q has an empty list element: give values separated by single commas, e.g. 1,2",
					store.Shorten(spec, 60), field))
			}
		}
	}
	return nil
}

// checkRunAt parses --run-at.
func checkRunAt(at string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, at)
	if err != nil {
		return time.Time{}, invalid(fmt.Errorf("--run-at %s is not an RFC 3339 time like 2026-12-01T09:00:00Z", store.Shorten(at, 60)))
	}
	return t, nil
}

// parseResourcesFlag reads a NAME=AMOUNT,... flag (--resources,
// --capacity) as every store checks it. Given, it must name something.
func parseResourcesFlag(c *cli.Context, name string) (store.Resources, error) {
	v := c.String(name)
	if v == "" {
		return nil, invalid(fmt.Errorf("--%s is empty: give NAME=AMOUNT pairs, e.g. gpu=1,mem=8", name))
	}
	r, err := store.ParseResources("--"+name, v)
	if err != nil {
		return nil, invalid(err)
	}
	return r, nil
}
