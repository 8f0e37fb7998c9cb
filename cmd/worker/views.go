package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/bucket"
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
	UniqueKey    string          `json:"unique_key,omitempty"`
	Timeout      string          `json:"timeout"`
	Pipeline     int64           `json:"pipeline,omitempty"`
	Step         string          `json:"step,omitempty"`
	Progress     json.RawMessage `json:"progress,omitempty"`
	LimitKey     string          `json:"limit_key,omitempty"`
	Resources    store.Resources `json:"resources,omitempty"`
	WaitReason   string          `json:"wait_reason,omitempty"`
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

// progressOrNone is a task's saved progress, nil (left out) when it saved
// none.
func progressOrNone(m json.RawMessage) json.RawMessage {
	if len(m) == 0 || string(m) == "null" {
		return nil
	}
	return m
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
		UniqueKey: t.UniqueKey, Timeout: jsonDuration(t.Timeout), Pipeline: t.Pipeline, Step: t.Step,
		Progress:     progressOrNone(t.Progress),
		ScheduledFor: jsonTime(t.ScheduledFor), RunAt: jsonTime(t.RunAt), CreatedAt: jsonTime(t.CreatedAt),
		StartedAt: jsonTime(t.StartedAt), FinishedAt: jsonTime(t.FinishedAt),
		LimitKey: t.LimitKey, Resources: t.Resources, WaitReason: t.WaitReason,
	}
}

func reportJSON(r *flotilla.TaskReport, now time.Time) taskJSON {
	v := newTaskJSON(r.Task)
	v.Waiting = waitingFor(r, now)
	v.Events = make([]eventJSON, len(r.Events))
	for i, e := range r.Events {
		v.Events[i] = eventJSON{Seq: e.Seq, From: e.From, To: e.To, At: jsonTime(e.At), Node: e.Node,
			Epoch: e.Epoch, Attempt: e.Attempt, Reason: e.Reason, Error: e.Error}
	}
	return v
}

// waitingFor says why a task that could run is not running: its delay or
// retry time, a pause, the latest reason its bucket's holder gave for not
// starting it (a limit, resources), and what the fleet lacks to serve it
// (the client's Waiting: no holder, or a holder that does not run its
// kind).
func waitingFor(r *flotilla.TaskReport, now time.Time) string {
	t := r.Task
	var why []string
	switch {
	case t.Status == task.Paused:
		why = append(why, "paused: `worker resume` queues it again")
	case t.Status == task.Retrying && t.RunAt.After(now):
		why = append(why, "retrying at "+human(t.RunAt))
	case t.Status == task.Scheduled && t.RunAt.After(now):
		why = append(why, "delayed until "+human(t.RunAt))
	}
	if t.WaitReason != "" && t.Status.Claimable() {
		why = append(why, t.WaitReason)
	}
	if r.Waiting != "" && (t.Status.Claimable() || t.Status == task.Paused) {
		why = append(why, r.Waiting)
	}
	return strings.Join(why, "; ")
}

func printReport(w io.Writer, r *flotilla.TaskReport, now time.Time) {
	t := r.Task
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(tw, "%s\t%v\n", k, v) }
	row("id", t.ID)
	row("kind", wide(t.Kind))
	row("key", dash(wide(t.Key)))
	row("bucket", t.Bucket)
	row("status", t.Status)
	if why := waitingFor(r, now); why != "" {
		row("waiting", wide(why))
	}
	row("attempt", fmt.Sprintf("%d of %d", t.Attempt, t.MaxAttempts))
	row("priority", t.Priority)
	if t.Node != "" {
		row("node", fmt.Sprintf("%s (epoch %d)", wide(t.Node), t.Epoch))
	}
	if t.UniqueKey != "" {
		row("unique key", wide(t.UniqueKey))
	}
	if t.LimitKey != "" {
		row("limit key", wide(t.LimitKey))
	}
	if len(t.Resources) > 0 {
		row("resources", wide(store.Resources(t.Resources).String()))
	}
	row("payload", wide(string(rawOrNull(t.Payload))))
	if len(t.Result) > 0 {
		row("result", wide(string(t.Result)))
	}
	if t.Error != "" {
		row("error", wide(firstLine(t.Error)))
	}
	if t.Schedule != "" {
		row("schedule", fmt.Sprintf("%s at %s", wide(t.Schedule), human(t.ScheduledFor)))
	}
	row("created", human(t.CreatedAt))
	row("run at", human(t.RunAt))
	if t.Status == task.Retrying {
		row("next retry", human(t.RunAt))
	}
	row("started", human(t.StartedAt))
	row("finished", human(t.FinishedAt))
	_ = tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tAT\tFROM\tTO\tNODE\tEPOCH\tATTEMPT\tREASON\tERROR")
	for _, e := range r.Events {
		from := string(e.From)
		if from == "" {
			from = "-"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", e.Seq, human(e.At), from, e.To, dash(cell(e.Node)),
			e.Epoch, e.Attempt, dash(cell(e.Reason)), dash(cell(firstLine(e.Error))))
	}
	_ = tw.Flush()
}

func printTasks(w io.Writer, ts []*task.Task) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tKIND\tKEY\tBUCKET\tSTATUS\tATTEMPT\tNODE\tCREATED\tFINISHED\tERROR")
	for _, t := range ts {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%d/%d\t%s\t%s\t%s\t%s\n", t.ID, cell(t.Kind), dash(cell(t.Key)), t.Bucket,
			t.Status, t.Attempt, t.MaxAttempts, dash(cell(t.Node)), human(t.CreatedAt), human(t.FinishedAt),
			dash(cell(firstLine(t.Error))))
	}
	_ = tw.Flush()
}

type bucketJSON struct {
	Bucket       int      `json:"bucket"`
	Holder       string   `json:"holder"`
	Target       string   `json:"target"`
	Successor    string   `json:"successor"`
	HandoffSince any      `json:"handoff_since"`
	HandedBy     string   `json:"handed_by"`
	Pin          string   `json:"pin"`
	Epoch        int64    `json:"epoch"`
	ExpiresAt    any      `json:"expires_at"`
	Standby      []string `json:"standby"`
	Queued       int      `json:"queued"`
	Waiting      int      `json:"waiting"`
	Running      int      `json:"running"`
}

func newBucketJSON(b flotilla.BucketReport) bucketJSON {
	return bucketJSON{Bucket: b.Bucket, Holder: b.Holder, Target: b.Target, Successor: b.Successor,
		HandoffSince: jsonTime(b.HandoffSince), HandedBy: b.HandedBy, Pin: b.Pin, Epoch: b.Epoch,
		ExpiresAt: jsonTime(b.ExpiresAt), Standby: b.Standby, Queued: b.Queued, Waiting: b.Waiting, Running: b.Running}
}

// pinJSON is what buckets move and unpin print under --json.
type pinJSON struct {
	Buckets string `json:"buckets"`
	Pin     string `json:"pin"`
}

func printBuckets(w io.Writer, bs []flotilla.BucketReport) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BUCKET\tHOLDER\tTARGET\tHAND-OFF\tEPOCH\tEXPIRES\tSTANDBY\tQUEUED\tWAITING\tRUNNING")
	for _, b := range bs {
		holder := cell(b.Holder)
		if holder == "" {
			holder = "(none)"
		}
		target := cell(b.Target)
		if b.Pin != "" && b.Pin == b.Target {
			target += " (pinned)"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%d\t%d\t%d\n", b.Bucket, holder, dash(target), dash(handoffCell(b)),
			b.Epoch, human(b.ExpiresAt), dash(cell(strings.Join(b.Standby, ","))), b.Queued, b.Waiting, b.Running)
	}
	_ = tw.Flush()
}

// handoffCell says what hand-off a bucket is in: "to N since T" while its
// holder lets its tasks finish, "from N" until the new holder takes it up.
func handoffCell(b flotilla.BucketReport) string {
	switch {
	case b.Successor != "":
		return "to " + cell(b.Successor) + " since " + b.HandoffSince.UTC().Format("15:04:05.000")
	case b.HandedBy != "":
		return "from " + cell(b.HandedBy)
	}
	return ""
}

// printBucketSummary ends the buckets table with one line for the whole
// fleet, which is what a fleet of thousands of buckets is read by.
func printBucketSummary(w io.Writer, bs []flotilla.BucketReport) {
	holders := map[string]bool{}
	var unheld []int
	queued, waiting, running := 0, 0, 0
	for _, b := range bs {
		if b.Holder == "" {
			unheld = append(unheld, b.Bucket)
		} else {
			holders[b.Holder] = true
		}
		queued, waiting, running = queued+b.Queued, waiting+b.Waiting, running+b.Running
	}
	line := fmt.Sprintf("%d buckets: %d held by %d nodes, %d unheld", len(bs), len(bs)-len(unheld), len(holders), len(unheld))
	if len(unheld) > 0 {
		line += " (" + cell(bucket.Of(unheld...).String()) + ")"
	}
	if moving := movesUnderWay(bs); moving > 0 {
		line += fmt.Sprintf(", %d being handed over", moving)
	}
	fmt.Fprintf(w, "%s; %d queued, %d waiting, %d running\n", line, queued, waiting, running)
}

// movesUnderWay counts the buckets in a hand-off.
func movesUnderWay(bs []flotilla.BucketReport) int {
	n := 0
	for _, b := range bs {
		if b.Successor != "" || b.HandedBy != "" {
			n++
		}
	}
	return n
}

type nodeJSON struct {
	ID          string   `json:"id"`
	Incarnation string   `json:"incarnation"`
	Buckets     string   `json:"buckets"`
	Held        string   `json:"held"`
	Share       int      `json:"share"`
	Balance     bool     `json:"balance"`
	Leaving     bool     `json:"leaving"`
	Kinds       []string `json:"kinds"`
	Version     string   `json:"version"`
	Alive       bool     `json:"alive"`
	StartedAt   any      `json:"started_at"`
	HeartbeatAt any      `json:"heartbeat_at"`
	StoppedAt   any      `json:"stopped_at"`
}

func newNodeJSON(n flotilla.NodeReport) nodeJSON {
	kinds := n.Kinds
	if kinds == nil {
		kinds = []string{}
	}
	return nodeJSON{ID: n.ID, Incarnation: n.Incarnation, Buckets: n.Buckets.String(), Held: n.Held.String(),
		Share: n.Share, Balance: n.Balance, Leaving: n.Leaving,
		Kinds: kinds, Version: n.Version, Alive: n.Alive, StartedAt: jsonTime(n.StartedAt),
		HeartbeatAt: jsonTime(n.HeartbeatAt), StoppedAt: jsonTime(n.StoppedAt)}
}

func printNodes(w io.Writer, ns []flotilla.NodeReport) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tDECLARED\tHELD\tSHARE\tKINDS\tVERSION\tSTARTED\tHEARTBEAT")
	for _, n := range ns {
		state := "alive"
		switch {
		case !n.StoppedAt.IsZero():
			state = "stopped"
		case !n.Alive:
			state = "dead"
		case n.Leaving:
			state = "leaving"
		}
		share := "-"
		switch {
		case n.Alive && !n.Leaving && n.Balance:
			share = fmt.Sprint(n.Share)
		case n.Alive && !n.Leaving:
			share = fmt.Sprintf("%d (no balance)", n.Share)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", cell(n.ID), state, cell(n.Buckets.String()),
			dash(cell(n.Held.String())), share, cell(strings.Join(n.Kinds, ",")), dash(cell(n.Version)),
			human(n.StartedAt), human(n.HeartbeatAt))
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

// Table cells are at most cellWidth characters; get's rows, one value to a
// line, at most wideWidth.
const (
	cellWidth = 40
	wideWidth = 200
)

// cell makes a value safe and short enough for a table: control
// characters and bytes that are not UTF-8 are escaped (a tab or an escape
// sequence would break the table or the terminal), and a long value keeps
// its start and ends with an ellipsis.
func cell(s string) string { return shorten(s, cellWidth) }

// wide is cell for a value on a line of its own.
func wide(s string) string { return shorten(s, wideWidth) }

func shorten(s string, width int) string {
	var b strings.Builder
	n := 0
	for i, r := range s {
		if n == width {
			b.WriteString("…")
			break
		}
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD"):
			fmt.Fprintf(&b, "\\x%02x", s[i])
		case unicode.IsControl(r):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteRune(r)
		}
		n++
	}
	return b.String()
}
