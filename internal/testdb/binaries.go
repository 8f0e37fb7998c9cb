package testdb

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// EnvServerBin names the environment variable that may hold the directory
// of the PostgreSQL server binaries (initdb, pg_ctl, postgres) that private
// servers are started with. Unset, the newest /usr/lib/postgresql/*/bin is
// used (Debian's layout), and else the directory of initdb on PATH.
const EnvServerBin = "FLOTILLA_TEST_PG_BIN"

// ServerBinaries are the programs a private server needs.
var ServerBinaries = []string{"initdb", "pg_ctl", "postgres"}

// serverUser is the operating system user that private servers run as when
// the tests run as root, which initdb and postgres refuse.
const serverUser = "postgres"

// ServerBinDir returns the directory holding every one of ServerBinaries,
// or an error that says what is missing and how to install it.
func ServerBinDir() (string, error) {
	if dir := os.Getenv(EnvServerBin); dir != "" {
		if missing := missingIn(dir); len(missing) > 0 {
			return "", fmt.Errorf("%s=%s lacks %s", EnvServerBin, dir, strings.Join(missing, ", "))
		}
		return dir, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	// The newest version first: 9.6 < 10 < 15 as numbers, not as strings.
	slices.SortFunc(dirs, func(a, b string) int { return compareVersions(versionOf(b), versionOf(a)) })
	for _, dir := range dirs {
		if len(missingIn(dir)) == 0 {
			return dir, nil
		}
	}
	if initdb, err := exec.LookPath("initdb"); err == nil {
		dir := filepath.Dir(initdb)
		if len(missingIn(dir)) == 0 {
			return dir, nil
		}
	}
	return "", errors.New("the PostgreSQL server binaries (initdb, pg_ctl, postgres) are not installed: " +
		"on Debian or Ubuntu, apt-get install postgresql (they go to /usr/lib/postgresql/<version>/bin); " +
		"elsewhere set " + EnvServerBin + " to the directory that holds them")
}

// missingIn returns which of ServerBinaries dir lacks.
func missingIn(dir string) []string {
	var missing []string
	for _, name := range ServerBinaries {
		if info, err := os.Stat(filepath.Join(dir, name)); err != nil || info.IsDir() || info.Mode()&0o111 == 0 {
			missing = append(missing, name)
		}
	}
	return missing
}

// versionOf returns the version in a path /usr/lib/postgresql/<version>/bin.
func versionOf(binDir string) string { return filepath.Base(filepath.Dir(binDir)) }

// compareVersions compares dotted versions number by number; a part that is
// not a number sorts before every number.
func compareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := range max(len(as), len(bs)) {
		x, y := -1, -1
		if i < len(as) {
			if n, err := strconv.Atoi(as[i]); err == nil {
				x = n
			}
		}
		if i < len(bs) {
			if n, err := strconv.Atoi(bs[i]); err == nil {
				y = n
			}
		}
		if x != y {
			return x - y
		}
	}
	return 0
}

// serverCredential returns who a private server runs as: nil (the tests'
// own user) unless the tests run as root, and then the postgres user.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(serverUser)
	if err != nil {
		return nil, fmt.Errorf("the tests run as root, which PostgreSQL refuses to run as, and there is no %q user to run it as "+
			"(on Debian, apt-get install postgresql creates it): %w", serverUser, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %s: uid %q: %w", serverUser, u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %s: gid %q: %w", serverUser, u.Gid, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
}

// ServerPrerequisites returns what private servers need and this machine
// lacks, each with how to get it; none when they can run.
func ServerPrerequisites() []string {
	var missing []string
	if _, err := ServerBinDir(); err != nil {
		missing = append(missing, err.Error())
	}
	if _, err := serverCredential(); err != nil {
		missing = append(missing, err.Error())
	}
	return missing
}
