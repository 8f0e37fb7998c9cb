package node

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/clock"
	"github.com/flotilla-dev/flotilla/store"
)

// leaseKeeper holds a node's bucket leases (DESIGN §6). Each tick it asks,
// in one statement, for every declared bucket: it renews what it holds,
// takes what is free or expired, and stands by for what a live node holds.
//
// The database decides who holds a bucket; the keeper decides how long this
// process may trust its own answer. Every lease it holds carries a local
// deadline, anchored to the moment before the renewal was sent, so that the
// node stops using a bucket before the database could give it to someone
// else. A failed renewal (database unreachable) is not a lost lease: the
// node keeps serving until that deadline, since nobody else can reach the
// database to take the bucket either.
type leaseKeeper struct {
	store     store.Store
	owner     string // incarnation
	node      string
	declared  bucket.Set
	ttl       time.Duration
	heartbeat time.Duration
	margin    time.Duration
	clock     clock.Clock
	log       *zap.Logger

	// onAcquired is told of buckets taken (or taken again under a new
	// epoch), so the node can rescue their tasks at once. It is called
	// without the keeper's lock held. Buckets lost need no news: the
	// lease's context (lease) ends, and with it every attempt claimed
	// under it; onLost, when set, is told of them all the same.
	onAcquired func([]store.HeldBucket)
	onLost     func([]int)
	metrics    Metrics

	mu      sync.Mutex
	held    map[int]heldLease
	standby map[int]string // bucket -> node holding it, while this node waits
	timer   clock.Timer
	lastOK  time.Time // when the last renewal that the database answered was sent
	// take, when set, is what a balancing node may take among the free
	// buckets it declares: those the assignment gives it (balancer). Nil
	// takes every free bucket declared, as a node that does not balance
	// does.
	take *bucket.Set
	// giving are the held buckets this node is handing to another node
	// (handoffs): it serves them no more (Held leaves them out) but renews
	// their leases until they are handed over.
	giving map[int]bool
	// answered is a digest of the last answer (each declared bucket's
	// holder and epoch); moved says it changed, or showed a bucket nobody
	// holds, since the balancer last asked (movedSince).
	answered uint64
	moved    bool
	// dbClock reckons the database's clock, from which lease expiry is
	// judged, on this process's own: see reckoning.
	dbClock reckoning
}

// reckoning is a node's estimate of the database's clock: the time the
// database gave in an answer (at), and this process's time when that
// statement was sent (sent). Lease decisions are the database's, on its
// clock; a failover to a primary whose clock runs ahead would make every
// live lease look expired at once, and a standby would take buckets whose
// holders still serve them. So each statement asks the database to judge
// expiry no later than this reckoning (+ the deadline margin), and an
// answer whose time runs ahead of it by more than the margin is not taken
// as the new reckoning for one TTL: the new clock is trusted once every
// live holder has had a TTL to renew on it. A clock that steps back is
// adopted at once; it can only make leases last longer.
type reckoning struct {
	at, sent time.Time
	until    time.Time // local: the old reckoning is kept until then
}

// judgeAt is the database time at which a statement sent at sent should
// judge expiry; zero before the first answer.
func (r reckoning) judgeAt(sent time.Time, margin time.Duration) time.Time {
	if r.at.IsZero() {
		return time.Time{}
	}
	return r.at.Add(sent.Sub(r.sent) + margin)
}

// observe takes the database's time asOf from the answer to a statement
// sent at sent. It returns how far the database's clock ran ahead of the
// reckoning when that is more than margin (a step), else 0.
func (r *reckoning) observe(asOf, sent time.Time, margin, ttl time.Duration) time.Duration {
	if asOf.IsZero() {
		return 0
	}
	if r.at.IsZero() {
		r.at, r.sent = asOf, sent
		return 0
	}
	ahead := asOf.Sub(r.at.Add(sent.Sub(r.sent)))
	if ahead > margin {
		if r.until.IsZero() {
			r.until = sent.Add(ttl)
			return ahead
		}
		if sent.Before(r.until) {
			return 0
		}
	}
	r.at, r.sent, r.until = asOf, sent, time.Time{}
	return 0
}

type heldLease struct {
	epoch    int64
	deadline time.Time // local: sent + ttl - margin, on this process's clock
	// ctx lives as long as this lease under this epoch: it is cancelled
	// (cause ErrBucketLost) when the bucket is lost, its deadline passes,
	// or it is taken again under a new epoch. Attempts claimed under the
	// epoch derive their contexts from it, as an etcd session's Done does
	// for the work done under its lease.
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// newHeldLease starts the context of a lease just acquired.
func newHeldLease(epoch int64, deadline time.Time) heldLease {
	ctx, cancel := context.WithCancelCause(context.Background())
	return heldLease{epoch: epoch, deadline: deadline, ctx: ctx, cancel: cancel}
}

// deadlineMargin is the default safety margin between the local deadline
// and the lease's expiry in the database: max(250ms, TTL/10).
func deadlineMargin(ttl time.Duration) time.Duration {
	return max(250*time.Millisecond, ttl/10)
}

// tick renews and acquires every declared bucket once.
func (k *leaseKeeper) tick(ctx context.Context) error {
	// Anchor the deadline before the statement is sent: the database may
	// start the TTL any time after this.
	sent := k.clock.Now()
	ctx, cancel := context.WithTimeout(ctx, max(k.heartbeat/2, 100*time.Millisecond))
	defer cancel()
	k.mu.Lock()
	judgeAt := k.dbClock.judgeAt(sent, k.margin)
	k.mu.Unlock()
	leases, err := k.store.AcquireBuckets(ctx, store.AcquireRequest{
		Owner: k.owner, Node: k.node, Buckets: k.declared, TTL: k.ttl, Take: k.takeNow(),
		JudgeAt: judgeAt,
	})
	if err != nil {
		k.reportTo().BucketLeasesTicked(0, 0, err)
		k.log.Warn("bucket lease renewal failed; serving held buckets until their local deadline",
			zap.Error(err), zap.String("held", k.heldSet().String()))
		return fmt.Errorf("renewing bucket leases: %w", err)
	}
	deadline := sent.Add(k.ttl - k.margin)
	if len(leases) > 0 {
		k.mu.Lock()
		step := k.dbClock.observe(leases[0].AsOf, sent, k.margin, k.ttl)
		k.mu.Unlock()
		if step > 0 {
			k.log.Warn("the database's clock ran ahead of this node's reckoning; lease expiry is judged on the reckoning for one TTL",
				zap.Duration("ahead", step), zap.Duration("ttl", k.ttl))
		}
	}

	var acquired []store.HeldBucket
	var lost, handed []int
	waiting := map[int]string{}
	k.mu.Lock()
	for _, l := range leases {
		cur, had := k.held[l.Bucket]
		switch {
		case l.Held && had && cur.epoch == l.Epoch:
			cur.deadline = deadline
			k.held[l.Bucket] = cur
		case l.Held:
			if had {
				// Lost and taken again since the last tick: whatever ran
				// under the old epoch is fenced and must stop.
				cur.cancel(ErrBucketLost)
				lost = append(lost, l.Bucket)
			}
			acquired = append(acquired, store.HeldBucket{Bucket: l.Bucket, Epoch: l.Epoch})
			k.held[l.Bucket] = newHeldLease(l.Epoch, deadline)
		default:
			if had {
				// A definite answer: someone else holds it now. A bucket
				// this node was handing over is, but for a lapse in the
				// middle, at its successor: the hand-off's own answer may
				// come a moment after the announcement that woke this tick.
				if k.giving[l.Bucket] {
					cur.cancel(errHandedOff)
					handed = append(handed, l.Bucket)
				} else {
					cur.cancel(ErrBucketLost)
					lost = append(lost, l.Bucket)
				}
				delete(k.held, l.Bucket)
				delete(k.giving, l.Bucket)
			}
			if l.Holder != "" {
				waiting[l.Bucket] = l.Node
			}
		}
	}
	if d, free := digest(leases); d != k.answered || free {
		k.answered, k.moved = d, true
	}
	standbyChanged := !sameStandby(k.standby, waiting)
	k.standby = waiting
	k.lastOK = sent
	k.armLocked()
	k.mu.Unlock()
	k.reportTo().BucketLeasesTicked(len(acquired), len(lost), nil)

	if len(acquired) > 0 {
		k.log.Info("bucket leases acquired", zap.String("buckets", describeHeld(acquired)))
	}
	if len(lost) > 0 {
		k.log.Warn("bucket leases lost to another node, or taken again under a new epoch; "+
			"stopped claiming there and cancelled the handlers of the old epoch",
			zap.String("buckets", bucket.Of(lost...).String()))
		k.tellLost(lost)
	}
	if len(handed) > 0 {
		k.tellLost(handed)
	}
	if standbyChanged && len(waiting) > 0 {
		k.log.Info("standing by for buckets held by live nodes", zap.String("waiting", describeStandby(waiting)))
	}
	if len(acquired) > 0 {
		k.onAcquired(acquired)
	}
	return nil
}

// digest sums up an answer's holders and epochs, and reports whether a
// bucket in it has no holder.
func digest(leases []store.BucketLease) (d uint64, free bool) {
	h := fnv.New64a()
	var buf [8]byte
	for _, l := range leases {
		binary.LittleEndian.PutUint64(buf[:], uint64(l.Bucket)<<32^uint64(l.Epoch))
		_, _ = h.Write(buf[:])
		_, _ = h.Write([]byte(l.Holder))
		free = free || l.Holder == ""
	}
	return h.Sum64(), free
}

// movedSince reports whether the holders of the declared buckets changed,
// or one was free, at a renewal since the last call.
func (k *leaseKeeper) movedSince() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	moved := k.moved
	k.moved = false
	return moved
}

// expire drops every lease whose local deadline has passed. It runs from a
// timer of its own, so a renewal loop stuck on a dead connection cannot keep
// the node claiming past the point where the database may have moved on.
func (k *leaseKeeper) expire() {
	now := k.clock.Now()
	var lost []int
	k.mu.Lock()
	for b, h := range k.held {
		if !now.Before(h.deadline) {
			h.cancel(ErrBucketLost)
			delete(k.held, b)
			delete(k.giving, b)
			lost = append(lost, b)
		}
	}
	k.armLocked()
	k.mu.Unlock()
	k.reportTo().BucketLeasesExpired(len(lost))
	if len(lost) > 0 {
		sort.Ints(lost)
		k.log.Warn("bucket lease deadline passed without a renewal; stopped claiming there "+
			"and cancelled the handlers", zap.String("buckets", bucket.Of(lost...).String()))
		k.tellLost(lost)
	}
}

func (k *leaseKeeper) tellLost(lost []int) {
	if k.onLost != nil {
		k.onLost(lost)
	}
}

// armLocked sets the deadline timer to the earliest deadline held.
func (k *leaseKeeper) armLocked() {
	if k.timer != nil {
		k.timer.Stop()
		k.timer = nil
	}
	var earliest time.Time
	for _, h := range k.held {
		if earliest.IsZero() || h.deadline.Before(earliest) {
			earliest = h.deadline
		}
	}
	if !earliest.IsZero() {
		k.timer = k.clock.AfterFunc(earliest.Sub(k.clock.Now()), k.expire)
	}
}

// Held returns the buckets this node serves now, with their epochs: held in
// the database at the last answer, within their local deadline, and not
// being handed to another node. Claims, schedules, rescues, limits and
// retention work in these alone.
func (k *leaseKeeper) Held() []store.HeldBucket {
	return k.holding(false)
}

// holding is Held, with the buckets being handed over when giving is set.
func (k *leaseKeeper) holding(giving bool) []store.HeldBucket {
	now := k.clock.Now()
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]store.HeldBucket, 0, len(k.held))
	for b, h := range k.held {
		if now.Before(h.deadline) && (giving || !k.giving[b]) {
			out = append(out, store.HeldBucket{Bucket: b, Epoch: h.epoch})
		}
	}
	slices.SortFunc(out, func(a, b store.HeldBucket) int { return cmp.Compare(a.Bucket, b.Bucket) })
	return out
}

// takeNow is the request's Take: what the balancer lets this node take,
// and what it holds (whose expired leases it may take again), or nil when
// the node takes every free bucket it declares.
func (k *leaseKeeper) takeNow() *bucket.Set {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.take == nil {
		return nil
	}
	bs := k.take.Slice()
	for b := range k.held {
		bs = append(bs, b)
	}
	set := bucket.Of(bs...)
	return &set
}

// setTake sets what the node may take among the free buckets it declares;
// it reports whether some of them are not held yet.
func (k *leaseKeeper) setTake(take bucket.Set) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.take = &take
	for _, b := range take.Slice() {
		if _, ok := k.held[b]; !ok {
			return true
		}
	}
	return false
}

// give stops serving bucket b, to hand it over: it reports the epoch it is
// held under and the context of that lease, or false when it is not held.
func (k *leaseKeeper) give(b int) (int64, context.Context, bool) {
	now := k.clock.Now()
	k.mu.Lock()
	defer k.mu.Unlock()
	h, ok := k.held[b]
	if !ok || !now.Before(h.deadline) || k.giving[b] {
		return 0, nil, false
	}
	if k.giving == nil {
		k.giving = map[int]bool{}
	}
	k.giving[b] = true
	return h.epoch, h.ctx, true
}

// keep serves bucket b again: its hand-off was called off.
func (k *leaseKeeper) keep(b int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.giving, b)
}

// handedOff forgets bucket b, handed to another node under a new epoch; it
// reports false when the lease was lost meanwhile (and forgotten then).
func (k *leaseKeeper) handedOff(b int, epoch int64) bool {
	k.mu.Lock()
	h, ok := k.held[b]
	if ok && h.epoch == epoch {
		h.cancel(errHandedOff)
		delete(k.held, b)
		delete(k.giving, b)
		k.armLocked()
	}
	k.mu.Unlock()
	if ok && h.epoch == epoch {
		k.tellLost([]int{b})
	}
	return ok && h.epoch == epoch
}

// Holds reports whether this node may use bucket b now, and under which epoch.
func (k *leaseKeeper) Holds(b int) (int64, bool) {
	epoch, _, ok := k.lease(b)
	return epoch, ok
}

// lease returns the epoch under which this node may use bucket b now, and
// the context that ends with the lease under that epoch.
func (k *leaseKeeper) lease(b int) (int64, context.Context, bool) {
	now := k.clock.Now()
	k.mu.Lock()
	defer k.mu.Unlock()
	h, ok := k.held[b]
	if !ok || !now.Before(h.deadline) {
		return 0, nil, false
	}
	return h.epoch, h.ctx, true
}

// holdsAny reports whether the node holds, and is not handing over, one of
// buckets. A notification names one bucket or a few, and comes with every
// submission: this looks them up rather than building the held set.
func (k *leaseKeeper) holdsAny(buckets bucket.Set) bool {
	now := k.clock.Now()
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, b := range buckets.Slice() {
		if h, ok := k.held[b]; ok && now.Before(h.deadline) && !k.giving[b] {
			return true
		}
	}
	return false
}

func (k *leaseKeeper) heldSet() bucket.Set {
	held := k.Held()
	bs := make([]int, len(held))
	for i, h := range held {
		bs[i] = h.Bucket
	}
	return bucket.Of(bs...)
}

// release gives up the leases this incarnation holds, except those of the
// buckets in keep. It runs at shutdown, after the node's tasks are settled,
// with its own short timeout so that a cancelled parent context cannot skip
// it; expiry is the backstop. A bucket in keep is one where a handler is
// still running: its lease is left to lapse, as after a crash, so that the
// next holder cannot take the bucket (and rescue the task) before the
// database's expiry, and not at once.
func (k *leaseKeeper) release(ctx context.Context, keep bucket.Set) {
	k.mu.Lock()
	var give []int
	for b, h := range k.held {
		h.cancel(ErrBucketLost)
		if !keep.Contains(b) {
			give = append(give, b)
		}
	}
	k.held = map[int]heldLease{}
	k.giving = map[int]bool{}
	if k.timer != nil {
		k.timer.Stop()
		k.timer = nil
	}
	k.mu.Unlock()
	if keep.Len() > 0 {
		k.log.Warn("bucket leases left to lapse: handlers still run in them",
			zap.String("buckets", keep.String()))
		if len(give) == 0 {
			return
		}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	// An empty set releases every lease of the owner.
	only := bucket.Set{}
	if keep.Len() > 0 {
		only = bucket.Of(give...)
	}
	released, err := k.store.ReleaseBuckets(ctx, k.owner, only)
	if err != nil {
		k.log.Warn("releasing bucket leases failed; they will expire", zap.Error(err))
		return
	}
	k.log.Info("bucket leases released", zap.String("buckets", bucket.Of(released...).String()))
}

// stopTimer ends the deadline timer and the leases' contexts; the keeper
// is no longer used.
func (k *leaseKeeper) stopTimer() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, h := range k.held {
		h.cancel(ErrBucketLost)
	}
	if k.timer != nil {
		k.timer.Stop()
		k.timer = nil
	}
}

func sameStandby(a, b map[int]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// describeStandby groups waiting buckets by the node holding them:
// "0-15 (node-a), 16 (node-b)".
func describeStandby(waiting map[int]string) string {
	byNode := map[string][]int{}
	for b, n := range waiting {
		if n == "" {
			n = "unknown"
		}
		byNode[n] = append(byNode[n], b)
	}
	nodes := make([]string, 0, len(byNode))
	for n := range byNode {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	parts := make([]string, len(nodes))
	for i, n := range nodes {
		parts[i] = fmt.Sprintf("%s (%s)", bucket.Of(byNode[n]...).String(), n)
	}
	return strings.Join(parts, ", ")
}

// describeHeld groups acquired buckets by epoch: "0-31 (epoch 2), 40 (epoch 5)".
func describeHeld(held []store.HeldBucket) string {
	byEpoch := map[int64][]int{}
	for _, h := range held {
		byEpoch[h.Epoch] = append(byEpoch[h.Epoch], h.Bucket)
	}
	epochs := make([]int64, 0, len(byEpoch))
	for e := range byEpoch {
		epochs = append(epochs, e)
	}
	sort.Slice(epochs, func(i, j int) bool { return epochs[i] < epochs[j] })
	parts := make([]string, len(epochs))
	for i, e := range epochs {
		parts[i] = fmt.Sprintf("%s (epoch %d)", bucket.Of(byEpoch[e]...).String(), e)
	}
	return strings.Join(parts, ", ")
}

// status reports what readiness needs: the buckets held now, the buckets
// waited for, and when the database last answered a renewal.
func (k *leaseKeeper) status() (held []store.HeldBucket, standby int, lastOK time.Time) {
	held = k.Held()
	k.mu.Lock()
	defer k.mu.Unlock()
	return held, len(k.standby), k.lastOK
}
