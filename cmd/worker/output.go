package main

import (
	"encoding/json"
	"io"
	"time"
)

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// JSONTimeFormat is the one format of times in JSON output (DESIGN §9): RFC
// 3339 in UTC with exactly six digits of fraction, the microseconds every
// store keeps, so that every time has the same width and sorts as text.
const JSONTimeFormat = "2006-01-02T15:04:05.000000Z07:00"

// jsonTime renders a time in JSONTimeFormat, and the zero time as null.
func jsonTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC().Format(JSONTimeFormat)
}

// jsonDuration renders a task's timeout: "1.5s", or "" for none.
func jsonDuration(d time.Duration) string {
	if d <= 0 {
		return ""
	}
	return d.String()
}
