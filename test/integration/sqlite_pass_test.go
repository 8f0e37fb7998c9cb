package integration

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// sqlitePass are the CLI tests that run a second time with every fleet on
// an SQLite file (FLOTILLA_TEST_STORE=sqlite). The scenarios that need a
// TCP proxy, a server restart, row locks or the probe ledger stay
// PostgreSQL's; the kill -9, SIGSTOP and SIGTERM scenarios on SQLite
// (TestSQLite*) run in the first pass, as they always use SQLite.
var sqlitePass = []string{
	"TestBadBucketsExitTwo",
	"TestSubmitRefusals",
	"TestWorkerCLIFlagsAfterPositional",
	"TestStopFromAThirdProcess",
	"TestScheduleCLIRefusesBadDefinitions",
	"TestScheduleCLILifecycle",
	"TestTwoWorkersRunEachBucketsTasks",
	"TestAStandbyTakesOverAfterKill9",
	"TestSigtermReleasesBucketsForAStandby",
	"TestASecondProcessWithALiveNodeIDIsRefused",
	"TestStoppingAnExecTaskLeavesNoProcess",
	"TestExecIsRefusedWithoutAnAllowList",
	"TestAStandbyRescuesTheTaskOfAKilledHolder",
	"TestAKilledHoldersTaskOnItsLastAttemptIsLost",
	"TestWorkerReconcileRescuesOnlyUnheldBuckets",
}

// workerDirEnv hands the SQLite pass the directory of the binaries that
// this process built, so that it does not build them again.
const workerDirEnv = "FLOTILLA_TEST_WORKER_DIR"

// TestCLIOnSQLite runs the tests of sqlitePass again on SQLite: this test
// binary, in a child process with FLOTILLA_TEST_STORE=sqlite, beside the
// other tests of this run. Each test of the pass must have run and passed.
func TestCLIOnSQLite(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	if onSQLite(t) {
		t.Skip("this run is the SQLite pass")
	}
	// One test at a time: fleets on SQLite files contend for the disk and
	// for each file's one writer, and a loaded machine makes their first
	// lease statements miss their deadlines. The pass runs beside the
	// other tests all the same.
	args := []string{
		"-test.run=^(" + strings.Join(sqlitePass, "|") + ")$",
		"-test.count=1", "-test.v", "-test.parallel=1",
	}
	ctx := context.Background()
	if deadline, ok := t.Deadline(); ok {
		// Ends before this test's binary would, so that its output is seen.
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline.Add(-time.Minute))
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), testStoreEnv+"=sqlite", workerDirEnv+"="+workerDir)
	cmd.WaitDelay = exitWait
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("the SQLite pass failed (%v); its output:\n%s", err, out)
	}
	passed := regexp.MustCompile(`(?m)^--- PASS: (\w+) \(([0-9.]+s)\)$`).FindAllStringSubmatch(string(out), -1)
	took := map[string]string{}
	for _, m := range passed {
		took[m[1]] = m[2]
	}
	for _, name := range sqlitePass {
		if _, ok := took[name]; !ok {
			t.Errorf("%s did not pass on SQLite (is it still in this package under that name?)", name)
		}
	}
	t.Logf("on SQLite: %v", took)
}
