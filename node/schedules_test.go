package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/schedule"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/memory"
	"github.com/flotilla-dev/flotilla/task"
)

// These tests hold DESIGN invariant 10 and the lease rules for schedules,
// with an injected clock: while one node holds a schedule's bucket a second
// one fires nothing; a holder whose lease went elsewhere stops firing at
// once; a failed renewal does not stop the firing, and a passed local
// deadline does.

// firingStore counts what one node's schedule firings did.
type firingStore struct {
	store.Store
	mu    sync.Mutex
	calls int // FireSchedules calls
	fired int // tasks created
}

func (f *firingStore) FireSchedules(ctx context.Context, owner string, reqs []store.FireRequest) ([]store.FireResult, error) {
	out, err := f.Store.FireSchedules(ctx, owner, reqs)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	for _, r := range out {
		if r.Fired {
			f.fired++
		}
	}
	return out, err
}

func (f *firingStore) counts() (calls, fired int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls, f.fired
}

// startOn starts a node that runs noop tasks on s.
func (b *testBundle) startOn(t *testing.T, s store.Store, cfg Config) *Node {
	t.Helper()
	n := newNodeOn(t, s, cfg, map[string]Handler{"noop": func(context.Context, *task.Task) error { return nil }})
	if err := n.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	return n
}

// everySecond is the schedule of these tests.
var everySecond = schedule.Definition{Name: "heartbeat", Every: time.Second, Kind: "noop"}

func (b *testBundle) scheduleConfig(t *testing.T, id string) Config {
	cfg := b.config(t, id)
	cfg.BucketLeaseTTL = 15 * time.Second
	cfg.Schedules = []schedule.Definition{everySecond}
	// These tests move the schedule's bucket by a lapse or a kill; a
	// balancing second node would be handed half the buckets, the
	// schedule's perhaps among them, whenever its loops first ran.
	cfg.NoBalance = true
	return cfg
}

// schedulePassesAfter waits until each node has finished two more schedule
// passes than it had when called, so that one began after the call.
func schedulePassesAfter(t *testing.T, nodes ...*Node) {
	t.Helper()
	for _, n := range nodes {
		target := n.schedulePasses.Load() + 2
		eventually(t, "two more schedule passes of "+n.ID(), func() bool {
			n.scheduleLoop.poke()
			return n.schedulePasses.Load() >= target
		})
	}
}

// tick moves the clock one second and lets every node look at its schedules.
func (b *testBundle) tick(t *testing.T, nodes ...*Node) {
	t.Helper()
	b.manual.Advance(time.Second)
	schedulePassesAfter(t, nodes...)
}

// ticksFired returns the scheduled_for of every task the schedule fired,
// failing the test if one tick has two tasks.
func (b *testBundle) ticksFired(t *testing.T, name string) []time.Time {
	t.Helper()
	tasks, err := b.store.ListTasks(b.ctx, store.TaskFilter{Schedule: name, Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[time.Time]bool{}
	var out []time.Time
	for _, tk := range tasks {
		if seen[tk.ScheduledFor] {
			t.Fatalf("tick %v fired twice", tk.ScheduledFor)
		}
		seen[tk.ScheduledFor] = true
		out = append(out, tk.ScheduledFor)
	}
	return out
}

func TestASecondNodeDoesNotFireWhileTheFirstHolds(t *testing.T) {
	b := setup(t, withManualClock())
	first := &firingStore{Store: b.store.Handle()}
	second := &firingStore{Store: b.store.Handle()}
	// Neither balances, so that the second stands by for every bucket.
	cfgA, cfgB := b.scheduleConfig(t, "a"), b.scheduleConfig(t, "b")
	cfgA.NoBalance, cfgB.NoBalance = true, true
	a := b.startOn(t, first, cfgA)
	standby := b.startOn(t, second, cfgB)
	if len(standby.Held()) != 0 {
		t.Fatalf("the second node holds %v while the first lives", standby.Held())
	}
	for range 10 {
		b.tick(t, a, standby)
	}
	if got := b.ticksFired(t, everySecond.Name); len(got) != 10 {
		t.Errorf("%d ticks fired in 10 seconds, want 10: %v", len(got), got)
	}
	if calls, fired := second.counts(); calls != 0 || fired != 0 {
		t.Errorf("the standby tried to fire %d times (%d tasks)", calls, fired)
	}
	if _, fired := first.counts(); fired != 10 {
		t.Errorf("the holder fired %d tasks, want 10", fired)
	}
}

func TestAHolderWhoseLeaseWentElsewhereStopsFiringAtOnce(t *testing.T) {
	b := setup(t, withManualClock())
	first := &firingStore{Store: b.store.Handle()}
	second := &firingStore{Store: b.store.Handle()}
	a := b.startOn(t, first, b.scheduleConfig(t, "a"))
	standby := b.startOn(t, second, b.scheduleConfig(t, "b"))
	b.tick(t, a, standby)
	b.tick(t, a, standby)

	// The lease of the schedule's bucket lapses in the database (a pause,
	// say) and the standby takes it before the holder renews.
	sb := b.policy.Of(everySecond.Name)
	if err := b.store.ExpireBucketLease(sb); err != nil {
		t.Fatal(err)
	}
	standby.leaseLoop.poke()
	eventually(t, "the standby takes the bucket", func() bool {
		_, ok := standby.keeper.Holds(sb)
		return ok
	})
	_, firedBefore := first.counts()
	for range 5 {
		b.tick(t, a, standby)
	}
	if _, fired := first.counts(); fired != firedBefore {
		t.Errorf("the old holder fired %d tasks after its lease went elsewhere", fired-firedBefore)
	}
	if _, fired := second.counts(); fired != 5 {
		t.Errorf("the new holder fired %d tasks in 5 seconds, want 5", fired)
	}
	if got := b.ticksFired(t, everySecond.Name); len(got) != 7 {
		t.Errorf("%d ticks fired in 7 seconds, want 7: %v", len(got), got)
	}
}

func TestAFailedRenewalDoesNotStopFiringAndAPassedDeadlineDoes(t *testing.T) {
	b := setup(t, withManualClock())
	down := &unreachable{Store: b.store.Handle()}
	counted := &firingStore{Store: down}
	cfg := b.scheduleConfig(t, "a")
	a := b.startOn(t, counted, cfg)
	b.tick(t, a)

	down.setDown(true)
	// The last renewal the database answered was sent at start; the local
	// deadline is TTL minus the margin after it. Up to then the holder
	// fires every tick although no renewal succeeds.
	deadline := cfg.BucketLeaseTTL - deadlineMargin(cfg.BucketLeaseTTL)
	ticks := int(deadline/time.Second) - 2
	for range ticks {
		b.tick(t, a)
	}
	if _, fired := counted.counts(); fired != ticks+1 {
		t.Fatalf("fired %d tasks while renewals failed, want %d", fired, ticks+1)
	}

	// Past the deadline it fires nothing, not even an attempt the database
	// would still have accepted: the lease there has the margin left.
	b.advanceUntil(t, "the local deadline passes", 100*time.Millisecond, func() bool { return len(a.Held()) == 0 })
	callsAtDeadline, _ := counted.counts()
	for range 3 {
		b.manual.Advance(500 * time.Millisecond)
		schedulePassesAfter(t, a)
	}
	if calls, _ := counted.counts(); calls != callsAtDeadline {
		t.Errorf("%d firing attempts after the local deadline", calls-callsAtDeadline)
	}
}

func TestMissedTicksFollowTheCatchUpPolicy(t *testing.T) {
	for _, tc := range []struct {
		policy   string
		wantLate int // tasks fired for the missed stretch
	}{
		{schedule.Skip, 0},
		{schedule.Latest, 1},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			b := setup(t, withManualClock())
			def := schedule.Definition{Name: "report", Every: time.Minute, Kind: "noop", CatchUp: tc.policy}
			cfg := b.config(t, "a")
			cfg.Schedules = []schedule.Definition{def}
			// Declare the schedule, then stop: nobody serves its bucket
			// for ten and a half minutes, so the latest missed tick is
			// thirty seconds old, well past the misfire threshold.
			first := b.startOn(t, b.store.Handle(), cfg)
			ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
			defer cancel()
			if err := first.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			start := b.manual.Now()
			b.manual.Advance(10*time.Minute + 30*time.Second)

			cfg.NodeID = "b"
			second := b.startOn(t, b.store.Handle(), cfg)
			schedulePassesAfter(t, second)
			got := b.ticksFired(t, def.Name)
			if len(got) != tc.wantLate {
				t.Fatalf("%d tasks for ten missed ticks, want %d: %v", len(got), tc.wantLate, got)
			}
			if tc.wantLate == 1 && !got[0].Equal(start.Add(10*time.Minute)) {
				t.Errorf("caught up tick %v, want the latest missed one, %v", got[0], start.Add(10*time.Minute))
			}
			sc, err := b.store.GetSchedule(b.ctx, def.Name)
			if err != nil {
				t.Fatal(err)
			}
			if want := start.Add(11 * time.Minute); !sc.NextFireAt.Equal(want) {
				t.Errorf("next fire time %v, want the first tick after now, %v", sc.NextFireAt, want)
			}
			// From here on, one task per tick again.
			for i := range 3 {
				b.manual.Advance(start.Add(time.Duration(11+i) * time.Minute).Sub(b.manual.Now()))
				schedulePassesAfter(t, second)
			}
			if got := len(b.ticksFired(t, def.Name)); got != tc.wantLate+3 {
				t.Errorf("%d tasks after 3 more ticks, want %d", got, tc.wantLate+3)
			}
		})
	}
}

func TestDeclaredSchedulesKeepAnOperatorsPause(t *testing.T) {
	b := setup(t, withManualClock())
	cfg := b.scheduleConfig(t, "a")
	first := b.startOn(t, b.store.Handle(), cfg)
	if _, err := b.store.SetScheduleEnabled(b.ctx, everySecond.Name, false, time.Time{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	if err := first.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	cfg.NodeID = "b"
	second := b.startOn(t, b.store.Handle(), cfg)
	for range 3 {
		b.tick(t, second)
	}
	sc, err := b.store.GetSchedule(b.ctx, everySecond.Name)
	if err != nil || sc.Enabled {
		t.Fatalf("after a restart the paused schedule is %+v (%v), want still paused", sc, err)
	}
	if got := b.ticksFired(t, everySecond.Name); len(got) != 0 {
		t.Errorf("a paused schedule fired %d tasks", len(got))
	}
}

func TestABadDeclaredScheduleIsRefusedBeforeStart(t *testing.T) {
	b := setup(t)
	cfg := b.config(t, "a")
	cfg.Schedules = []schedule.Definition{{Name: "bad", Cron: "61 * * * *", Kind: "noop"}}
	_, err := New(b.store.Handle(), cfg)
	if !errors.Is(err, schedule.ErrInvalidSpec) {
		t.Fatalf("New with an invalid cron expression: %v, want schedule.ErrInvalidSpec", err)
	}
	cfg.Schedules = []schedule.Definition{everySecond, everySecond}
	if _, err := New(b.store.Handle(), cfg); err == nil {
		t.Fatal("New with a schedule declared twice: no error")
	}
}

// slowFirings is a store that runs out of time on firings larger than limit,
// as a loaded database does on large transactions.
type slowFirings struct {
	store.Store
	limit int
}

func (s *slowFirings) FireSchedules(ctx context.Context, owner string, reqs []store.FireRequest) ([]store.FireResult, error) {
	if len(reqs) > s.limit {
		return nil, fmt.Errorf("fire schedules: %w", context.DeadlineExceeded)
	}
	return s.Store.FireSchedules(ctx, owner, reqs)
}

func TestFiringRoundsShrinkWhenTheDatabaseIsSlow(t *testing.T) {
	b := setup(t, withManualClock())
	cfg := b.config(t, "a")
	const count = 300
	for i := range count {
		cfg.Schedules = append(cfg.Schedules, schedule.Definition{Name: fmt.Sprintf("s-%03d", i), Every: time.Minute, Kind: "noop"})
	}
	a := b.startOn(t, &slowFirings{Store: b.store.Handle(), limit: 40}, cfg)
	b.manual.Advance(time.Minute)
	eventually(t, "every schedule fired once", func() bool {
		a.scheduleLoop.poke()
		tasks, err := b.store.ListTasks(b.ctx, store.TaskFilter{Limit: 1000})
		return err == nil && len(tasks) == count
	})
}

// pauseBeforeUpsert is a store on which an operator pauses each schedule
// just before a node's declaration writes it: after anything the node
// could have read of it.
type pauseBeforeUpsert struct {
	store.Store
}

func (p *pauseBeforeUpsert) UpsertSchedule(ctx context.Context, sc store.Schedule, mode store.UpsertMode) (store.Schedule, error) {
	if _, err := p.Store.SetScheduleEnabled(ctx, sc.Name, false, time.Time{}); err != nil {
		return store.Schedule{}, err
	}
	return p.Store.UpsertSchedule(ctx, sc, mode)
}

func TestADeclarationKeepsAPauseCommittedWhileItRuns(t *testing.T) {
	b := setup(t, withManualClock())
	cfg := b.scheduleConfig(t, "a")
	first := b.startOn(t, b.store.Handle(), cfg) // creates the schedule, running
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	if err := first.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if sc, err := b.store.GetSchedule(b.ctx, everySecond.Name); err != nil || !sc.Enabled {
		t.Fatalf("declared schedule %+v (%v), want running", sc, err)
	}
	cfg.NodeID = "b"
	second := b.startOn(t, &pauseBeforeUpsert{Store: b.store.Handle()}, cfg)
	for range 3 {
		b.tick(t, second)
	}
	sc, err := b.store.GetSchedule(b.ctx, everySecond.Name)
	if err != nil || sc.Enabled {
		t.Fatalf("a pause committed during the declaration left %+v (%v), want paused", sc, err)
	}
	if got := b.ticksFired(t, everySecond.Name); len(got) != 0 {
		t.Errorf("a paused schedule fired %d tasks", len(got))
	}
}

// dueCounter counts DueSchedules calls: the schedule loop's looks. It
// keeps the memory store's notifications.
type dueCounter struct {
	*memory.Store
	looks atomic.Int64
}

func (d *dueCounter) DueSchedules(ctx context.Context, buckets bucket.Set, limit int) ([]store.Schedule, error) {
	d.looks.Add(1)
	return d.Store.DueSchedules(ctx, buckets, limit)
}

// TestScheduleLoopSleepsUntilTheNextTick: a node whose buckets have no
// schedule sleeps as long as a missed notification allows; a schedule
// created elsewhere wakes it through its notification, and it then sleeps
// until the schedule's tick, and fires it.
func TestScheduleLoopSleepsUntilTheNextTick(t *testing.T) {
	b := setup(t, withManualClock())
	h := b.store.Handle()
	t.Cleanup(h.Close)
	counter := &dueCounter{Store: h}
	cfg := b.config(t, "a")
	cfg.BucketLeaseTTL = 15 * time.Second
	n := b.startOn(t, counter, cfg)
	eventually(t, "a look at the held buckets, and notifications", func() bool {
		return counter.looks.Load() >= 1 && n.listening.Load()
	})
	idle := schedule.DefaultMisfire / 2
	if got := n.scheduleWait(b.ctx); got != idle {
		t.Errorf("with no schedule the loop sleeps %v, want %v (half the misfire)", got, idle)
	}
	// Without notifications it would not be woken: it looks as often as
	// before.
	n.listening.Store(false)
	if got := n.scheduleWait(b.ctx); got != DefaultSchedulePoll {
		t.Errorf("with no notifications the loop sleeps %v, want SchedulePoll %v", got, DefaultSchedulePoll)
	}
	n.listening.Store(true)
	looks := counter.looks.Load()
	now, err := b.store.Now(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	sc, err := everySecond.Resolve(b.policy, now)
	if err != nil {
		t.Fatal(err)
	}
	sc.NextFireAt = now.Add(2 * time.Second)
	if _, err := b.store.UpsertSchedule(b.ctx, sc, store.UpsertCreate); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the notification's look", func() bool { return counter.looks.Load() > looks })
	if got := n.scheduleWait(b.ctx); got != 2*time.Second {
		t.Errorf("with a tick due in 2s the loop sleeps %v", got)
	}
	b.advanceUntil(t, "the tick fires", DefaultSchedulePoll, func() bool { return len(b.ticksFired(t, everySecond.Name)) == 1 })
}
