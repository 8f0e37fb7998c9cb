package postgres

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// taskColumnNames are the columns a task is read from, in scanTask's order.
var taskColumnNames = []string{
	"id", "kind", "key", "bucket", "status", "status_version", "priority", "run_at", "attempt",
	"max_attempts", "timeout_ms", "payload", "result", "progress", "error", "claim_seq", "owner", "node",
	"epoch", "lease_expires_at", "schedule", "scheduled_for", "unique_key", "created_at", "started_at",
	"finished_at", "updated_at", "stop_requested", "pause_requested", "pipeline_id", "step", "metadata",
}

// taskColumns is taskColumnNames as a select list; taskColumnsOf(alias)
// qualifies each column. Both are built from the constant list above, never
// from input.
var taskColumns = strings.Join(taskColumnNames, ", ")

func taskColumnsOf(alias string) string {
	cols := make([]string, len(taskColumnNames))
	for i, c := range taskColumnNames {
		cols[i] = alias + "." + c
	}
	return strings.Join(cols, ", ")
}

// limitColumns follow taskColumns where a reader needs what limits count:
// the limited claim, GetTask and ListTasks. The plain claim and the writes
// of the hot path read taskColumns alone.
const limitColumns = "limit_key, resources, wait_reason"

// limitRow receives limitColumns.
type limitRow struct {
	limitKey, waitReason string
	resources            []byte
}

func (l *limitRow) dest() []any { return []any{&l.limitKey, &l.resources, &l.waitReason} }

func (l *limitRow) into(t *task.Task) error {
	t.LimitKey, t.WaitReason = l.limitKey, l.waitReason
	t.Resources = nil
	if l.resources != nil {
		if err := json.Unmarshal(l.resources, &t.Resources); err != nil {
			return fmt.Errorf("task %d: resources %s: %w", t.ID, l.resources, err)
		}
	}
	return nil
}

// scanLimitedTasks reads rows of taskColumns followed by limitColumns.
func scanLimitedTasks(rows pgx.Rows) ([]*task.Task, error) {
	defer rows.Close()
	var out []*task.Task
	var r taskRow
	var l limitRow
	dest := append(r.dest(), l.dest()...)
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		t := r.task()
		if err := l.into(t); err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

func scanLimitedTask(row pgx.Row) (*task.Task, error) {
	var r taskRow
	var l limitRow
	if err := row.Scan(append(r.dest(), l.dest()...)...); err != nil {
		return nil, err
	}
	t := r.task()
	return t, l.into(t)
}

// resourcesText is a task's resources as jsonb text, NULL for none.
func resourcesText(r store.Resources) pgtype.Text {
	if len(r) == 0 {
		return pgtype.Text{}
	}
	b, _ := json.Marshal(map[string]int64(r)) // a map of numbers always marshals
	return pgtype.Text{String: string(b), Valid: true}
}

// resourcesJSON is resourcesText for COPY, which takes the jsonb's bytes.
func resourcesJSON(r store.Resources) []byte {
	t := resourcesText(r)
	if !t.Valid {
		return nil
	}
	return []byte(t.String)
}

// metadataJSON is metadataText for COPY, which takes the jsonb's bytes.
func metadataJSON(md map[string]string) []byte {
	t := metadataText(md)
	if !t.Valid {
		return nil
	}
	return []byte(t.String)
}

// taskRow receives one row of taskColumns.
type taskRow struct {
	id, statusVersion, timeoutMS, claimSeq, epoch int64
	kind, key, status, errText, node              string
	bucket, priority, attempt, maxAttempts        int32
	payload, result, progress, metadata           []byte
	owner, schedule, uniqueKey                    pgtype.Text
	runAt, createdAt, updatedAt                   time.Time
	leaseExpiresAt, scheduledFor                  pgtype.Timestamptz
	startedAt, finishedAt                         pgtype.Timestamptz
	stopRequested, pauseRequested                 bool
	pipeline                                      pgtype.Int8
	step                                          pgtype.Text
}

func (r *taskRow) dest() []any {
	return []any{
		&r.id, &r.kind, &r.key, &r.bucket, &r.status, &r.statusVersion, &r.priority, &r.runAt, &r.attempt,
		&r.maxAttempts, &r.timeoutMS, &r.payload, &r.result, &r.progress, &r.errText, &r.claimSeq, &r.owner, &r.node,
		&r.epoch, &r.leaseExpiresAt, &r.schedule, &r.scheduledFor, &r.uniqueKey, &r.createdAt, &r.startedAt,
		&r.finishedAt, &r.updatedAt, &r.stopRequested, &r.pauseRequested, &r.pipeline, &r.step, &r.metadata,
	}
}

func (r *taskRow) task() *task.Task {
	return &task.Task{
		ID:             r.id,
		Kind:           r.kind,
		Key:            r.key,
		Bucket:         int(r.bucket),
		Status:         task.Status(r.status),
		StatusVersion:  r.statusVersion,
		Priority:       int(r.priority),
		RunAt:          r.runAt.UTC(),
		Attempt:        int(r.attempt),
		MaxAttempts:    int(r.maxAttempts),
		Timeout:        time.Duration(r.timeoutMS) * time.Millisecond,
		Payload:        rawJSON(r.payload),
		Result:         rawJSON(r.result),
		Progress:       rawJSON(r.progress),
		Error:          r.errText,
		ClaimSeq:       r.claimSeq,
		Owner:          r.owner.String,
		Node:           r.node,
		Epoch:          r.epoch,
		LeaseExpiresAt: optTime(r.leaseExpiresAt),
		Schedule:       r.schedule.String,
		ScheduledFor:   optTime(r.scheduledFor),
		UniqueKey:      r.uniqueKey.String,
		CreatedAt:      r.createdAt.UTC(),
		StartedAt:      optTime(r.startedAt),
		FinishedAt:     optTime(r.finishedAt),
		UpdatedAt:      r.updatedAt.UTC(),
		StopRequested:  r.stopRequested,
		PauseRequested: r.pauseRequested,
		Pipeline:       r.pipeline.Int64,
		Step:           r.step.String,
		Metadata:       metadataOf(r.metadata),
	}
}

// metadataOf reads the metadata column. The store writes it only from a
// map of strings (metadataText), so it always reads back as one; a row
// whose column was set by hand to anything else reads as no metadata
// rather than failing every read that meets it.
func metadataOf(b []byte) map[string]string {
	if b == nil {
		return nil
	}
	var md map[string]string
	if json.Unmarshal(b, &md) != nil || len(md) == 0 {
		return nil
	}
	return md
}

// metadataText is a task's metadata as jsonb text, NULL for none.
func metadataText(md map[string]string) pgtype.Text {
	if len(md) == 0 {
		return pgtype.Text{}
	}
	b, _ := json.Marshal(md) // a map of strings always marshals
	return pgtype.Text{String: string(b), Valid: true}
}

// scanTasks reads every row of taskColumns (optionally followed by extra
// columns, scanned into extra for each row) and closes rows.
func scanTasks(rows pgx.Rows) ([]*task.Task, error) {
	defer rows.Close()
	var out []*task.Task
	var r taskRow
	dest := r.dest()
	for rows.Next() {
		// Scan assigns every column, NULLs included, so r can be reused;
		// the byte slices are fresh copies on every scan.
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		out = append(out, r.task())
	}
	return out, rows.Err()
}

func rawJSON(b []byte) json.RawMessage {
	if b == nil {
		return nil
	}
	return json.RawMessage(b)
}

func optTime(t pgtype.Timestamptz) time.Time {
	if !t.Valid {
		return time.Time{}
	}
	return t.Time.UTC()
}

// optText is a NULL for the empty string.
func optText(s string) pgtype.Text {
	return pgtype.Text{String: s, Valid: s != ""}
}

// optTimestamp is a NULL for the zero time.
func optTimestamp(t time.Time) pgtype.Timestamptz {
	return pgtype.Timestamptz{Time: t, Valid: !t.IsZero()}
}

// jsonText is a NULL for a nil raw message (meaning "no change" where that
// matters), JSON null for an empty one, else its text.
func jsonText(raw json.RawMessage) pgtype.Text {
	return pgtype.Text{String: jsonOrNull(raw), Valid: raw != nil}
}

// jsonOrNull is the text of a document, JSON null for none.
func jsonOrNull(raw json.RawMessage) string {
	if len(raw) == 0 {
		return "null"
	}
	return string(raw)
}

// validJSON reports whether raw is a JSON document or empty (null).
func validJSON(raw json.RawMessage) bool {
	return len(raw) == 0 || json.Valid(raw)
}

// micros turns a duration into the microseconds statements multiply by
// interval '1 microsecond'.
func micros(d time.Duration) int64 { return d.Microseconds() }
