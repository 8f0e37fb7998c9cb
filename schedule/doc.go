// Package schedule is the tick arithmetic of flotilla's schedules and their
// catch-up decisions. It does no I/O.
//
// A program declares its periodic tasks as Definitions in the node's
// configuration; whichever node holds a schedule's bucket fires it, once per
// tick across the fleet:
//
//	n, err := node.New(s, node.Config{AllBuckets: true, Schedules: []schedule.Definition{
//		{Name: "nightly-report", Cron: "0 3 * * *", Timezone: "Europe/Paris", Kind: Report{}.Kind()},
//		{Name: "refresh-cache", Every: 30 * time.Second, Kind: Refresh{}.Kind()},
//	}})
//
// It owns:
//
//   - parsing a schedule's expression in its time zone (Parse, ParseAnchored):
//     5-field cron, 6-field cron with seconds, descriptors such as "@hourly",
//     and "@every D" with D of at least one second;
//
//   - the ticks themselves (Spec.Next, Spec.First): "@every" ticks are
//     anchored, anchor + k×D (the Unix epoch by default, so "@every 1m" ticks
//     at whole minutes), and cron ticks are the expression's times in the
//     schedule's time zone, returned in UTC. Every wall-clock time that
//     exists and matches fires. Daylight saving time (any change of a zone's
//     offset) follows two rules: a matching time skipped by a jump forward
//     fires at the first instant after the jump (once, however many the jump
//     skipped), and a matching time repeated by a fall back fires once, at
//     its first occurrence. So a daily expression fires every day, also the
//     days whose midnight does not exist (Asia/Beirut, Africa/Cairo);
//
//   - the zone database: the package imports time/tzdata, so every program
//     that uses schedules knows every zone even on a host without zoneinfo
//     files;
//
//   - what to do with a schedule at a given moment (Decide): nothing, fire the
//     stored tick, or apply the catch-up policy (Skip or Latest) to ticks
//     missed by more than the misfire threshold;
//
//   - a schedule as declared (Definition), checked and routed to its bucket
//     by Definition.Resolve into the store's form.
//
// It does not own storage, leases or epochs. The holder of a schedule's
// bucket (package node) reads the due schedules, calls Decide for each, and
// applies the decisions with store.FireSchedules, which inserts the tasks
// and advances the stored next fire times by compare-and-set while the
// holder still holds the buckets. When nothing fires but Next differs from
// the stored time (ticks were skipped), the holder advances the stored time
// the same way. ScheduledFor is the stored next fire time except after
// missed ticks (Latest, or Skip firing the latest tick); the
// compare-and-set is always against the stored next fire time, which the
// caller passed to Decide as storedNext. A task's scheduled_for is therefore
// always a tick of the schedule, never a node's clock.
//
// The policies Skip and Latest have the same values as store.CatchUpSkip and
// store.CatchUpLatest.
package schedule
