package store

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/flotilla-dev/flotilla/task"
)

// Limit scopes.
const (
	// PerKey applies a limit to each limit key of its kind on its own: the
	// holder of the key's bucket enforces it alone, in memory.
	PerKey = "key"
	// PerFleet applies a concurrency limit to every task of its kind in the
	// fleet: holders share it by quota (see TakeShare).
	PerFleet = "fleet"
)

// Limit is a flow-control rule declared as data the fleet shares. Exactly
// one of Concurrency and Rate is set.
type Limit struct {
	Name string
	Kind string
	Per  string // PerKey or PerFleet
	// Concurrency is the most tasks that may run at once: per limit key
	// (PerKey) or in the whole fleet (PerFleet).
	Concurrency int
	// Rate starts per Period, per limit key, with Burst starts allowed at
	// once (0 means 1). Only PerKey.
	Rate   int
	Period time.Duration
	Burst  int

	CreatedAt time.Time
	UpdatedAt time.Time
}

// Limit bounds.
const (
	MaxLimitConcurrency = 1_000_000
	MaxLimitRate        = 1_000_000
	MaxLimitPeriod      = 24 * time.Hour
	// MinLimitInterval is the shortest time between two starts a rate
	// may ask for (Period / Rate): the holder counts whole nanoseconds,
	// and rounds an interval up, so that a rate never allows more starts
	// than it names; from 1µs the rounding costs at most one start in a
	// thousand.
	MinLimitInterval = time.Microsecond
	// MaxLimitRefill bounds the time a rate limit takes to refill a
	// whole burst (Burst × Period / Rate): a holder computes it as a
	// duration, and a key that waits longer than a year for its burst is
	// no limit anyone means.
	MaxLimitRefill = 365 * 24 * time.Hour
)

// CheckLimit refuses a limit no store could keep, naming the bad field and
// what is valid. Every store calls it before writing.
func CheckLimit(l Limit) error {
	if err := CheckName("limit name", l.Name, true); err != nil {
		return err
	}
	if err := CheckName("limit kind", l.Kind, true); err != nil {
		return err
	}
	bad := func(field string, v any, problem, valid string) error {
		return &InvalidError{Field: field, Value: v, Problem: problem, Valid: valid}
	}
	switch {
	case l.Per != PerKey && l.Per != PerFleet:
		return bad("limit scope", l.Per, "is unknown", "give key or fleet")
	case (l.Concurrency != 0) == (l.Rate != 0):
		return bad("limit", l.Name, "needs exactly one of a concurrency and a rate", "give a Concurrency or a Rate")
	case l.Concurrency < 0 || l.Concurrency > MaxLimitConcurrency:
		return bad("limit concurrency", l.Concurrency, "is out of range", fmt.Sprintf("give 1 to %d", MaxLimitConcurrency))
	case l.Rate < 0 || l.Rate > MaxLimitRate:
		return bad("limit rate", l.Rate, "is out of range", fmt.Sprintf("give 1 to %d starts per period", MaxLimitRate))
	case l.Rate > 0 && l.Per != PerKey:
		return bad("limit scope", l.Per, "cannot carry a rate", "give a rate limit store.PerKey")
	case l.Rate > 0 && (l.Period < time.Millisecond || l.Period > MaxLimitPeriod || l.Period%time.Millisecond != 0):
		return bad("limit period", l.Period, "is out of range", "give whole milliseconds from 1ms to 24h")
	case l.Rate == 0 && (l.Period != 0 || l.Burst != 0):
		return bad("limit", l.Name, "has a period or burst without a rate", "give a Period and a Burst only with a Rate")
	case l.Burst < 0 || l.Burst > MaxLimitRate:
		return bad("limit burst", l.Burst, "is out of range", fmt.Sprintf("give 1 to %d, or 0 for 1", MaxLimitRate))
	case l.Rate > 0 && l.Period/time.Duration(l.Rate) < MinLimitInterval:
		return bad("Limit.Rate", l.Rate, fmt.Sprintf("starts per %v is more than one per %v", l.Period, MinLimitInterval),
			fmt.Sprintf("give at most %d per %v (Period / Rate at least %v)", l.Period/MinLimitInterval, l.Period, MinLimitInterval))
	case l.Rate > 0 && l.EffectiveBurst() > MaxBurst(l.Rate, l.Period):
		return bad("Limit.Burst", l.Burst, fmt.Sprintf("takes longer than %v to refill at %d per %v", MaxLimitRefill, l.Rate, l.Period),
			fmt.Sprintf("give at most %d (Burst × Period / Rate at most %v)", MaxBurst(l.Rate, l.Period), MaxLimitRefill))
	}
	return nil
}

// MaxBurst is the largest burst a rate of rate starts per period may
// have: the one it refills within MaxLimitRefill (at least 1, at most
// MaxLimitRate).
func MaxBurst(rate int, period time.Duration) int {
	iv := Limit{Rate: rate, Period: period}.Interval()
	return int(min(max(1, int64(MaxLimitRefill/iv)), MaxLimitRate))
}

// EffectiveBurst is the starts a rate limit allows at once.
func (l Limit) EffectiveBurst() int { return max(1, l.Burst) }

// Interval is the time between two starts a rate limit allows, Period /
// Rate rounded up to a whole nanosecond, so that no rate allows more
// starts than it names (at least 1ns, whatever was stored).
func (l Limit) Interval() time.Duration {
	if l.Rate <= 0 {
		return l.Period
	}
	r := time.Duration(l.Rate)
	return max(1, (l.Period+r-1)/r)
}

// BurstWindow is the starts a rate limit allows at once as a holder counts
// them, and the time they take to refill (burst × Interval): the burst is
// EffectiveBurst, but never more than refill within MaxLimitRefill, so that
// the window never overflows, even for a limit stored before CheckLimit
// refused larger bursts.
func (l Limit) BurstWindow() (burst int, window time.Duration) {
	iv := l.Interval()
	burst = min(l.EffectiveBurst(), int(max(1, MaxLimitRefill/iv)))
	return burst, time.Duration(burst) * iv
}

// String describes the rule: "concurrency 2 per key", "rate 10/1s burst 5
// per key", "concurrency 4 per fleet".
func (l Limit) String() string {
	if l.Rate > 0 {
		return fmt.Sprintf("rate %d/%v burst %d per %s", l.Rate, l.Period, l.EffectiveBurst(), l.Per)
	}
	return fmt.Sprintf("concurrency %d per %s", l.Concurrency, l.Per)
}

// Resources are named amounts: what a node has (its capacity) or what a
// task needs to start. Amounts are positive.
type Resources map[string]int64

// MaxResources bounds how many names one task or node may give.
const MaxResources = 16

// CheckResources refuses names CheckName refuses, amounts that are not
// positive, and more than MaxResources names. field names the input in the
// error ("resources", "capacity").
func CheckResources(field string, r Resources) error {
	if len(r) > MaxResources {
		return &InvalidError{Field: field, Value: r.String(), Problem: fmt.Sprintf("names %d resources", len(r)),
			Valid: fmt.Sprintf("give at most %d", MaxResources)}
	}
	for _, name := range slices.Sorted(maps.Keys(r)) {
		if err := CheckName(field+" name", name, true); err != nil {
			return err
		}
		if strings.ContainsAny(name, "=,") {
			return &InvalidError{Field: field + " name", Value: name, Problem: "contains = or ,", Valid: "give names without them"}
		}
		if strings.TrimSpace(name) != name {
			// " mem" would never match a task's "mem".
			return &InvalidError{Field: field + " name", Value: name, Problem: "has spaces around it",
				Valid: "give names without leading or trailing spaces"}
		}
		if v := r[name]; v <= 0 || v > 1<<40 {
			return &InvalidError{Field: field, Value: name + "=" + strconv.FormatInt(v, 10), Problem: "is out of range",
				Valid: "give a whole amount from 1 to 2^40"}
		}
	}
	return nil
}

// ParseResources reads "gpu=1,mem=8". The empty string is no resources.
func ParseResources(field, s string) (Resources, error) {
	if s == "" {
		return nil, nil
	}
	out := Resources{}
	for _, part := range strings.Split(s, ",") {
		name, amount, ok := strings.Cut(part, "=")
		// "gpu=1, mem=8" means mem, not " mem".
		name, amount = strings.TrimSpace(name), strings.TrimSpace(amount)
		if !ok {
			return nil, &InvalidError{Field: field, Value: part, Problem: "is not NAME=AMOUNT", Valid: "give e.g. gpu=1,mem=8"}
		}
		v, err := strconv.ParseInt(amount, 10, 64)
		if err != nil {
			return nil, &InvalidError{Field: field, Value: part, Problem: "has an amount that is not a whole number",
				Valid: "give e.g. gpu=1,mem=8"}
		}
		if _, dup := out[name]; dup {
			return nil, &InvalidError{Field: field, Value: name, Problem: "is given twice", Valid: "give each name once"}
		}
		out[name] = v
	}
	if err := CheckResources(field, out); err != nil {
		return nil, err
	}
	return out, nil
}

// String is "gpu=1,mem=8", names in order.
func (r Resources) String() string {
	parts := make([]string, 0, len(r))
	for _, name := range slices.Sorted(maps.Keys(r)) {
		parts = append(parts, name+"="+strconv.FormatInt(r[name], 10))
	}
	return strings.Join(parts, ",")
}

// Covers reports whether free has at least need of every resource.
func (r Resources) Covers(need Resources) bool {
	for name, v := range need {
		if r[name] < v {
			return false
		}
	}
	return true
}

// LimitKeyOf is the key a task's per-key limits count it under: its limit
// key, or its key when it has none.
func LimitKeyOf(key, limitKey string) string { return cmp.Or(limitKey, key) }

// LimitedClaim is what a holder with limits asks of ClaimLimited, from its
// in-memory view of what runs: which keys and kinds have room, and how much
// of each resource is free. A claim never takes more of a key, a kind or a
// resource than the room named here.
//
// The store looks at the first Scan due candidates in claim order
// (priority, run_at, id), leaving out those of a closed kind or key (room
// 0), and at the first Scan of those whose key is neither among the keys of
// the first candidates nor busy (KeyRoom.Used at or above BusyAt), so that
// the keys waiting behind a long backlog of one key are seen too. Over those
// candidates, in claim order, it takes a candidate when, counting the
// candidates before it in claim order, its rank within its (kind, limit key)
// is below the key's room and its rank within its kind below the kind's
// room, and when, counting the candidates before it in round-robin order,
// the running sum of every resource it needs is within Free (a candidate
// needing more than Capacity counting in none of these). Of those, it takes
// at most Limit in round-robin order: by the key's turn plus the
// candidate's rank within its key (KeyRoom.Turn, 0 for keys not named), then
// fewest used (KeyRoom.Used), then in claim order. A key with many queued
// tasks therefore takes one start per round like a key with few, whatever
// resources they need.
type LimitedClaim struct {
	Scan  int        // candidates per walk; 0 means ScanOf's
	Kinds []KindRoom // kinds with a room of their own; the others are unlimited
	Keys  []KeyRoom  // keys with a room or use of their own
	// BusyAt is the use from which a key is busy (0 means 1).
	BusyAt int
	// Free is what the node has free of each resource; a task needing a
	// resource not named here is not taken.
	Free Resources
	// Capacity is what the node has in all, when not nil: a candidate
	// needing more of a resource than that can never start here, and is
	// left out before anything is counted (its key's and kind's ranks,
	// the running sums), so that it holds back no candidate after it. (One that could start once enough is free keeps its
	// place: the candidates after it wait, rather than take what it
	// waits for one at a time.)
	Capacity Resources
}

// KindRoom is how many more tasks of Kind the claim may take (Room, -1
// unlimited) and how many of one of its keys not named in Keys (KeyRoom,
// -1 unlimited).
type KindRoom struct {
	Kind    string
	Room    int
	KeyRoom int
}

// KeyRoom is the room of one limit key of one kind, and how many of its
// tasks the node runs (for the fairness order).
type KeyRoom struct {
	Kind string
	Key  string
	Room int // -1 unlimited, 0 closed
	Used int
	// Turn is how many rounds the key is ahead in the holder's round
	// robin: the starts it had in the rounds the keys not named here have
	// not had yet. 0 is the current round.
	Turn int
}

// Busy reports whether a key with used tasks is busy.
func (lc LimitedClaim) Busy(used int) bool { return used >= max(1, lc.BusyAt) }

// ScanOf is the number of candidates a claim of limit looks at: Scan, or
// twice limit, at most 10,000, and at least 32 when a key's room can turn
// candidates down. Only rooms of kinds then can, and the candidates of a
// closed kind are left out of the walk: a claim for the one slot of a
// fleet-wide limit that an outcome write frees locked 32 rows to take one.
func (lc LimitedClaim) ScanOf(limit int) int {
	if lc.Scan > 0 {
		return lc.Scan
	}
	if lc.onlyKindRooms() {
		return min(2*max(limit, 1), 10_000)
	}
	return min(max(2*limit, 32), 10_000)
}

// onlyKindRooms reports whether no key and no resource can turn a
// candidate down: no key named with a room (a closed key's candidates are
// left out of the walk; the others named only order the claim), no kind
// with a room per key, no resource free (a task that needs one is then
// not taken at all).
func (lc LimitedClaim) onlyKindRooms() bool {
	if len(lc.Free) > 0 {
		return false
	}
	for _, k := range lc.Keys {
		if k.Room > 0 {
			return false
		}
	}
	for _, kr := range lc.Kinds {
		if kr.KeyRoom >= 0 {
			return false
		}
	}
	return true
}

// ActiveUse is what one active task holds, for a holder that rebuilds its
// counters from the running rows of its buckets.
type ActiveUse struct {
	ID        int64
	Kind      string
	LimitKey  string // effective: LimitKeyOf
	Resources Resources
	Bucket    int
	Owner     string
	Epoch     int64
	// ClaimSeq is the claim that took the task, for a write conditional
	// on it (a node releasing the tasks of a claim whose answer was lost).
	ClaimSeq int64
}

// ShareRequest asks for a holder's share of a fleet-wide kind limit.
type ShareRequest struct {
	Limit string // the limit's name
	Owner string // incarnation
	Node  string
	// Running is how many tasks of the kind the owner runs now; the
	// store reads its queued demand itself.
	Running int
	// MaxDemand caps the demand the store publishes for the owner (the
	// node's concurrency).
	MaxDemand int
	Buckets   []int // the owner's held buckets, where its queued demand is
	// Capacity is what the owner has of each resource in all: a queued
	// task that needs more of one than that can never start there, and is
	// no demand of the owner's. nil is none: only the tasks that need no
	// resource count.
	Capacity Resources
	TTL      time.Duration
}

// Share is a holder's grant of a fleet-wide limit: it may run up to Share
// tasks of the kind until its share row expires (ExpiresAt, database time).
type Share struct {
	Limit     string
	Kind      string
	N         int // the limit's concurrency
	Share     int
	Demand    int
	ExpiresAt time.Time
	// Found is false when the limit no longer exists: the kind is
	// unlimited again.
	Found bool
}

// ShareUse is one holder's row of a fleet-wide limit, for `worker limit
// list`.
type ShareUse struct {
	Limit     string
	Owner     string
	Node      string
	Share     int
	Demand    int
	ExpiresAt time.Time
	Alive     bool
}

// FairShare is the share owner me may aim for given every live holder's
// demand, by owner (me's included): each live holder gets an equal floor of
// n, and what holders with less demand than the floor leave idle is split
// among those with more (water filling). Where the holders at the level
// cannot split what is left evenly, the first of them by owner get one
// more: the fair shares then add up to n at most, and every holder, each
// deciding alone, counts the same ones. (Rounding up for all of them let
// the first takers reach n between them and left the last with nothing
// for as long as the others had work: 2, 2 and 0 of 4.) The store then
// grants at most what the others do not hold.
func FairShare(n int, demands map[string]int, me string) int {
	want, ok := demands[me]
	if n <= 0 || !ok {
		return 0
	}
	owners := slices.Collect(maps.Keys(demands))
	slices.SortFunc(owners, func(a, b string) int {
		return cmp.Or(cmp.Compare(demands[a], demands[b]), strings.Compare(a, b))
	})
	left := n
	for i, owner := range owners {
		even := left / (len(owners) - i)
		if demands[owner] <= even {
			left -= demands[owner]
			continue
		}
		// Everyone from here on wants more than an even split of what is
		// left: that split is the level, and the owner gets no more.
		level := slices.Sorted(slices.Values(owners[i:]))
		at := slices.Index(level, me)
		if at < 0 {
			return want // below the level: its whole demand
		}
		return even + boolInt(at < left%len(level))
	}
	return want
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// KeyUse is how many active tasks of one kind and limit key one node
// runs.
type KeyUse struct {
	Kind     string
	Node     string
	LimitKey string // effective: LimitKeyOf
	Active   int
}

// CompareKeyUse orders KeyUse rows by kind, node and limit key.
func CompareKeyUse(a, b KeyUse) int {
	return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Node, b.Node), cmp.Compare(a.LimitKey, b.LimitKey))
}

// HolderUse is what one node runs under one limit: its active tasks of the
// limit's kind, over how many limit keys, and how many of those keys are at
// a per-key concurrency limit (their queued tasks wait).
type HolderUse struct {
	Node        string
	Running     int
	Keys        int
	KeysAtLimit int
}

// UseByHolder sums rows (ListKeyUse, in its order) into each node's use of
// lim, by node.
func UseByHolder(lim Limit, rows []KeyUse) []HolderUse {
	var out []HolderUse
	for _, r := range rows {
		if r.Kind != lim.Kind {
			continue
		}
		if len(out) == 0 || out[len(out)-1].Node != r.Node {
			out = append(out, HolderUse{Node: r.Node})
		}
		h := &out[len(out)-1]
		h.Running += r.Active
		h.Keys++
		if lim.Per == PerKey && lim.Concurrency > 0 && r.Active >= lim.Concurrency {
			h.KeysAtLimit++
		}
	}
	return out
}

// GrantShare decides a share: the fair share, but never more than n minus
// what the others hold, each counted at the larger of its live share and
// the tasks of the kind it runs in the database (so that a holder whose
// share lapsed while its tasks still run is counted by its tasks).
func GrantShare(n, fair, others int) int {
	return max(0, min(fair, n-others))
}

// WaitReason is the latest reason why waiting tasks of one kind wait,
// written on their rows by the holder of their buckets (SetWaitReasons).
// It names the tasks of one limit key, or with AllKeys every task of the
// kind (its fleet-wide share is in use), or with AllKeys and ByResources
// the tasks of the kind that need more of some resource than Free holds (a
// name Free leaves out counts as none free). A row named by several gets
// its key's reason first, then the resources', then its kind's, and of
// reasons of one sort the first given.
type WaitReason struct {
	Kind        string
	LimitKey    string // ignored with AllKeys
	AllKeys     bool
	ByResources bool // only with AllKeys
	Free        Resources
	Reason      string // "" clears it
}

// WaitReasonFor returns the reason, of those given, that a waiting task of
// the kind, limit key and resources given gets, and false when none names
// it.
func WaitReasonFor(reasons []WaitReason, kind, limitKey string, needs Resources) (string, bool) {
	best, rank := "", 0
	for _, r := range reasons {
		if r.Kind != kind {
			continue
		}
		var k int
		switch {
		case !r.AllKeys && r.LimitKey == limitKey:
			k = 3
		case r.AllKeys && r.ByResources && !r.Free.Covers(needs):
			k = 2
		case r.AllKeys && !r.ByResources:
			k = 1
		}
		if k > rank {
			best, rank = r.Reason, k
		}
	}
	return best, rank > 0
}

// MaxWaitReasonRows bounds the task rows one SetWaitReasons call writes.
const MaxWaitReasonRows = 10_000

// LimitView answers a LimitedClaim's questions about one candidate; the
// stores that decide a limited claim in Go (memory, SQLite) share it, so
// that they take the same tasks from the same candidates.
type LimitView struct {
	lc    LimitedClaim
	kinds map[string]KindRoom
	keys  map[kindKey]KeyRoom
}

type kindKey struct{ kind, key string }

// View indexes lc's rooms.
func (lc LimitedClaim) View() *LimitView {
	v := &LimitView{lc: lc, kinds: make(map[string]KindRoom, len(lc.Kinds)), keys: make(map[kindKey]KeyRoom, len(lc.Keys))}
	for _, kr := range lc.Kinds {
		v.kinds[kr.Kind] = kr
	}
	for _, r := range lc.Keys {
		v.keys[kindKey{r.Kind, r.Key}] = r
	}
	return v
}

// Room is the room (-1 unlimited) and use of one limit key of a kind.
func (v *LimitView) Room(kind, key string) (room, used int) {
	if r, ok := v.keys[kindKey{kind, key}]; ok {
		return r.Room, r.Used
	}
	if kr, ok := v.kinds[kind]; ok {
		return kr.KeyRoom, 0
	}
	return -1, 0
}

// KindClosed reports whether no task of kind may be taken.
func (v *LimitView) KindClosed(kind string) bool {
	kr, ok := v.kinds[kind]
	return ok && kr.Room == 0
}

// Closed reports whether t's kind or limit key has no room: it is no
// candidate at all.
func (v *LimitView) Closed(t *task.Task) bool {
	if v.KindClosed(t.Kind) {
		return true
	}
	room, _ := v.Room(t.Kind, LimitKeyOf(t.Key, t.LimitKey))
	return room == 0
}

// Fresh reports whether t's limit key is not busy: the candidates of keys
// that are not busy are looked at even behind a long backlog of busy ones.
func (v *LimitView) Fresh(t *task.Task) bool {
	_, used := v.Room(t.Kind, LimitKeyOf(t.Key, t.LimitKey))
	return !v.lc.Busy(used)
}

// SecondWalk returns the filter of a claim's second walk given its first
// candidates: a task is in it when its key is fresh and none of the first
// candidates is of its key. The first candidates are the head of the claim
// order, so the second walk reaches the keys queued behind them.
func (v *LimitView) SecondWalk(first []*task.Task) func(*task.Task) bool {
	seen := make(map[kindKey]bool, len(first))
	for _, t := range first {
		seen[kindKey{t.Kind, LimitKeyOf(t.Key, t.LimitKey)}] = true
	}
	return func(t *task.Task) bool {
		return !seen[kindKey{t.Kind, LimitKeyOf(t.Key, t.LimitKey)}] && v.Fresh(t)
	}
}

// Named sorts the keys lc names, each as kind + "\x1f" + key, for a store
// that leaves them out in its query: those closed, those busy, and those
// open. shut lists the kinds whose keys not named have no room (KindRoom
// .KeyRoom 0): of those kinds only the open named keys are candidates.
func (v *LimitView) Named() (closed, busy, open, shut []string) {
	closed, busy, open, shut = []string{}, []string{}, []string{}, []string{}
	for _, r := range v.lc.Keys {
		pair := r.Kind + "\x1f" + r.Key
		if v.lc.Busy(r.Used) {
			busy = append(busy, pair)
		}
		if r.Room == 0 {
			closed = append(closed, pair)
		} else {
			open = append(open, pair)
		}
	}
	for _, kr := range v.lc.Kinds {
		if kr.KeyRoom == 0 {
			shut = append(shut, kr.Kind)
		}
	}
	return closed, busy, open, shut
}

// turn is the key's turn in the round robin (KeyRoom.Turn).
func (v *LimitView) turn(kind, key string) int {
	if r, ok := v.keys[kindKey{kind, key}]; ok {
		return r.Turn
	}
	return 0
}

// Pick decides which candidates (in claim order, none closed) a claim of
// at most limit takes, as LimitedClaim describes, and returns their
// indexes in claim order.
func (v *LimitView) Pick(cands []*task.Task, limit int) []int {
	type pick struct {
		round int // the key's turn + the rank within its key
		used  int
		pos   int
		room  bool // within its key's and its kind's rooms
	}
	var order []pick
	keyRank := map[kindKey]int{}
	kindRank := map[string]int{}
	for i, t := range cands {
		if v.lc.Capacity != nil && !v.lc.Capacity.Covers(t.Resources) {
			continue // it never starts here, and holds back no other
		}
		k := kindKey{t.Kind, LimitKeyOf(t.Key, t.LimitKey)}
		rk, rkind := keyRank[k], kindRank[t.Kind]
		keyRank[k]++
		kindRank[t.Kind]++
		room, used := v.Room(k.kind, k.key)
		kr, limited := v.kinds[t.Kind]
		within := (room < 0 || rk < room) && (!limited || kr.Room < 0 || rkind < kr.Room)
		order = append(order, pick{v.turn(k.kind, k.key) + rk, used, i, within})
	}
	slices.SortStableFunc(order, func(a, b pick) int {
		return cmp.Or(cmp.Compare(a.round, b.round), cmp.Compare(a.used, b.used), cmp.Compare(a.pos, b.pos))
	})
	// Resources are summed in that round-robin order, not in claim order:
	// summed in claim order, one key's older tasks took every gpu before
	// another key's turn came. A task that does not fit still counts, so
	// that one waiting for two gpus keeps its place in the round against
	// those after it that need one.
	sums := map[string]int64{}
	var out []int
	for _, p := range order {
		if len(out) >= limit {
			break
		}
		fits := true
		for name, need := range cands[p.pos].Resources {
			sums[name] += need
			if sums[name] > v.lc.Free[name] {
				fits = false
			}
		}
		if fits && p.room {
			out = append(out, p.pos)
		}
	}
	slices.Sort(out)
	return out
}
