package sqlite

import (
	"context"
	"errors"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// errNoLimits answers every limits method until the SQLite schema carries
// limits.
var errNoLimits = errors.New("sqlite store: limits are not in this schema yet")

// UpsertLimit is not available yet.
func (s *Store) UpsertLimit(context.Context, store.Limit) (store.Limit, error) {
	return store.Limit{}, errNoLimits
}

// ListLimits is not available yet.
func (s *Store) ListLimits(context.Context) ([]store.Limit, error) { return nil, errNoLimits }

// DeleteLimit is not available yet.
func (s *Store) DeleteLimit(context.Context, string) error { return errNoLimits }

// ClaimLimited is not available yet.
func (s *Store) ClaimLimited(context.Context, store.ClaimRequest, store.LimitedClaim) ([]*task.Task, error) {
	return nil, errNoLimits
}

// ActiveUse is not available yet.
func (s *Store) ActiveUse(context.Context, []int) ([]store.ActiveUse, error) { return nil, errNoLimits }

// TakeShare is not available yet.
func (s *Store) TakeShare(context.Context, store.ShareRequest) (store.Share, error) {
	return store.Share{}, errNoLimits
}

// ListShares is not available yet.
func (s *Store) ListShares(context.Context) ([]store.ShareUse, error) { return nil, errNoLimits }

// SetWaitReasons is not available yet.
func (s *Store) SetWaitReasons(context.Context, string, []store.HeldBucket, []store.WaitReason) (int, error) {
	return 0, errNoLimits
}
