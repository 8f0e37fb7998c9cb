package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/flotilla-dev/flotilla/bucket"
)

// The one way a task may run again after a run that finished, short of a
// kill -9: the node's bucket lease lapsed while the outcome was still being
// written (a node whose renewals fell behind on a loaded machine), the
// bucket's next holder took it under a new epoch, and the late outcome was
// fenced (invariant 2), so the next holder ran the task again. A hand-off
// never ends that way: it waits for the outcomes before it gives the lease.
// leaseLapses reads it from the nodes' logs, so that the scenario excuses a
// run again only when both halves are there: the node lost the run's bucket
// without handing it over, and its outcome was fenced.

// lapseLog is what the nodes' logs say of lost leases and fenced outcomes.
type lapseLog struct {
	// lost are the buckets each process (by pid) lost without handing
	// them over.
	lost map[int]map[int]bool
	// fenced are the attempts (task, claim_seq) whose outcome was fenced,
	// by pid.
	fenced map[int]map[[2]int64]bool
}

// lapseLine is the part of a node's log line that leaseLapses reads.
type lapseLine struct {
	Msg      string `json:"msg"`
	Buckets  string `json:"buckets"`
	Bucket   *int   `json:"bucket"`
	Task     int64  `json:"task"`
	ClaimSeq int64  `json:"claim_seq"`
}

// Messages of the node's log (node/leases.go, node/handoff.go,
// node/complete.go) that leaseLapses reads.
const (
	msgLeaseDeadlinePassed = "bucket lease deadline passed without a renewal"
	msgLeasesLost          = "bucket leases lost to another node"
	msgLostDuringHandoff   = "bucket lease lost during its hand-off"
	msgNotHandedOver       = "buckets not handed over: this node no longer held them"
	msgFenced              = "fenced: the attempt was superseded"
)

// leaseLapses reads the logs of every process the fleet started.
func (e *elasticFleet) leaseLapses() lapseLog {
	e.mu.Lock()
	procs := append([]*proc(nil), e.every...)
	e.mu.Unlock()
	l := lapseLog{lost: map[int]map[int]bool{}, fenced: map[int]map[[2]int64]bool{}}
	for _, p := range procs {
		l.read(p.cmd.Process.Pid, p.output())
	}
	return l
}

func (l *lapseLog) read(pid int, output string) {
	sc := bufio.NewScanner(strings.NewReader(output))
	sc.Buffer(make([]byte, 0, 64*1024), 4*1024*1024)
	for sc.Scan() {
		var ln lapseLine
		if json.Unmarshal(sc.Bytes(), &ln) != nil {
			continue
		}
		switch {
		case strings.HasPrefix(ln.Msg, msgFenced):
			if l.fenced[pid] == nil {
				l.fenced[pid] = map[[2]int64]bool{}
			}
			l.fenced[pid][[2]int64{ln.Task, ln.ClaimSeq}] = true
		case strings.HasPrefix(ln.Msg, msgLostDuringHandoff) && ln.Bucket != nil:
			l.lose(pid, *ln.Bucket)
		case strings.HasPrefix(ln.Msg, msgLeaseDeadlinePassed), strings.HasPrefix(ln.Msg, msgLeasesLost),
			strings.HasPrefix(ln.Msg, msgNotHandedOver):
			set, err := bucket.ParseSet(ln.Buckets, 0)
			if err != nil {
				continue
			}
			for _, b := range set.Slice() {
				l.lose(pid, b)
			}
		}
	}
}

func (l *lapseLog) lose(pid, b int) {
	if l.lost[pid] == nil {
		l.lost[pid] = map[int]bool{}
	}
	l.lost[pid][b] = true
}

// excuse reports whether run x may have been run again: its node lost the
// run's bucket without handing it over, and the run's outcome was fenced.
func (l lapseLog) excuse(x probeRun) bool {
	return l.lost[x.pid][x.bucket] && l.fenced[x.pid][[2]int64{x.task, x.claimSeq}]
}

// describe says what the log of run x's node holds of the two halves.
func (l lapseLog) describe(x probeRun) string {
	return fmt.Sprintf("a loss of bucket %d: %t; its outcome fenced: %t", x.bucket, l.lost[x.pid][x.bucket],
		l.fenced[x.pid][[2]int64{x.task, x.claimSeq}])
}
