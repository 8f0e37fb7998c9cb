package kinds

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"syscall"
)

// ErrUnknownUser is wrapped by LookupExecUser's refusal of a name or uid
// that the system's user database does not hold.
var ErrUnknownUser = errors.New("no such user")

// ErrExecUserNeedsRoot is wrapped by the refusal of an ExecConfig with a
// User on a node that does not run as root: only root may start a child
// under another uid, and a node that cannot keep the promise must not start.
var ErrExecUserNeedsRoot = errors.New("running exec children as another user needs the node to run as root")

// ExecUser is the account exec children run as (ExecConfig.User).
type ExecUser struct {
	Name string // as the operator named it, for messages
	UID  uint32
	GID  uint32 // the account's primary group
	Home string // the child's HOME
}

// LookupExecUser resolves a user name or numeric uid through the system's
// user database. A uid must have an entry too: its primary group and home
// come from there.
func LookupExecUser(spec string) (*ExecUser, error) {
	if spec == "" {
		return nil, fmt.Errorf("exec user: empty name: give a user name or a numeric uid")
	}
	var (
		u   *user.User
		err error
	)
	if _, numErr := strconv.ParseUint(spec, 10, 32); numErr == nil {
		u, err = user.LookupId(spec)
	} else {
		u, err = user.Lookup(spec)
	}
	var unknownName user.UnknownUserError
	var unknownID user.UnknownUserIdError
	switch {
	case errors.As(err, &unknownName), errors.As(err, &unknownID):
		return nil, fmt.Errorf("exec user %q: %w in the system's user database", spec, ErrUnknownUser)
	case err != nil:
		return nil, fmt.Errorf("exec user %q: %w", spec, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("exec user %q: uid %q is not numeric", spec, u.Uid)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("exec user %q: gid %q is not numeric", spec, u.Gid)
	}
	return &ExecUser{Name: spec, UID: uint32(uid), GID: uint32(gid), Home: u.HomeDir}, nil
}

// geteuid is os.Geteuid; tests replace it to check the refusal on a node
// that runs as root.
var geteuid = os.Geteuid

// validateExecUser refuses a User the node cannot switch to.
func validateExecUser(u *ExecUser) error {
	if u == nil {
		return nil
	}
	if euid := geteuid(); euid != 0 {
		return fmt.Errorf("exec: ExecConfig.User %s: %w (the node runs as uid %d); run the node as root, or leave ExecConfig.User nil and run the node itself as the user the children should have",
			u.Name, ErrExecUserNeedsRoot, euid)
	}
	return nil
}

// credential is the child's uid and gid, with no supplementary group: the
// node's groups (root's, at that) must not follow the child.
func (u *ExecUser) credential() *syscall.Credential {
	return &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: []uint32{}}
}
