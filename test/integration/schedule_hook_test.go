package integration

// Scenario 6 of issue 6: a schedule firing every second across each fault
// scenario, which must never fire two tasks for one tick, and may skip
// ticks (its catch-up policy is skip) only inside the windows where a
// fault left its bucket without a serving holder. Each scenario calls
// r.schedule(); verify checks the ticks of every schedule the rig added
// (checkSchedules).

// scheduleName names the schedule each scenario adds.
const scheduleName = "every-second"

// schedule adds the every-second probe schedule to the scenario, keyed
// into buckets 0-31: the buckets whose holder the single-holder scenarios
// freeze, cut off, stop or restart.
func (r *rig) schedule() {
	r.t.Helper()
	key := keyIn(r.t, r.policy, mustSet(r.t, "0-31"), "schedule")
	_, stderr, code := r.cli("schedule", "add", "--every", "1s", "--kind", "probe",
		"--key", key, "--payload", `{"duration":"10ms"}`, scheduleName)
	if code != 0 {
		r.t.Fatalf("worker schedule add exited %d: %s", code, stderr)
	}
	r.mu.Lock()
	r.schedules = append(r.schedules, scheduleName)
	r.mu.Unlock()
}
