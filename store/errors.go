package store

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every store translates its driver's errors into these at
// the edge, so callers never import a driver.
var (
	// ErrNotFound: no such task, command, schedule or node.
	ErrNotFound = errors.New("not found")
	// ErrConflict: a compare-and-set lost; the row's status_version (or a
	// schedule's next fire time) moved on since the caller read it.
	ErrConflict = errors.New("conflict: changed since it was read")
	// ErrFenced: a write about an active task or a held bucket from an
	// attempt or holder that has been superseded (another claim_seq, another
	// incarnation, another bucket epoch, or a lease no longer held). The
	// write changed nothing.
	ErrFenced = errors.New("fenced: the attempt or lease has been superseded")
	// ErrDuplicate: a unique key already names an unfinished task, or a
	// schedule name is taken.
	ErrDuplicate = errors.New("duplicate")
	// ErrBusy: the row is locked by another transaction, and the caller
	// asked not to wait for it (store.Transition.NoWait). Try again later.
	ErrBusy = errors.New("busy: the task's row is locked by another transaction")
	// ErrNodeAlive: a live process already runs under this node id.
	ErrNodeAlive = errors.New("a live process already uses this node id")
	// ErrBucketCount: the fleet was created with another bucket count.
	ErrBucketCount = errors.New("bucket count differs from the fleet's")
	// ErrSchema: the database schema is not the one this binary knows.
	ErrSchema = errors.New("schema version mismatch")
	// ErrInvalid: a request that no store could carry out (a bad status, a
	// missing kind, a payload that is not JSON).
	ErrInvalid = errors.New("invalid request")
)

// BucketCountError says that the fleet's bucket count is fixed and differs
// from the one asked for.
type BucketCountError struct {
	Fleet, Requested int
}

func (e *BucketCountError) Error() string {
	return fmt.Sprintf("this fleet has %d buckets, fixed when it was created; %d were asked for "+
		"(the bucket count cannot change: start every node with %d, or create a new database)",
		e.Fleet, e.Requested, e.Fleet)
}

func (e *BucketCountError) Is(target error) bool { return target == ErrBucketCount }

// SchemaError says that the database schema is older or newer than the one
// this binary was built for.
type SchemaError struct {
	Database, Binary int
}

func (e *SchemaError) Error() string {
	switch {
	case e.Database == 0:
		return "the database has no flotilla schema: create it with flotilla.Migrate (or Store.Migrate)"
	case e.Database < e.Binary:
		return fmt.Sprintf("the database schema is version %d, older than this binary's %d: "+
			"upgrade it with flotilla.Migrate (or Store.Migrate)",
			e.Database, e.Binary)
	default:
		return fmt.Sprintf("the database schema is version %d, newer than this binary's %d: upgrade this binary",
			e.Database, e.Binary)
	}
}

func (e *SchemaError) Is(target error) bool { return target == ErrSchema }

// NodeAliveError names the node id that is already in use and by whom.
type NodeAliveError struct {
	NodeID      string
	Incarnation string
}

func (e *NodeAliveError) Error() string {
	return fmt.Sprintf("node id %q is in use by a live process (incarnation %s): stop it, "+
		"wait for its heartbeat to expire, or give node.Config.NodeID another id", e.NodeID, e.Incarnation)
}

func (e *NodeAliveError) Is(target error) bool { return target == ErrNodeAlive }
