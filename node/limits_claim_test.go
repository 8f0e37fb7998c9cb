package node

import (
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// newTestLimiter is a limiter whose limits are lims, without a store: hold
// and claim read only its memory.
func newTestLimiter(lims ...store.Limit) *limiter {
	l := newLimiter(nil, "o", "n1", nil, 10, time.Minute, time.Now, zap.NewNop())
	for _, lim := range lims {
		l.limits[lim.Kind] = append(l.limits[lim.Kind], lim)
	}
	return l
}

// namedKeys indexes a claim's keys by limit key and fails on a key named
// twice: the stores take the first or the last of two entries, so both
// must never be sent.
func namedKeys(t *testing.T, lc store.LimitedClaim) map[string]store.KeyRoom {
	t.Helper()
	out := map[string]store.KeyRoom{}
	seen := map[kindKey]bool{}
	for _, k := range lc.Keys {
		if seen[kindKey{k.Kind, k.Key}] {
			t.Fatalf("key %q of kind %s is named twice in the claim", k.Key, k.Kind)
		}
		seen[kindKey{k.Kind, k.Key}] = true
		if k.Key == "" {
			continue // the keyless tasks of each kind (TestLimitTasksWithoutAKeyAreUnderNoPerKeyLimit)
		}
		out[k.Key] = k
	}
	return out
}

// TestLimitClaimNamesEachKeyOnce: a key that runs, is ahead in the round
// robin or has the state of two rate limits, or any of these, is named
// once, with its use, its turn and the room its own state leaves; a key
// only ahead has the room of a key not seen. (b's one start leaves it 1 of its burst of 2,
// where a key not seen would have 2.)
func TestLimitClaimNamesEachKeyOnce(t *testing.T) {
	l := newTestLimiter(
		store.Limit{Name: "one", Kind: "job", Per: store.PerKey, Concurrency: 2},
		store.Limit{Name: "fast", Kind: "job", Per: store.PerKey, Rate: 2, Period: time.Second, Burst: 2},
		store.Limit{Name: "slow", Kind: "job", Per: store.PerKey, Rate: 2, Period: time.Second, Burst: 2},
		store.Limit{Name: "cap", Kind: "plain", Per: store.PerKey, Concurrency: 3},
	)
	l.acquired[0] = time.Now().Add(-time.Hour) // a key not seen has its whole burst
	// d and e start in a round that then ends: they are no longer ahead,
	// d keeps only its rate state, e runs.
	l.hold([]*task.Task{{ID: 4, Kind: "job", Key: "d"}, {ID: 5, Kind: "job", Key: "e"}})
	l.release(task.Ref{ID: 4})
	l.advance(l.round + 1)
	l.hold([]*task.Task{{ID: 1, Kind: "job", Key: "a"}, {ID: 2, Kind: "job", Key: "b"}, {ID: 3, Kind: "plain", Key: "c"}})
	l.release(task.Ref{ID: 2})
	l.release(task.Ref{ID: 3})
	_, lc := l.claim(nil, nil)
	keys := namedKeys(t, lc)
	if a := keys["a"]; a.Used != 1 || a.Turn != 1 || a.Room != 1 {
		t.Errorf("key a (running, ahead, rate-limited) is named %+v; want used 1, turn 1, room 1", a)
	}
	if b := keys["b"]; b.Used != 0 || b.Turn != 1 || b.Room != 1 {
		t.Errorf("key b (ahead, rate-limited) is named %+v; want used 0, turn 1, room 1", b)
	}
	if c := keys["c"]; c.Used != 0 || c.Turn != 1 || c.Room != 3 {
		t.Errorf("key c (only ahead) is named %+v; want used 0, turn 1, room 3 (a key not seen)", c)
	}
	if d := keys["d"]; d.Used != 0 || d.Turn != 0 || d.Room != 1 {
		t.Errorf("key d (only rate state) is named %+v; want used 0, turn 0, room 1", d)
	}
	if e := keys["e"]; e.Used != 1 || e.Turn != 0 || e.Room != 1 {
		t.Errorf("key e (running, rate state) is named %+v; want used 1, turn 0, room 1", e)
	}
	if len(keys) != 5 {
		t.Errorf("the claim names %d keys; want a to e", len(keys))
	}
}

// TestLimitRoundEndsOnceMaxKeysAreAhead: with more keys started in a round
// than maxKeysAhead, the round ends, so that a claim never names more keys
// ahead than that, and the key started last is still ahead of the others.
func TestLimitRoundEndsOnceMaxKeysAreAhead(t *testing.T) {
	l := newTestLimiter(store.Limit{Name: "one", Kind: "job", Per: store.PerKey, Concurrency: 1})
	last := ""
	for i := range maxKeysAhead + 10 {
		last = fmt.Sprint("k", i)
		l.hold([]*task.Task{{ID: int64(i + 1), Kind: "job", Key: last}})
		l.release(task.Ref{ID: int64(i + 1)})
	}
	_, lc := l.claim(nil, nil)
	keys := namedKeys(t, lc)
	if len(keys) > maxKeysAhead {
		t.Errorf("the claim names %d keys ahead; want at most %d", len(keys), maxKeysAhead)
	}
	if k, ok := keys[last]; !ok || k.Turn != 1 {
		t.Errorf("the key started last is named %+v (named: %v); want turn 1", k, ok)
	}
	if k, ok := keys["k0"]; ok {
		t.Errorf("the key started first is still ahead after %d others: %+v", maxKeysAhead+9, k)
	}
}

// TestLimitReleaseLeavesALaterAttemptOfTheTask: a task whose attempt ended
// and was claimed again in the same transaction (a retry due at once,
// taken by flushAndClaim), or whose earlier attempt was given up while its
// handler still runs, holds a slot for each attempt: the release of one
// frees its own, never the other's, and a second release frees nothing.
func TestLimitReleaseLeavesALaterAttemptOfTheTask(t *testing.T) {
	l := newTestLimiter(store.Limit{Name: "one", Kind: "job", Per: store.PerKey, Concurrency: 1})
	l.hold([]*task.Task{{ID: 1, Kind: "job", Key: "a", ClaimSeq: 1}})
	l.hold([]*task.Task{{ID: 1, Kind: "job", Key: "a", ClaimSeq: 2}})
	if got := l.running[kindKey{"job", "a"}]; got != 2 {
		t.Fatalf("key a counts %d running after its task's second attempt was held; want 2 until the first is released", got)
	}
	l.release(task.Ref{ID: 1, ClaimSeq: 1})
	if got := l.running[kindKey{"job", "a"}]; got != 1 {
		t.Fatalf("key a counts %d running once the first attempt was released, while the second runs; want 1", got)
	}
	l.release(task.Ref{ID: 1, ClaimSeq: 1})
	if got := l.running[kindKey{"job", "a"}]; got != 1 {
		t.Fatalf("key a counts %d running after the first attempt was released twice; want 1", got)
	}
	l.release(task.Ref{ID: 1, ClaimSeq: 2})
	if got := l.running[kindKey{"job", "a"}]; got != 0 {
		t.Fatalf("key a counts %d running once both attempts were released; want 0", got)
	}
}

// TestLimitClaimCountsEndingAttemptsAsReleased: a claim made in the
// transaction that first writes some attempts' outcomes sees their slots
// free, and the limiter still counts them until they are settled.
func TestLimitClaimCountsEndingAttemptsAsReleased(t *testing.T) {
	l := newTestLimiter(store.Limit{Name: "one", Kind: "job", Per: store.PerKey, Concurrency: 1})
	l.hold([]*task.Task{{ID: 7, Kind: "job", Key: "a", ClaimSeq: 1}})
	_, lc := l.claim(nil, nil)
	if a := namedKeys(t, lc)["a"]; a.Room != 0 {
		t.Fatalf("key a, running its one, has room %d; want 0", a.Room)
	}
	_, lc = l.claim(nil, []task.Ref{{ID: 7, ClaimSeq: 1}})
	if a, named := namedKeys(t, lc)["a"]; named && a.Room != 1 {
		t.Fatalf("key a, whose one is ending in the claim's transaction, has room %d; want 1", a.Room)
	}
	if got := l.running[kindKey{"job", "a"}]; got != 1 {
		t.Fatalf("key a counts %d running after the claim was built; want 1 until its attempt settles", got)
	}
}

// TestLimitRoomTheClaimCannotFillIsNoRoom: a kind's room that the claim
// asks for no more than binds nothing, and goes as no room, so that the
// store may skip its ranking; a room the claim could fill stays.
func TestLimitRoomTheClaimCannotFillIsNoRoom(t *testing.T) {
	l := newTestLimiter(store.Limit{Name: "fleet", Kind: "job", Per: store.PerFleet, Concurrency: 4})
	l.shares["fleet"] = shareState{share: 3, deadline: time.Now().Add(time.Hour)}
	for _, c := range []struct {
		kinds     []string
		free      int
		wantLimit int
		wantRoom  int
	}{
		{[]string{"job"}, 1, 1, -1},
		{[]string{"job"}, 5, 3, -1}, // the claim is cut to the room, which it then cannot pass
		{[]string{"job", "other"}, 2, 2, -1},
		{[]string{"job", "other"}, 3, 3, -1},
		{[]string{"job", "other"}, 5, 5, 3}, // five of both kinds may be more than three of job
	} {
		n := &Node{limits: l, kinds: c.kinds}
		req, lc := n.limitedRequest(store.ClaimRequest{Limit: c.free}, nil, nil)
		room := 0
		for _, kr := range lc.Kinds {
			if kr.Kind == "job" {
				room = kr.Room
			}
		}
		if req.Limit != c.wantLimit || room != c.wantRoom {
			t.Errorf("kinds %v, %d free: claim of %d with job's room %d; want %d and %d",
				c.kinds, c.free, req.Limit, room, c.wantLimit, c.wantRoom)
		}
	}
}

// TestLimitRateCountsWithoutOverflowOrRounding: a rate limit stored before
// the stores refused what a holder cannot count still counts right: a
// burst whose refill overflowed a duration (1 a day, burst 200,000) closed
// its keys for good, and must let a key start once a day has refilled a
// token; an interval rounded down (600,000 per 1ms, 1ns each) allowed more
// starts than asked, and must never pass rate + burst in a period.
func TestLimitRateCountsWithoutOverflowOrRounding(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	t.Run("overflow", func(t *testing.T) {
		l := newTestLimiter(store.Limit{Name: "daily", Kind: "job", Per: store.PerKey, Rate: 1, Period: 24 * time.Hour, Burst: 200_000})
		l.acquired[0] = t0
		now := t0.Add(24*time.Hour + time.Second)
		l.clock = func() time.Time { return now }
		_, lc := l.claim(nil, nil)
		if len(lc.Kinds) != 1 || lc.Kinds[0].KeyRoom != 1 {
			t.Fatalf("a day after the bucket was taken, a key of 1 a day has rooms %+v; want KeyRoom 1", lc.Kinds)
		}
	})
	t.Run("rounding", func(t *testing.T) {
		lim := store.Limit{Name: "fast", Kind: "job", Per: store.PerKey, Rate: 600_000, Period: time.Millisecond, Burst: 1000}
		// What hold does for each start: tat = max(tat, now) + interval.
		tat, started := t0, 0
		for now := t0; now.Before(t0.Add(lim.Period)); now = now.Add(time.Microsecond) {
			n := tokens(lim, tat, now)
			started += n
			tat = maxTime(tat, now).Add(time.Duration(n) * interval(lim))
		}
		if most := lim.Rate + lim.EffectiveBurst(); started > most {
			t.Fatalf("%v allowed %d starts in one period; want at most %d", lim, started, most)
		}
	})
}

// TestLimitRetakingABucketStartsItsKeysEmpty: a node that gives a bucket
// up and takes it back starts its rate-limited keys empty at the new
// acquisition, like any new holder: the starts of the holder between and
// its own then stay within rate + burst. (Its old state gave a key that
// spent its burst most of the burst again.)
func TestLimitRetakingABucketStartsItsKeysEmpty(t *testing.T) {
	for _, c := range []struct {
		name string
		lose func(l *limiter)
	}{
		{"left then taken", func(l *limiter) { l.bucketsLeft([]int{5}) }},
		{"taken under a new epoch", func(*limiter) {}},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := newTestLimiter(store.Limit{Name: "r", Kind: "job", Per: store.PerKey, Rate: 10, Period: 10 * time.Second, Burst: 10})
			t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			now := t0
			l.clock = func() time.Time { return now }
			l.acquiredBuckets([]store.HeldBucket{{Bucket: 5, Epoch: 1}})
			now = t0.Add(10 * time.Second) // the burst has filled
			var burst []*task.Task
			for i := range 10 {
				burst = append(burst, &task.Task{ID: int64(i + 1), Kind: "job", Key: "a", Bucket: 5, ClaimSeq: 1})
			}
			l.hold(burst)
			for _, tk := range burst {
				l.release(tk.Ref())
			}
			now = t0.Add(19 * time.Second) // another holder had it between
			c.lose(l)
			l.acquiredBuckets([]store.HeldBucket{{Bucket: 5, Epoch: 3}})
			_, lc := l.claim(nil, nil)
			room := lc.Kinds[0].KeyRoom
			if a, named := namedKeys(t, lc)["a"]; named {
				room = a.Room
			}
			if room != 0 {
				t.Fatalf("key a has room %d at the retake of its bucket; want 0 (empty at the acquisition)", room)
			}
		})
	}
}

// TestLimitTasksWithoutAKeyAreUnderNoPerKeyLimit: tasks with neither a
// key nor a limit key, placed in random buckets, are under no per-key
// limit of their kind: the claim names the key "" with no room of its
// own, whatever of them runs or started, and no reason closes it.
func TestLimitTasksWithoutAKeyAreUnderNoPerKeyLimit(t *testing.T) {
	l := newTestLimiter(
		store.Limit{Name: "one", Kind: "job", Per: store.PerKey, Concurrency: 1},
		store.Limit{Name: "slow", Kind: "job", Per: store.PerKey, Rate: 1, Period: time.Hour},
	)
	l.acquired[0] = time.Now() // a key not seen has no token yet
	check := func(when string) {
		t.Helper()
		_, lc := l.claim(nil, nil)
		found := false
		for _, k := range lc.Keys {
			if k.Kind == "job" && k.Key == "" {
				found = true
				if k.Room != -1 {
					t.Errorf("%s: the keyless tasks of job are named with room %d; want -1 (no per-key limit)", when, k.Room)
				}
			}
		}
		if !found {
			t.Errorf("%s: the claim does not name the keyless tasks of job; they would get a key not seen's room %d",
				when, lc.Kinds[0].KeyRoom)
		}
	}
	check("nothing started")
	l.hold([]*task.Task{{ID: 1, Kind: "job", ClaimSeq: 1}, {ID: 2, Kind: "job", ClaimSeq: 1}})
	check("two running")
	if _, ok := l.tat[rateKey{"slow", ""}]; ok {
		t.Errorf("the keyless tasks took the rate state of a key")
	}
}
