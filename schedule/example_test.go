package schedule_test

import (
	"fmt"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/schedule"
)

func ExampleParse() {
	s, err := schedule.Parse("@every 90s", "")
	if err != nil {
		panic(err)
	}
	// Anchored at the Unix epoch: ticks fall on whole multiples of 90s.
	t := time.Date(2026, 1, 1, 0, 2, 0, 0, time.UTC)
	fmt.Println(s, s.Next(t).Format(time.TimeOnly))

	_, err = schedule.Parse("61 * * * *", "")
	fmt.Println(err)
	_, err = schedule.Parse("@every 500ms", "")
	fmt.Println(err)
	// Output:
	// @every 1m30s 00:03:00
	// invalid schedule "61 * * * *": end of range (61) above maximum (59): 61
	// invalid schedule "@every 500ms": @every 500ms is shorter than 1s
}

func ExampleSpec_Next() {
	s, err := schedule.Parse("0 9 * * 1-5", "Europe/Berlin")
	if err != nil {
		panic(err)
	}
	// Friday evening: the next tick is Monday 09:00 in Berlin, given in UTC.
	t := time.Date(2026, 7, 17, 18, 0, 0, 0, time.UTC)
	fmt.Println(s.Next(t))
	// Output:
	// 2026-07-20 07:00:00 +0000 UTC
}

func ExampleDecide() {
	s, err := schedule.Parse("*/5 * * * *", "")
	if err != nil {
		panic(err)
	}
	stored := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

	// Two seconds late: fired as on time.
	d := schedule.Decide(s, stored, stored.Add(2*time.Second), schedule.Skip, schedule.DefaultMisfire)
	fmt.Printf("fire=%v for=%s next=%s skipped=%d\n", d.Fire,
		d.ScheduledFor.Format(time.TimeOnly), d.Next.Format(time.TimeOnly), d.Skipped)

	// Nobody held the bucket for an hour: 12:00 to 13:00 were missed.
	now := stored.Add(62 * time.Minute)
	d = schedule.Decide(s, stored, now, schedule.Skip, schedule.DefaultMisfire)
	fmt.Printf("skip:   fire=%v next=%s skipped=%d\n", d.Fire, d.Next.Format(time.TimeOnly), d.Skipped)
	d = schedule.Decide(s, stored, now, schedule.Latest, schedule.DefaultMisfire)
	fmt.Printf("latest: fire=%v for=%s next=%s skipped=%d\n", d.Fire,
		d.ScheduledFor.Format(time.TimeOnly), d.Next.Format(time.TimeOnly), d.Skipped)
	// Output:
	// fire=true for=12:00:00 next=12:05:00 skipped=0
	// skip:   fire=false next=13:05:00 skipped=13
	// latest: fire=true for=13:00:00 next=13:05:00 skipped=12
}

// A schedule declared in code: a node started with it in
// node.Config.Schedules creates it, or updates its definition, and whichever
// node holds its bucket fires it. Resolve is the check both do.
func ExampleDefinition_Resolve() {
	policy, _ := bucket.NewPolicy(64)
	now := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	sc, err := schedule.Definition{
		Name:     "nightly-report",
		Cron:     "30 2 * * *",
		Timezone: "America/New_York",
		Kind:     "report",
		CatchUp:  schedule.Latest,
	}.Resolve(policy, now)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(sc.Spec, "in", sc.Timezone, "bucket", sc.Bucket, "first", sc.NextFireAt.Format(time.RFC3339))

	_, err = schedule.Definition{Name: "too-fast", Every: 100 * time.Millisecond, Kind: "noop"}.Resolve(policy, now)
	fmt.Println(err)
	// Output:
	// 30 2 * * * in America/New_York bucket 61 first 2030-01-02T07:30:00Z
	// schedule "too-fast": period 100ms is shorter than the minimum of 1s: invalid schedule definition
}
