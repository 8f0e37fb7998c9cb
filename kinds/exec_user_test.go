package kinds

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"strings"
	"testing"
)

func TestLookupExecUser(t *testing.T) {
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Fatalf("this system has no user nobody: %v", err)
	}
	for _, spec := range []string{"nobody", nobody.Uid} {
		u, err := LookupExecUser(spec)
		if err != nil {
			t.Fatalf("LookupExecUser(%q): %v", spec, err)
		}
		if fmt.Sprint(u.UID) != nobody.Uid || fmt.Sprint(u.GID) != nobody.Gid || u.Home != nobody.HomeDir || u.Name != spec {
			t.Errorf("LookupExecUser(%q) = %+v, want nobody's uid %s, gid %s, home %s", spec, u, nobody.Uid, nobody.Gid, nobody.HomeDir)
		}
	}
}

func TestLookupExecUserRefusesAnUnknownUser(t *testing.T) {
	for _, spec := range []string{"no-such-user-flotilla", "4000000000"} {
		_, err := LookupExecUser(spec)
		if !errors.Is(err, ErrUnknownUser) || !strings.Contains(err.Error(), fmt.Sprintf("%q", spec)) {
			t.Errorf("LookupExecUser(%q) = %v, want ErrUnknownUser naming it", spec, err)
		}
	}
	if _, err := LookupExecUser(""); err == nil {
		t.Error(`LookupExecUser("") succeeded`)
	}
}

// TestExecUserNeedsRoot replaces the node's effective uid: only root can
// start a child under another uid, and a node that is not must refuse the
// configuration rather than run children as itself.
func TestExecUserNeedsRoot(t *testing.T) {
	u := &ExecUser{Name: "nobody", UID: 65534, GID: 65534}
	defer func(saved func() int) { geteuid = saved }(geteuid)
	geteuid = func() int { return 1000 }
	err := ExecConfig{User: u}.Validate()
	if !errors.Is(err, ErrExecUserNeedsRoot) {
		t.Fatalf("Validate() = %v, want ErrExecUserNeedsRoot", err)
	}
	for _, want := range []string{"ExecConfig.User nobody", "uid 1000", "run the node as root"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("err %q does not say %q", err, want)
		}
	}
	geteuid = func() int { return 0 }
	if err := (ExecConfig{User: u}).Validate(); err != nil {
		t.Errorf("Validate() as root = %v, want nil", err)
	}
}

// TestExecRunsTheChildAsTheExecUser runs real children as nobody where the
// tests run as root; elsewhere it checks that the node refuses the user.
func TestExecRunsTheChildAsTheExecUser(t *testing.T) {
	u, err := LookupExecUser("nobody")
	if err != nil {
		t.Fatal(err)
	}
	cfg := ExecConfig{Allowed: []string{"sh"}, User: u}
	if os.Geteuid() != 0 {
		if err := cfg.Validate(); !errors.Is(err, ErrExecUserNeedsRoot) {
			t.Fatalf("Validate() as uid %d = %v, want ErrExecUserNeedsRoot", os.Geteuid(), err)
		}
		return
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	b := setupExec(t, cfg)
	// The working directory must be one nobody may enter.
	tk := execTask(t, ExecPayload{Argv: []string{"sh", "-c", `echo "$(id -u) $(id -g) $(id -G) $HOME"`}, Dir: "/"})
	if err := b.run(t, tk); err != nil {
		t.Fatal(err)
	}
	// id -G lists the primary group alone: root's groups did not follow.
	want := fmt.Sprintf("%d %d %d %s\n", u.UID, u.GID, u.GID, u.Home)
	if got := execResult(t, tk).Stdout; got != want {
		t.Errorf("the child printed %q, want %q", got, want)
	}
}
