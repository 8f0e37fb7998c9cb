package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// ProbeKind is the kind whose executions are recorded in the ledger.
const ProbeKind = "probe"

// ProbePayload is a probe task's payload: {"duration":"150ms"}. The probe
// works (sleeps) for that long, or until its context ends.
type ProbePayload struct {
	Duration string `json:"duration"`
}

// ledgerTimeout bounds each ledger write. The ledger is reached directly,
// not through the proxy a scenario may cut, so a write waits only for a
// busy server, or for its process to be resumed: a scenario may stop the
// process with SIGSTOP in the middle of a write, for as long as its
// successor needs to take over on a loaded machine, and the clock runs on
// meanwhile. The scenario's own deadlines bound a write that never ends.
const ledgerTimeout = 5 * time.Minute

// ledger writes the probe's records: one row per execution, inserted when
// the handler starts and completed when it returns; or, with a file, one
// line when it starts and one when it returns.
type ledger struct {
	pool *pgxpool.Pool // nil when the ledger is a file
	file *os.File
	pid  int
	log  *zap.Logger
}

// ledgerAt is where the ledger goes: a PostgreSQL database, or a file.
type ledgerAt struct{ dsn, file string }

// FileRecord is one line of a file ledger: an execution's start (Event
// "start", with what identifies the attempt) or its end (Event "end", with
// its outcome). Times are this process's wall clock.
type FileRecord struct {
	Event        string    `json:"ev"`
	Task         int64     `json:"task"`
	ClaimSeq     int64     `json:"claim_seq"`
	Attempt      int       `json:"attempt,omitempty"`
	Epoch        int64     `json:"epoch,omitempty"`
	Bucket       int       `json:"bucket"`
	Node         string    `json:"node,omitempty"`
	PID          int       `json:"pid"`
	LimitKey     string    `json:"limit_key,omitempty"`
	Schedule     string    `json:"schedule,omitempty"`
	ScheduledFor time.Time `json:"scheduled_for,omitzero"`
	At           time.Time `json:"at"`
	Outcome      string    `json:"outcome,omitempty"`
}

func openLedger(ctx context.Context, at ledgerAt, log *zap.Logger) (*ledger, error) {
	if at.file != "" {
		// Each line is one write to a file opened for appending: a line
		// is never torn by another's, and a process killed with SIGKILL
		// leaves every line it wrote, in the page cache if not on disk.
		f, err := os.OpenFile(at.file, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return nil, fmt.Errorf("--ledger-file: %w", err)
		}
		return &ledger{file: f, pid: os.Getpid(), log: log}, nil
	}
	cfg, err := pgxpool.ParseConfig(at.dsn)
	if err != nil {
		return nil, fmt.Errorf("--ledger-dsn: %w", err)
	}
	cfg.MaxConns = 4
	cfg.ConnConfig.RuntimeParams["application_name"] = "flotilla-testworker-ledger"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("ledger: %w", err)
	}
	return &ledger{pool: pool, pid: os.Getpid(), log: log}, nil
}

// writeLine appends one record to the file ledger.
func (l *ledger) writeLine(r FileRecord) error {
	r.PID = l.pid
	line, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = l.file.Write(append(line, '\n'))
	return err
}

func (l *ledger) close() {
	if l.pool != nil {
		l.pool.Close()
	}
	if l.file != nil {
		_ = l.file.Close()
	}
}

// The ledger's statements. Start and end times are this process's wall
// clock: every process of a scenario runs on one machine, and the times
// bound the handler's work itself, not the writes around it.
const (
	startSQL = `
INSERT INTO probe_ledger (task_id, attempt, claim_seq, epoch, node, incarnation, pid, started_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (task_id, claim_seq) DO UPDATE SET started_at = probe_ledger.started_at
RETURNING id`

	// endSQL records the end and whether the attempt was still the task's
	// current one at that moment: its task lease and its bucket lease, by
	// the database. This is the check a handler makes to fence its own side
	// effects with the token it is given (DESIGN §5.2); the tests use it to
	// tell a late execution of a frozen process (not current, so fenced)
	// from an overlap that the fleet let happen.
	endSQL = `
UPDATE probe_ledger l SET ended_at = $2, outcome = $3,
    current = EXISTS (
        SELECT 1 FROM flotilla_tasks t JOIN flotilla_bucket_leases b ON b.bucket = t.bucket
        WHERE t.id = l.task_id AND t.claim_seq = l.claim_seq AND t.owner = l.incarnation
          AND t.status IN ('running', 'stopping', 'pausing')
          AND b.owner = l.incarnation AND b.epoch = l.epoch AND b.expires_at > statement_timestamp())
WHERE l.id = $1`
)

// retry runs a ledger write until it succeeds or ledgerTimeout has passed:
// a scenario may restart PostgreSQL under the ledger too, and the pool
// reconnects on the next try. Each write is one statement, and the start
// is keyed by the attempt's claim_seq, so a write that committed although
// its answer was lost is not recorded twice when tried again.
func (l *ledger) retry(ctx context.Context, write func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ledgerTimeout)
	defer cancel()
	for {
		err := write(ctx)
		if err == nil || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// probe is the handler of the probe kind.
func (l *ledger) probe(ctx context.Context, t *task.Task) error {
	started := time.Now()
	var p ProbePayload
	if len(t.Payload) > 0 && string(t.Payload) != "null" {
		if err := json.Unmarshal(t.Payload, &p); err != nil {
			return fmt.Errorf("%w: probe payload %s: %v", task.ErrNoRetry, t.Payload, err)
		}
	}
	d, err := time.ParseDuration(p.Duration)
	if p.Duration == "" {
		d, err = 0, nil
	}
	if err != nil || d < 0 {
		return fmt.Errorf("%w: probe duration %q is not a duration", task.ErrNoRetry, p.Duration)
	}

	var row int64
	if l.file != nil {
		err = l.writeLine(FileRecord{Event: "start", Task: t.ID, ClaimSeq: t.ClaimSeq, Attempt: t.Attempt, Epoch: t.Epoch,
			Bucket: t.Bucket, Node: t.Node, LimitKey: store.LimitKeyOf(t.Key, t.LimitKey), Schedule: t.Schedule,
			ScheduledFor: t.ScheduledFor, At: started})
	} else {
		err = l.retry(ctx, func(wctx context.Context) error {
			return l.pool.QueryRow(wctx, startSQL, t.ID, t.Attempt, t.ClaimSeq, t.Epoch, t.Node, t.Owner, l.pid, started).Scan(&row)
		})
	}
	if err != nil {
		// Nothing has been done yet: the attempt fails and is retried.
		return fmt.Errorf("probe: recording the start: %w", err)
	}

	outcome, result := "done", error(nil)
	timer := time.NewTimer(d)
	select {
	case <-timer.C:
	case <-ctx.Done():
		timer.Stop()
		result = context.Cause(ctx)
		outcome = "interrupted: " + result.Error()
	}
	ended := time.Now()

	if l.file != nil {
		err = l.writeLine(FileRecord{Event: "end", Task: t.ID, ClaimSeq: t.ClaimSeq, At: ended, Outcome: outcome})
	} else {
		err = l.retry(ctx, func(wctx context.Context) error {
			_, err := l.pool.Exec(wctx, endSQL, row, ended, outcome)
			return err
		})
	}
	if err != nil {
		l.log.Error("probe: recording the end failed; the ledger row stays open",
			zap.Int64("task", t.ID), zap.Int("attempt", t.Attempt), zap.Error(err))
		if result == nil {
			result = fmt.Errorf("probe: recording the end: %w", err)
		}
	}
	return result
}
