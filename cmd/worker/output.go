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

// jsonTime renders times as RFC 3339 with nanoseconds in UTC (DESIGN §9), and
// the zero time as null.
func jsonTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC().Format(time.RFC3339Nano)
}
