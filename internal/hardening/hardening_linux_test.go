package hardening

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	"go.uber.org/goleak"
)

// helperEnv makes the test binary act as a process that hardens itself
// and reports, instead of running the tests: the test process itself must
// stay as it is.
const helperEnv = "HARDENING_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(reportDumpable())
	}
	goleak.VerifyTestMain(m)
}

func reportDumpable() int {
	before, err := Dumpable()
	if err == nil {
		err = DisableDumping()
	}
	var after bool
	if err == nil {
		after, err = Dumpable()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Print(boolWord(before), " ", boolWord(after))
	return 0
}

func boolWord(b bool) string {
	if b {
		return "dumpable"
	}
	return "non-dumpable"
}

func TestDisableDumping(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper: %v", err)
	}
	if got, want := string(out), "dumpable non-dumpable"; got != want {
		t.Errorf("the process was %q before and after DisableDumping, want %q", got, want)
	}
}
