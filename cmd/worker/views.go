package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// taskJSON is the task as `get --json` and `list --json` print it.
type taskJSON struct {
	ID           int64           `json:"id"`
	Kind         string          `json:"kind"`
	Key          string          `json:"key"`
	Bucket       int             `json:"bucket"`
	Status       task.Status     `json:"status"`
	Attempt      int             `json:"attempt"`
	MaxAttempts  int             `json:"max_attempts"`
	Priority     int             `json:"priority"`
	Node         string          `json:"node"`
	Epoch        int64           `json:"epoch"`
	Payload      json.RawMessage `json:"payload"`
	Result       json.RawMessage `json:"result"`
	Error        string          `json:"error"`
	Schedule     string          `json:"schedule"`
	ScheduledFor any             `json:"scheduled_for"`
	RunAt        any             `json:"run_at"`
	CreatedAt    any             `json:"created_at"`
	StartedAt    any             `json:"started_at"`
	FinishedAt   any             `json:"finished_at"`
	Waiting      string          `json:"waiting,omitempty"`
	Events       []eventJSON     `json:"events,omitempty"`
}

type eventJSON struct {
	Seq     int64       `json:"seq"`
	From    task.Status `json:"from"`
	To      task.Status `json:"to"`
	At      any         `json:"at"`
	Node    string      `json:"node"`
	Epoch   int64       `json:"epoch"`
	Attempt int         `json:"attempt"`
	Reason  string      `json:"reason"`
	Error   string      `json:"error"`
}

func rawOrNull(m json.RawMessage) json.RawMessage {
	if len(m) == 0 {
		return json.RawMessage("null")
	}
	return m
}

func newTaskJSON(t *task.Task) taskJSON {
	return taskJSON{
		ID: t.ID, Kind: t.Kind, Key: t.Key, Bucket: t.Bucket, Status: t.Status, Attempt: t.Attempt,
		MaxAttempts: t.MaxAttempts, Priority: t.Priority, Node: t.Node, Epoch: t.Epoch,
		Payload: rawOrNull(t.Payload), Result: rawOrNull(t.Result), Error: t.Error, Schedule: t.Schedule,
		ScheduledFor: jsonTime(t.ScheduledFor), RunAt: jsonTime(t.RunAt), CreatedAt: jsonTime(t.CreatedAt),
		StartedAt: jsonTime(t.StartedAt), FinishedAt: jsonTime(t.FinishedAt),
	}
}

func reportJSON(r *flotilla.TaskReport) taskJSON {
	v := newTaskJSON(r.Task)
	v.Waiting = r.Waiting
	v.Events = make([]eventJSON, len(r.Events))
	for i, e := range r.Events {
		v.Events[i] = eventJSON{Seq: e.Seq, From: e.From, To: e.To, At: jsonTime(e.At), Node: e.Node,
			Epoch: e.Epoch, Attempt: e.Attempt, Reason: e.Reason, Error: e.Error}
	}
	return v
}

func printReport(w io.Writer, r *flotilla.TaskReport) {
	t := r.Task
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(tw, "%s\t%v\n", k, v) }
	row("id", t.ID)
	row("kind", t.Kind)
	row("key", t.Key)
	row("bucket", t.Bucket)
	row("status", t.Status)
	if r.Waiting != "" {
		row("waiting", r.Waiting)
	}
	row("attempt", fmt.Sprintf("%d of %d", t.Attempt, t.MaxAttempts))
	row("priority", t.Priority)
	if t.Node != "" {
		row("node", fmt.Sprintf("%s (epoch %d)", t.Node, t.Epoch))
	}
	row("payload", string(rawOrNull(t.Payload)))
	if len(t.Result) > 0 {
		row("result", string(t.Result))
	}
	if t.Error != "" {
		row("error", firstLine(t.Error))
	}
	if t.Schedule != "" {
		row("schedule", fmt.Sprintf("%s at %s", t.Schedule, human(t.ScheduledFor)))
	}
	row("created", human(t.CreatedAt))
	_ = tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tAT\tFROM\tTO\tNODE\tEPOCH\tATTEMPT\tREASON\tERROR")
	for _, e := range r.Events {
		from := string(e.From)
		if from == "" {
			from = "-"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", e.Seq, human(e.At), from, e.To, dash(e.Node),
			e.Epoch, e.Attempt, dash(e.Reason), dash(firstLine(e.Error)))
	}
	_ = tw.Flush()
}

func printTasks(w io.Writer, ts []*task.Task) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tKIND\tKEY\tBUCKET\tSTATUS\tATTEMPT\tNODE\tCREATED")
	for _, t := range ts {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%d/%d\t%s\t%s\n", t.ID, t.Kind, dash(t.Key), t.Bucket, t.Status,
			t.Attempt, t.MaxAttempts, dash(t.Node), human(t.CreatedAt))
	}
	_ = tw.Flush()
}

type bucketJSON struct {
	Bucket    int      `json:"bucket"`
	Holder    string   `json:"holder"`
	Epoch     int64    `json:"epoch"`
	ExpiresAt any      `json:"expires_at"`
	Standby   []string `json:"standby"`
	Queued    int      `json:"queued"`
	Waiting   int      `json:"waiting"`
	Running   int      `json:"running"`
}

func printBuckets(w io.Writer, bs []flotilla.BucketReport) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BUCKET\tHOLDER\tEPOCH\tEXPIRES\tSTANDBY\tQUEUED\tWAITING\tRUNNING")
	for _, b := range bs {
		holder := b.Holder
		if holder == "" {
			holder = "(none)"
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%d\t%d\t%d\n", b.Bucket, holder, b.Epoch, human(b.ExpiresAt),
			dash(strings.Join(b.Standby, ",")), b.Queued, b.Waiting, b.Running)
	}
	_ = tw.Flush()
}

type nodeJSON struct {
	ID          string   `json:"id"`
	Incarnation string   `json:"incarnation"`
	Buckets     string   `json:"buckets"`
	Kinds       []string `json:"kinds"`
	Version     string   `json:"version"`
	Alive       bool     `json:"alive"`
	StartedAt   any      `json:"started_at"`
	HeartbeatAt any      `json:"heartbeat_at"`
	StoppedAt   any      `json:"stopped_at"`
}

func newNodeJSON(n store.NodeInfo) nodeJSON {
	kinds := n.Kinds
	if kinds == nil {
		kinds = []string{}
	}
	return nodeJSON{ID: n.ID, Incarnation: n.Incarnation, Buckets: n.Buckets.String(), Kinds: kinds,
		Version: n.Version, Alive: n.Alive, StartedAt: jsonTime(n.StartedAt), HeartbeatAt: jsonTime(n.HeartbeatAt),
		StoppedAt: jsonTime(n.StoppedAt)}
}

func printNodes(w io.Writer, ns []store.NodeInfo) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tBUCKETS\tKINDS\tVERSION\tSTARTED\tHEARTBEAT")
	for _, n := range ns {
		state := "alive"
		switch {
		case !n.StoppedAt.IsZero():
			state = "stopped"
		case !n.Alive:
			state = "dead"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.ID, state, n.Buckets.String(), strings.Join(n.Kinds, ","),
			dash(n.Version), human(n.StartedAt), human(n.HeartbeatAt))
	}
	_ = tw.Flush()
}

func human(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
