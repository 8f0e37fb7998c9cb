package node

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// limiter is the holder's in-memory view of its limits: what runs per
// limit key and kind, which resources are taken, each rate-limited key's
// next start, and its shares of fleet-wide limits. Every key lives in one
// bucket and every bucket has one holder, so this view is the only one that
// decides for the keys of the buckets held here: no lock across nodes, and
// nothing persistent that could leak a slot.
//
// Counts come from two places: this node's own attempts under the epoch it
// holds each bucket in (tracked exactly by attempt, held at claim and
// released once the handler has returned and the outcome is written or
// given up), and the active rows of its buckets that are not those (a
// previous holder's, or an older epoch's), read from the store at every
// refresh until they are settled or rescued. A bucket takes part in a
// limited claim only once a refresh has read its rows under the epoch it is
// held in now: a takeover never admits more than a limit.
type limiter struct {
	store    store.Store
	owner    string
	node     string
	clock    func() time.Time
	capacity store.Resources
	conc     int
	log      *zap.Logger
	ttl      time.Duration // share TTL: the bucket lease TTL
	margin   time.Duration

	// on mirrors activeLocked for the claim loop, and owned counts own:
	// with no limit declared a claim pass and a settled attempt read them
	// and never take mu, so the claim path costs what it did without
	// limits.
	on    atomic.Bool
	owned atomic.Int64
	// fleetWide mirrors whether a fleet-wide limit names one of the
	// node's kinds: only then does an outcome write claim along
	// (Node.flushAndClaim).
	fleetWide atomic.Bool

	// shareGate serialises the limited claims with the share takes. A
	// claim decided under a share must have committed before a take that
	// may shrink that share commits, and a claim after the take must see
	// the new share: otherwise another holder, granted what this one's new
	// share and committed rows leave, could start beside tasks this holder
	// claims under the old share, and the fleet would run more than N.
	shareGate sync.Mutex
	// shareWanted is set by a claim that found a fleet-wide limit's kind
	// without room: the next share pass takes the share again, so that a
	// holder whose share is spent asks for more before the heartbeat.
	shareWanted atomic.Bool

	mu     sync.Mutex
	loaded bool
	limits map[string][]store.Limit // by kind
	// own is what each of the node's attempts holds, by attempt; ownTasks
	// counts them by task. foreign is what the active rows of others hold,
	// by task id.
	own         map[task.Ref]use
	ownTasks    map[int64]int
	foreign     map[int64]use
	running     map[kindKey]int
	kindRunning map[string]int
	used        store.Resources
	// ready is the epoch each bucket's active rows were last read under.
	ready map[int]int64
	// acquired is when each bucket was taken under its epoch, on the local
	// clock: a rate-limited key starts with no tokens at a takeover.
	acquired map[int]time.Time
	tat      map[rateKey]time.Time
	// tatBucket is the bucket of each key in tat: a bucket that leaves, or
	// is taken under a new epoch, takes its keys' rate state with it, so
	// that a node retaking a bucket starts its keys empty at the
	// acquisition like any new holder.
	tatBucket map[rateKey]int
	shares    map[string]shareState // by limit name
	reasons   map[kindKey]string    // written on the task rows
	// wideSent, wideAt and wideTook are the reasons naming more than one
	// key last sent, when, and how long the store took to write them
	// (writeReasons).
	wideSent string
	wideAt   time.Time
	wideTook time.Duration
	// turn and round are the round robin across limit keys (start-time
	// fair queuing): a start of key k is tagged max(turn[k], round), turn[k]
	// becomes the tag plus one, and round is the highest tag started. A
	// key's turn minus round is how many rounds it is ahead; keys at or
	// behind the round are forgotten as soon as the round passes them, as
	// they start in the round. Every key in turn is named in each limited
	// claim, so a round also ends once maxKeysAhead keys are ahead of it.
	turn  map[kindKey]int
	round int
	// closed is the (limit, key) pairs closed at the last refresh, to count
	// closures; uses is what that refresh saw, for LimitUse and metrics.
	closed  map[rateKey]bool
	uses    []LimitUse
	metrics LimitMetrics // nil when Config.Metrics does not follow limits
	// onReady, when set, is told when a refresh has made the held buckets
	// ready for a limited claim (the node wakes its claim loop).
	onReady func()
}

// LimitUse is what one limit naming a kind the node serves uses on this
// node, as of its last refresh of the limits (every bucket lease
// heartbeat).
type LimitUse struct {
	Limit string
	Kind  string
	Per   string // store.PerKey or store.PerFleet
	// Running is the tasks of the kind running in the node's buckets: its
	// own attempts and the rows of a previous holder not yet settled.
	Running int
	// ClosedKeys is the limit keys the limit holds closed now (per key):
	// their queued tasks wait.
	ClosedKeys int
	// Closures is the keys the limit closed since the refresh before.
	Closures int
	// Share is the node's share of a fleet-wide limit (0 for per key).
	Share int
}

// LimitMetrics is what a Metrics may also implement to follow the limits:
// the node calls it after each refresh of its limits, from the limits
// loop. It must not block.
type LimitMetrics interface {
	LimitsRefreshed(uses []LimitUse)
}

type kindKey struct{ kind, key string }

type rateKey struct{ limit, key string }

type use struct {
	kind, key string
	resources store.Resources
}

type shareState struct {
	share    int
	demand   int       // published with it
	deadline time.Time // local: sent + TTL - margin
}

func newLimiter(s store.Store, owner, node string, capacity store.Resources, conc int, ttl time.Duration,
	now func() time.Time, log *zap.Logger) *limiter {
	l := &limiter{
		store: s, owner: owner, node: node, capacity: capacity, conc: conc, ttl: ttl, margin: deadlineMargin(ttl),
		clock: now, log: log,
		limits: map[string][]store.Limit{}, own: map[task.Ref]use{}, ownTasks: map[int64]int{},
		foreign: map[int64]use{},
		running: map[kindKey]int{}, kindRunning: map[string]int{}, used: store.Resources{},
		ready: map[int]int64{}, acquired: map[int]time.Time{}, tat: map[rateKey]time.Time{}, tatBucket: map[rateKey]int{},
		shares: map[string]shareState{}, reasons: map[kindKey]string{}, turn: map[kindKey]int{},
		closed: map[rateKey]bool{},
	}
	// Until the limits have been read once, claims go through the limiter,
	// which has no bucket ready yet: a node in a fleet with limits never
	// claims as if there were none, even when its first reading fails.
	l.on.Store(true)
	return l
}

// active reports whether claims must go through the limits: a limit names
// one of the node's kinds, or the node declares capacities. It takes no
// lock.
func (l *limiter) active() bool { return l.on.Load() }

func (l *limiter) activeLocked() bool { return len(l.limits) > 0 || len(l.capacity) > 0 }

func (l *limiter) add(u use, sign int) {
	k := kindKey{u.kind, u.key}
	l.running[k] += sign
	if l.running[k] <= 0 {
		delete(l.running, k)
	}
	l.kindRunning[u.kind] += sign
	if l.kindRunning[u.kind] <= 0 {
		delete(l.kindRunning, u.kind)
	}
	for name, v := range u.resources {
		l.used[name] += int64(sign) * v
	}
}

// hold counts the tasks a limited claim has just taken, takes a rate
// token for each, and moves their keys on in the round robin. Every tag of
// the batch is read against the round before it: the claim ordered them
// in that round.
func (l *limiter) hold(ts []*task.Task) {
	if len(ts) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock()
	top := l.round
	for _, t := range ts {
		ref := t.Ref()
		if _, ok := l.own[ref]; ok {
			continue
		}
		// An earlier attempt of the task may still be held: ended by the
		// transaction that claimed this one (flushAndClaim), or given up
		// while its handler still runs. It keeps its own hold until its
		// release, which names it and never this one.
		u := use{kind: t.Kind, key: store.LimitKeyOf(t.Key, t.LimitKey), resources: t.Resources}
		if old, ok := l.foreign[t.ID]; ok { // read by a refresh while it was being claimed
			l.add(old, -1)
			delete(l.foreign, t.ID)
		}
		l.own[ref] = u
		l.ownTasks[t.ID]++
		l.owned.Add(1)
		l.add(u, 1)
		for _, lim := range l.limits[t.Kind] {
			if lim.Rate > 0 && u.key != "" { // a task without a key is under no per-key limit
				rk := rateKey{lim.Name, u.key}
				l.tat[rk] = l.tatOf(lim, rk, t.Bucket, now).Add(interval(lim))
				l.tatBucket[rk] = t.Bucket
			}
		}
		k := kindKey{u.kind, u.key}
		tag := max(l.turn[k], l.round)
		l.turn[k] = tag + 1
		top = max(top, tag)
	}
	l.advance(top)
	for len(l.turn) > maxKeysAhead {
		l.advance(l.round + 1)
	}
}

// maxKeysAhead bounds the keys ahead of the round robin's round, which
// every limited claim names with their turn. Without a bound, a backlog
// spread over many keys (10,000 keys of one task each at the head of the
// queue) has nearly every key ahead until each has started once, and each
// claim would send and join them all: that cost grew with the keys, not
// with the tasks claimed. Ending the round early lets a key that started in
// it start once more before the keys that have not, at most once per
// maxKeysAhead keys started: the order stays a round robin over any window
// of fewer keys.
const maxKeysAhead = 1024

// advance moves the round to round (never back) and forgets the turns it
// has reached: those keys start in the round like keys never seen.
func (l *limiter) advance(round int) {
	if round <= l.round {
		return
	}
	l.round = round
	for k, turn := range l.turn {
		if turn <= l.round {
			delete(l.turn, k)
		}
	}
}

// release frees what the attempt ref held (Node.releaseLimits calls it
// once the attempt's handler has returned and its outcome is written or
// given up): never what another attempt of its task holds, and nothing on
// a second call. An attempt claimed while no limit applied holds nothing,
// and releasing it takes no lock.
func (l *limiter) release(ref task.Ref) {
	if l.owned.Load() == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if u, ok := l.own[ref]; ok {
		l.add(u, -1)
		delete(l.own, ref)
		if l.ownTasks[ref.ID]--; l.ownTasks[ref.ID] <= 0 {
			delete(l.ownTasks, ref.ID)
		}
		l.owned.Add(-1)
	}
}

func interval(lim store.Limit) time.Duration { return lim.Interval() }

// window is the time a rate limit's whole burst takes to refill.
func window(lim store.Limit) time.Duration {
	_, w := lim.BurstWindow()
	return w
}

// tatOf is a key's theoretical arrival time (GCRA): it may start a task at
// now when tat - now <= (burst-1) × interval. A key not seen yet starts
// empty at its bucket's acquisition and fills at the limit's rate, so that
// a new holder never adds a burst to what the previous one started.
func (l *limiter) tatOf(lim store.Limit, rk rateKey, bucket int, now time.Time) time.Time {
	if tat, ok := l.tat[rk]; ok {
		return maxTime(tat, now)
	}
	at, ok := l.acquired[bucket]
	if !ok {
		at = now
	}
	return maxTime(now, at.Add(window(lim)))
}

// freshTAT is tatOf for a key not seen yet in any held bucket: the
// youngest acquisition counts.
func (l *limiter) freshTAT(lim store.Limit, now time.Time) time.Time {
	youngest := time.Time{}
	for _, at := range l.acquired {
		if at.After(youngest) {
			youngest = at
		}
	}
	return maxTime(now, youngest.Add(window(lim)))
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// tokens is how many starts a rate limit allows at now for a key whose
// tat is tat.
func tokens(lim store.Limit, tat, now time.Time) int {
	iv := interval(lim)
	burst, w := lim.BurstWindow()
	slack := w - tat.Sub(now)
	if slack < iv {
		return 0
	}
	return min(burst, int(slack/iv))
}

// claim builds the limited claim for the buckets in held that are ready,
// and returns them. The tasks ending (of attempts whose outcomes the same
// transaction writes before it claims) count as released.
func (l *limiter) claim(held []store.HeldBucket, ending []task.Ref) ([]store.HeldBucket, store.LimitedClaim) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ref := range ending {
		if u, ok := l.own[ref]; ok {
			l.add(u, -1)
			defer l.add(u, 1)
		}
	}
	ready := make([]store.HeldBucket, 0, len(held))
	for _, h := range held {
		if e, ok := l.ready[h.Bucket]; ok && e == h.Epoch {
			ready = append(ready, h)
		}
	}
	now := l.clock()
	var lc store.LimitedClaim
	narrow := func(room *int, v int) {
		if *room < 0 || v < *room {
			*room = max(0, v)
		}
	}
	// roomOf is what the per-key limits of kind leave a key (-1 for none);
	// a key not seen has nothing running and has not started under a rate
	// limit yet.
	roomOf := func(kind, key string, seen bool) int {
		if seen && key == "" {
			return -1 // a task without a key or limit key is under no per-key limit
		}
		room, used := -1, 0
		if seen {
			used = l.running[kindKey{kind, key}]
		}
		for _, lim := range l.limits[kind] {
			switch {
			case lim.Per == store.PerFleet:
			case lim.Concurrency > 0:
				narrow(&room, lim.Concurrency-used)
			case lim.Rate > 0:
				tat, ok := l.tat[rateKey{lim.Name, key}]
				if !seen || !ok {
					tat = l.freshTAT(lim, now)
				}
				narrow(&room, tokens(lim, tat, now))
			}
		}
		return room
	}
	// unseenRoom is roomOf for a key not seen, by kind; rated lists the
	// kinds with a rate limit, whose keys' rooms depend on their own state.
	unseenRoom := make(map[string]int, len(l.limits))
	rated := map[string]bool{}
	for kind, lims := range l.limits {
		unseenRoom[kind] = roomOf(kind, "", false)
		kr := store.KindRoom{Kind: kind, Room: -1, KeyRoom: unseenRoom[kind]}
		for _, lim := range lims {
			if lim.Rate > 0 {
				rated[kind] = true
			}
			if lim.Per == store.PerFleet {
				narrow(&kr.Room, l.shareLocked(lim.Name, now)-l.kindRunning[kind])
			}
		}
		lc.Kinds = append(lc.Kinds, kr)
	}
	// The keys named, each once: those running, those ahead in the round
	// robin (every turn kept is ahead: hold forgets the others), and those a
	// rate limit has seen. A key ahead with nothing running and no rate
	// state has the room of a key not seen.
	lc.Keys = make([]store.KeyRoom, 0, len(l.running)+len(l.turn))
	for k, used := range l.running {
		lc.Keys = append(lc.Keys, store.KeyRoom{Kind: k.kind, Key: k.key, Room: roomOf(k.kind, k.key, true),
			Used: used, Turn: max(0, l.turn[k]-l.round)})
	}
	for k, turn := range l.turn {
		if l.running[k] > 0 {
			continue
		}
		room, ok := unseenRoom[k.kind]
		if !ok {
			room = -1
		}
		if rated[k.kind] || k.key == "" {
			room = roomOf(k.kind, k.key, true)
		}
		lc.Keys = append(lc.Keys, store.KeyRoom{Kind: k.kind, Key: k.key, Room: room, Turn: turn - l.round})
	}
	ratedNamed := map[kindKey]bool{}
	for kind, lims := range l.limits {
		for _, lim := range lims {
			if lim.Rate == 0 {
				continue
			}
			for rk := range l.tat {
				k := kindKey{kind, rk.key}
				if rk.limit != lim.Name || ratedNamed[k] || l.running[k] > 0 {
					continue
				}
				if _, ahead := l.turn[k]; ahead {
					continue
				}
				ratedNamed[k] = true
				lc.Keys = append(lc.Keys, store.KeyRoom{Kind: kind, Key: rk.key, Room: roomOf(kind, rk.key, true)})
			}
		}
	}
	// Tasks with neither a key nor a limit key share the limit key "",
	// which is in a random bucket of each of them: counted as one key,
	// every holder would enforce its own "" key and the limit would grow
	// with the fleet. They are under no per-key limit of their kind (its
	// fleet-wide limits and the resources still apply), so "" is named
	// with no room of its own wherever a per-key limit would close it.
	for kind, room := range unseenRoom {
		k := kindKey{kind, ""}
		if room < 0 || l.running[k] > 0 {
			continue
		}
		if _, named := l.turn[k]; named {
			continue
		}
		lc.Keys = append(lc.Keys, store.KeyRoom{Kind: kind, Key: "", Room: -1})
	}
	// A key is busy, and left out of the claim's second walk, from half
	// the use of the busiest key: the keys using less are seen even when
	// they queue behind its backlog.
	busiest := 0
	for _, n := range l.running {
		busiest = max(busiest, n)
	}
	lc.BusyAt = max(1, (busiest+1)/2)
	lc.Free, lc.Capacity = l.freeLocked(), maps.Clone(l.capacity)
	if lc.Capacity == nil {
		lc.Capacity = store.Resources{} // none at all: a task that needs any never starts here
	}
	return ready, lc
}

// freeLocked is what the node has free of each resource it has.
func (l *limiter) freeLocked() store.Resources {
	free := store.Resources{}
	for name, c := range l.capacity {
		free[name] = max(0, c-l.used[name])
	}
	return free
}

// shareLocked is the holder's share of the fleet-wide limit named: 0 once
// not renewed in time (nothing more starts under it).
func (l *limiter) shareLocked(limit string, now time.Time) int {
	sh := l.shares[limit]
	if now.After(sh.deadline) {
		return 0
	}
	return sh.share
}

// rateIdle is how long past its last start's due time a rate-limited
// key's state is kept, in periods of its limit: after that it has its
// whole burst again, which is what a key not seen starts with.
const rateIdle = 1

// prune forgets the rate state of keys idle for a period of their limit
// (or whose limit is gone). A key forgotten starts as a key not seen, which
// is never allowed more: a fresh key starts from the youngest bucket
// acquisition, at the earliest now. (The round robin's turns need no
// pruning: hold forgets each as the round reaches it.)
func (l *limiter) prune() {
	now := l.clock()
	period := map[string]time.Duration{}
	for _, lims := range l.limits {
		for _, lim := range lims {
			if lim.Rate > 0 {
				period[lim.Name] = lim.Period
			}
		}
	}
	for rk, tat := range l.tat {
		p, ok := period[rk.limit]
		if !ok || now.Sub(tat) > rateIdle*p {
			delete(l.tat, rk)
			delete(l.tatBucket, rk)
		}
	}
}

// refresh reloads the limits, reads the active rows of the held buckets,
// renews the shares of fleet-wide limits and writes the reasons why keys
// wait. held is read at the start; a bucket becomes ready under the epoch
// it had then. A node with no limit and no capacity only writes why its
// tasks that need resources wait.
func (l *limiter) refresh(ctx context.Context, held []store.HeldBucket, kinds []string) {
	all, err := l.store.ListLimits(ctx)
	if err != nil {
		l.log.Warn("reading limits failed; keeping the last ones", zap.Error(err))
		return
	}
	byKind := map[string][]store.Limit{}
	fleetWide := false
	for _, lim := range all {
		if slices.Contains(kinds, lim.Kind) {
			byKind[lim.Kind] = append(byKind[lim.Kind], lim)
			fleetWide = fleetWide || lim.Per == store.PerFleet
		}
	}
	l.mu.Lock()
	l.limits, l.loaded = byKind, true
	active := l.activeLocked()
	l.on.Store(active)
	l.fleetWide.Store(fleetWide)
	l.prune()
	if !active {
		l.uses, l.closed = nil, map[rateKey]bool{}
	}
	l.mu.Unlock()
	if !active {
		// Its plain claim passes over every task that needs resources:
		// those in its buckets wait for good, and say so.
		l.writeReasons(ctx, held, kinds)
		return
	}
	buckets := make([]int, len(held))
	for i, h := range held {
		buckets[i] = h.Bucket
	}
	rows, err := l.store.ActiveUse(ctx, buckets)
	if err != nil {
		l.log.Warn("reading the running tasks of held buckets failed", zap.Error(err))
		return
	}
	epochOf := map[int]int64{}
	for _, h := range held {
		epochOf[h.Bucket] = h.Epoch
	}
	l.mu.Lock()
	for id, u := range l.foreign {
		l.add(u, -1)
		delete(l.foreign, id)
	}
	for _, r := range rows {
		if l.ownTasks[r.ID] > 0 && r.Owner == l.owner && r.Epoch == epochOf[r.Bucket] {
			continue
		}
		u := use{kind: r.Kind, key: r.LimitKey, resources: r.Resources}
		l.foreign[r.ID] = u
		l.add(u, 1)
	}
	for _, h := range held {
		l.ready[h.Bucket] = h.Epoch
	}
	fleet := []store.Limit{}
	for _, lims := range l.limits {
		for _, lim := range lims {
			if lim.Per == store.PerFleet {
				fleet = append(fleet, lim)
			}
		}
	}
	l.mu.Unlock()
	if l.onReady != nil {
		// A bucket just taken can be claimed in now, before the shares
		// and the reasons are written.
		l.onReady()
	}

	for _, lim := range fleet {
		l.takeShare(ctx, lim, buckets)
	}
	l.writeReasons(ctx, held, kinds)
}

// shareRenewal is how often a holder that holds, uses or wants a share of
// a fleet-wide limit takes it again between its limit refreshes (or at its
// heartbeat, when that is shorter). Shares follow the demands only as often
// as holders take them: at each heartbeat alone a holder that took the
// whole limit before the others came kept it for a heartbeat while they
// waited with nothing, and a holder that ran out of queued tasks kept its
// share idle as long. Each take is one short transaction under the limit's
// row lock.
const shareRenewal = 100 * time.Millisecond

// renewShares takes again the share of each fleet-wide limit whose holder
// holds one, runs tasks of its kind or published a demand, or whose kind a
// claim found without room since the last pass. A holder with none of
// these renews at its heartbeat only. It reports whether it took any.
func (l *limiter) renewShares(ctx context.Context, held []store.HeldBucket) bool {
	if !l.active() {
		return false // no limit names the node's kinds: nothing to renew, and no lock taken
	}
	wanted := l.shareWanted.Swap(false)
	l.mu.Lock()
	var due []store.Limit
	if l.loaded {
		for _, lims := range l.limits {
			for _, lim := range lims {
				sh := l.shares[lim.Name]
				if lim.Per == store.PerFleet && (wanted || sh.share > 0 || sh.demand > 0 || l.kindRunning[lim.Kind] > 0) {
					due = append(due, lim)
				}
			}
		}
	}
	l.mu.Unlock()
	if len(due) == 0 {
		return false
	}
	buckets := make([]int, len(held))
	for i, h := range held {
		buckets[i] = h.Bucket
	}
	for _, lim := range due {
		l.takeShare(ctx, lim, buckets)
	}
	return true
}

func (l *limiter) takeShare(ctx context.Context, lim store.Limit, buckets []int) {
	l.shareGate.Lock()
	defer l.shareGate.Unlock()
	l.mu.Lock()
	running := l.kindRunning[lim.Kind]
	l.mu.Unlock()
	sent := l.clock()
	sh, err := l.store.TakeShare(ctx, store.ShareRequest{Limit: lim.Name, Owner: l.owner, Node: l.node,
		Running: running, MaxDemand: l.conc, Buckets: buckets, Capacity: l.capacity, TTL: l.ttl})
	if err != nil {
		// The old share stays until its local deadline, then counts as 0.
		l.log.Warn("renewing a share of a fleet-wide limit failed", zap.String("limit", lim.Name), zap.Error(err))
		return
	}
	l.mu.Lock()
	l.shares[lim.Name] = shareState{share: sh.Share, demand: sh.Demand, deadline: sent.Add(l.ttl - l.margin)}
	l.mu.Unlock()
}

// releaseShares gives back, at a graceful shutdown, the shares of the
// fleet-wide limits this holder took: with its buckets released it claims
// nothing more, and a share left live would hold the fleet below its limit
// for up to a lease TTL at each step of a rolling deploy. It publishes a
// demand of nothing, so that its grant is 0; what its handlers still run
// (past Shutdown's deadline) counts for the others by its rows, as for a
// lapsed share. A store that does not answer leaves the share to lapse.
func (l *limiter) releaseShares(ctx context.Context) {
	if !l.active() {
		return
	}
	l.mu.Lock()
	var held []string
	for name, sh := range l.shares {
		if sh.share > 0 || sh.demand > 0 {
			held = append(held, name)
		}
	}
	l.mu.Unlock()
	if len(held) == 0 {
		return
	}
	slices.Sort(held)
	l.shareGate.Lock()
	defer l.shareGate.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	for _, name := range held {
		_, err := l.store.TakeShare(ctx, store.ShareRequest{Limit: name, Owner: l.owner, Node: l.node, TTL: l.ttl})
		if err != nil {
			l.log.Warn("giving back a share of a fleet-wide limit at shutdown failed; it lapses with its TTL",
				zap.String("limit", name), zap.Error(err))
			continue
		}
		l.mu.Lock()
		l.shares[name] = shareState{}
		l.mu.Unlock()
	}
}

// maxReasonKeys bounds the keys whose reasons one refresh writes.
const maxReasonKeys = 100

// writeReasons writes, on the waiting rows of each key a limit has closed,
// why they wait; a key that reopened has its reason cleared by the claim.
// A key's reason is sent once while it stays closed. The reasons that name
// a whole kind (its fleet-wide share is in use) or the tasks that need
// more than the node has free are sent when they change, and again while
// they hold once wideReasonsPace times the last send's duration has
// passed, with every closed key's reason beside them (the store gives a
// row its key's first); the store leaves the rows that carry their reason
// already.
func (l *limiter) writeReasons(ctx context.Context, held []store.HeldBucket, kinds []string) {
	l.mu.Lock()
	now := l.clock()
	var fresh, keys []store.WaitReason
	closed := map[rateKey]bool{}
	for kind, lims := range l.limits {
		for _, lim := range lims {
			switch {
			case lim.Per == store.PerKey && lim.Concurrency > 0:
				for k, n := range l.running {
					if k.kind == kind && k.key != "" && n >= lim.Concurrency {
						closed[rateKey{lim.Name, k.key}] = true
						fresh, keys = l.reasonLocked(fresh, keys, k, fmt.Sprintf("concurrency limit %s: %s at %d/%d", lim.Name, k.key, n, lim.Concurrency))
					}
				}
			case lim.Rate > 0:
				for rk, tat := range l.tat {
					if rk.limit == lim.Name && tokens(lim, tat, now) == 0 {
						closed[rk] = true
						next := tat.Sub(now) - (window(lim) - interval(lim))
						fresh, keys = l.reasonLocked(fresh, keys, kindKey{kind, rk.key}, fmt.Sprintf("rate limit %s: %s, next start in %v",
							lim.Name, rk.key, next.Round(100*time.Millisecond)))
					}
				}
			}
		}
	}
	wide := l.wideReasonsLocked(now, kinds)
	if sig := wideSignature(wide); sig == l.wideSent && now.Sub(l.wideAt) < wideReasonsPace*l.wideTook {
		wide = nil // sent already; rows waiting since get them at the next send
	} else {
		l.wideSent, l.wideAt = sig, now
	}
	uses := l.usesLocked(closed, now)
	metrics := l.metrics
	l.mu.Unlock()
	if metrics != nil {
		metrics.LimitsRefreshed(uses)
	}
	out := fresh
	if len(wide) > 0 {
		out = append(keys, wide...)
	}
	if len(out) == 0 {
		return
	}
	sent := l.clock()
	if _, err := l.store.SetWaitReasons(ctx, l.owner, held, out); err != nil {
		l.log.Warn("writing wait reasons failed", zap.Error(err))
	}
	if len(wide) > 0 {
		l.mu.Lock()
		l.wideTook = l.clock().Sub(sent)
		l.mu.Unlock()
	}
}

// wideReasonsPace spaces the sends of reasons naming more than one key
// that have not changed: each send reads every waiting row of the held
// buckets, and a row that starts waiting after one gets its reason at the
// next. At 50 times the last send's duration, the reads take at most about
// 2% of the time: with a small backlog a task gets its reason at the next
// refresh, and with 100,000 rows waiting (0.35 s a send on PostgreSQL)
// within about 20 s.
const wideReasonsPace = 50

// wideSignature tells two lists of reasons naming more than one key apart,
// but for what is free: what is free changes as tasks start and end, and
// which rows each names follows it at the next send.
func wideSignature(rs []store.WaitReason) string {
	var b strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&b, "%s\x00%v\x00%s\x00", r.Kind, r.ByResources, r.Reason)
	}
	return b.String()
}

// wideReasonsLocked returns the reasons that name more than one key: for
// each of kinds, that tasks needing more than the node has free wait for
// it, and, when the kind's share of a fleet-wide limit is in use, that
// its tasks wait for the share.
func (l *limiter) wideReasonsLocked(now time.Time, kinds []string) []store.WaitReason {
	var out []store.WaitReason
	free := l.freeLocked()
	resources := fmt.Sprintf("resources: more than node %s has free (capacity %s)", l.node, l.capacity)
	if len(l.capacity) == 0 {
		resources = fmt.Sprintf("resources: node %s declares no capacity (node.Config.Capacity)", l.node)
	}
	for _, kind := range kinds {
		out = append(out, store.WaitReason{Kind: kind, AllKeys: true, ByResources: true, Free: free, Reason: resources})
	}
	for _, kind := range kinds {
		for _, lim := range l.limits[kind] {
			if lim.Per != store.PerFleet {
				continue
			}
			if l.shareLocked(lim.Name, now)-l.kindRunning[kind] <= 0 {
				out = append(out, store.WaitReason{Kind: kind, AllKeys: true,
					Reason: fmt.Sprintf("fleet limit %s: %s at this holder's share of %d", lim.Name, kind, lim.Concurrency)})
				break
			}
		}
	}
	return out
}

// usesLocked sums what each limit uses given the pairs closed now, counts
// the closures since the last refresh, and keeps both.
func (l *limiter) usesLocked(closed map[rateKey]bool, now time.Time) []LimitUse {
	keys, closures := map[string]int{}, map[string]int{}
	for rk := range closed {
		keys[rk.limit]++
		if !l.closed[rk] {
			closures[rk.limit]++
		}
	}
	l.closed = closed
	var uses []LimitUse
	for kind, lims := range l.limits {
		for _, lim := range lims {
			u := LimitUse{Limit: lim.Name, Kind: kind, Per: lim.Per, Running: l.kindRunning[kind],
				ClosedKeys: keys[lim.Name], Closures: closures[lim.Name]}
			if lim.Per == store.PerFleet {
				u.Share = l.shareLocked(lim.Name, now)
			}
			uses = append(uses, u)
		}
	}
	slices.SortFunc(uses, func(a, b LimitUse) int { return strings.Compare(a.Limit, b.Limit) })
	l.uses = uses
	return slices.Clone(uses)
}

// LimitUse returns what each limit naming one of the node's kinds uses on
// this node, by limit name, as of the last refresh of the limits.
func (n *Node) LimitUse() []LimitUse {
	n.limits.mu.Lock()
	defer n.limits.mu.Unlock()
	return slices.Clone(n.limits.uses)
}

func (l *limiter) reasonLocked(fresh, keys []store.WaitReason, k kindKey, reason string) ([]store.WaitReason, []store.WaitReason) {
	if len(keys) >= maxReasonKeys {
		return fresh, keys
	}
	r := store.WaitReason{Kind: k.kind, LimitKey: k.key, Reason: reason}
	keys = append(keys, r)
	if l.reasons[k] != "" {
		return fresh, keys // written while the key stays closed; the claim clears it
	}
	l.reasons[k] = reason
	return append(fresh, r), keys
}

// opened forgets the reasons of keys whose tasks were claimed: their rows'
// reasons were cleared by the claim.
func (l *limiter) opened(ts []*task.Task) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, t := range ts {
		delete(l.reasons, kindKey{t.Kind, store.LimitKeyOf(t.Key, t.LimitKey)})
	}
}

// acquiredBuckets notes buckets taken under a new epoch: not ready until
// the next refresh has read their running rows.
func (l *limiter) acquiredBuckets(hs []store.HeldBucket) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock()
	bs := make([]int, len(hs))
	for i, h := range hs {
		delete(l.ready, h.Bucket)
		l.acquired[h.Bucket] = now
		bs[i] = h.Bucket
	}
	l.forgetRatesLocked(bs)
}

// forgetRatesLocked drops the rate state of the keys of buckets bs: such a
// key, seen again, starts as a key not seen, empty at its bucket's
// acquisition. Kept, a key's state from before the bucket left would give
// it its burst again on a retake, after the holder between had started its
// own (10/10s burst 10 allowed 28 starts in under 10 s).
func (l *limiter) forgetRatesLocked(bs []int) {
	if len(l.tatBucket) == 0 || len(bs) == 0 {
		return
	}
	gone := make(map[int]bool, len(bs))
	for _, b := range bs {
		gone[b] = true
	}
	for rk, b := range l.tatBucket {
		if gone[b] {
			delete(l.tat, rk)
			delete(l.tatBucket, rk)
		}
	}
}

// bucketsLeft forgets what the limiter knew of buckets this node holds no
// more: they take part in no limited claim, and one taken again is not
// ready until a refresh has read its running rows under its new epoch, as
// on any takeover.
func (l *limiter) bucketsLeft(bs []int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, b := range bs {
		delete(l.ready, b)
		delete(l.acquired, b)
	}
	l.forgetRatesLocked(bs)
}

// sharePass renews the shares of fleet-wide limits between limit passes
// (see limiter.renewShares) and lets the claim loop use what it learnt.
func (n *Node) sharePass(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 2*n.stmtTimeout)
	defer cancel()
	if n.limits.renewShares(ctx, n.keeper.Held()) {
		n.claimLoop.poke()
	}
}

// limitPass refreshes the limiter (see limiter.refresh) and lets the claim
// loop use what it learnt.
func (n *Node) limitPass(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 2*n.stmtTimeout)
	defer cancel()
	n.limits.refresh(ctx, n.keeper.Held(), n.kinds)
	n.claimLoop.poke()
}
