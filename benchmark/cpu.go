package benchmark

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// clockTick is the unit of the CPU times in /proc/<pid>/stat (USER_HZ,
// 100 on every Linux this runs on).
const clockTick = 10 * time.Millisecond

// BackendCPU is the CPU time used so far by each PostgreSQL backend
// connected to the pool's database, by process id. It reads /proc, so it
// works only when the server runs on this machine (as the benchmarks'
// does); elsewhere it returns an error and callers report no figure.
// CPU time is far less sensitive than elapsed time to other work on a
// shared machine, which makes it the steadier measure of what a workload
// costs the database.
type BackendCPU map[int]time.Duration

// ReadBackendCPU reads the CPU time of the backends of the pool's
// database.
func ReadBackendCPU(ctx context.Context, pool *pgxpool.Pool) (BackendCPU, error) {
	rows, err := pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
	if err != nil {
		return nil, fmt.Errorf("backend cpu: %w", err)
	}
	defer rows.Close()
	out := BackendCPU{}
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			return nil, fmt.Errorf("backend cpu: %w", err)
		}
		cpu, err := processCPU(pid)
		if err != nil {
			return nil, fmt.Errorf("backend cpu: %w", err)
		}
		out[pid] = cpu
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("backend cpu: %w", err)
	}
	return out, nil
}

// Since is the CPU time the backends used since before was read; a backend
// that was not there then counts from its start. (A backend that exited in
// between is lost: read before closing the pools.)
func (c BackendCPU) Since(before BackendCPU) time.Duration {
	var d time.Duration
	for pid, cpu := range c {
		d += cpu - before[pid]
	}
	return d
}

// processCPU is the user and system CPU time of a process, from
// /proc/<pid>/stat.
func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces;
	// utime and stime are fields 14 and 15, the 12th and 13th after it.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	return time.Duration(utime+stime) * clockTick, nil
}

// ProcessCPU is the CPU time this process has used so far, user and
// system.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
