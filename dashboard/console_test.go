package dashboard

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// fail runs a task of kind in bucketNo as node n1 and ends it failed.
func (b *testBundle) failed(kind string, bucketNo int, payload string, errText string) *task.Task {
	b.t.Helper()
	created := b.create(store.NewTask{Kind: kind, Key: fmt.Sprintf("k-%d", bucketNo), Bucket: bucketNo, MaxAttempts: 1,
		Payload: json.RawMessage(payload)})[0]
	b.endAs(created.ID, kind, bucketNo, task.Failed, errText, nil)
	return b.taskNow(created.ID)
}

func (b *testBundle) taskNow(id int64) *task.Task {
	b.t.Helper()
	t, err := b.store.GetTask(b.ctx, id)
	if err != nil {
		b.t.Fatal(err)
	}
	return t
}

// endAs claims task id (of kind, in bucketNo) as n1 and ends it in to.
func (b *testBundle) endAs(id int64, kind string, bucketNo int, to task.Status, errText string, result json.RawMessage) {
	b.t.Helper()
	leases, err := b.store.AcquireBuckets(b.ctx, store.AcquireRequest{Owner: "n1/x", Node: "n1", Buckets: bucket.Of(bucketNo), TTL: time.Minute})
	if err != nil {
		b.t.Fatal(err)
	}
	claimed, err := b.store.ClaimTasks(b.ctx, store.ClaimRequest{Owner: "n1/x", Node: "n1",
		Buckets: []store.HeldBucket{{Bucket: bucketNo, Epoch: leases[0].Epoch}}, Kinds: []string{kind}, Limit: 100, LeaseTTL: time.Minute})
	if err != nil {
		b.t.Fatal(err)
	}
	for _, c := range claimed {
		if c.ID != id {
			continue
		}
		out, err := b.store.AdvanceActive(b.ctx, "n1/x", []store.ActiveTransition{{Ref: c.Ref(), To: to, Error: errText,
			Result: result, Node: "n1"}})
		if err != nil || out[0].Err != nil {
			b.t.Fatal(err, out)
		}
		return
	}
	b.t.Fatalf("task %d was not claimed: %v", id, claimed)
}

// TestSecretsAreMaskedUntilAnOperatorReveals: fields named like secrets,
// an exec payload's env values and secret options are masked on the page;
// a signed-in operator reveals them with a POST, which the log records in
// their name.
func TestSecretsAreMaskedUntilAnOperatorReveals(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	b := setup(t, testToken, func(c *Config) { c.Logger = zap.New(core); c.SecretFields = []string{"pin"} })
	plain := b.create(store.NewTask{Key: "k", Bucket: 1, Payload: json.RawMessage(
		`{"customer": 7, "password": "hunter2", "nested": {"X-Api-Key": "k-123", "list": [{"client_secret": "cs-9"}]}, "pin": "4711"}`)})[0]
	execTask := b.create(store.NewTask{Kind: "exec", Key: "k", Bucket: 1, Payload: json.RawMessage(
		`{"argv": ["/usr/bin/backup", "--password=pw-1", "--token", "tok-2", "--verbose", "plain-arg"], "env": {"TARGET": "s3-secret-bucket"}}`)})[0]
	csrf := b.login("alice")
	for _, c := range []struct {
		id      int64
		secrets []string
		shown   []string
		masked  int
	}{
		{plain.ID, []string{"hunter2", "k-123", "cs-9", "4711"}, []string{`"customer": 7`, `"list"`}, 4},
		{execTask.ID, []string{"pw-1", "tok-2", "s3-secret-bucket"}, []string{"/usr/bin/backup", "--password=", "--verbose", "plain-arg", `"TARGET"`}, 3},
	} {
		_, page, _ := b.get(fmt.Sprintf("/tasks/%d", c.id))
		for _, s := range c.secrets {
			if strings.Contains(page, s) {
				t.Errorf("task %d: the page shows %q", c.id, s)
			}
		}
		for _, s := range c.shown {
			if !strings.Contains(page, htmlText(s)) {
				t.Errorf("task %d: the page does not show %q", c.id, s)
			}
		}
		if want := fmt.Sprintf(`<p class="note" id="masked">%d values masked.`, c.masked); !strings.Contains(page, want) {
			t.Errorf("task %d: the page does not say %q", c.id, want)
		}
		status, revealed, _ := b.post(fmt.Sprintf("/tasks/%d/reveal", c.id), url.Values{"csrf": {csrf}})
		if status != http.StatusOK {
			t.Fatalf("reveal: %d\n%s", status, revealed)
		}
		for _, s := range c.secrets {
			if !strings.Contains(revealed, s) {
				t.Errorf("task %d revealed: the page does not show %q", c.id, s)
			}
		}
		found := false
		for _, e := range logs.FilterMessageSnippet("dashboard reveal").All() {
			ctx := e.ContextMap()
			found = found || ctx["actor"] == "ui:alice" && ctx["task"] == c.id
		}
		if !found {
			t.Errorf("task %d: no log line says ui:alice revealed it: %v", c.id, logs.All())
		}
	}
	// Nobody reveals without a session and its CSRF token.
	anon := setupClient(b)
	if status, body, _ := anon.post(fmt.Sprintf("/tasks/%d/reveal", plain.ID), url.Values{"csrf": {csrf}}); status != http.StatusUnauthorized ||
		strings.Contains(body, "hunter2") {
		t.Errorf("a reveal without a session: %d", status)
	}
	if status, body, _ := b.post(fmt.Sprintf("/tasks/%d/reveal", plain.ID), url.Values{}); status != http.StatusForbidden ||
		strings.Contains(body, "hunter2") {
		t.Errorf("a reveal without the CSRF token: %d", status)
	}
}

// htmlText is s as html/template writes it in text.
func htmlText(s string) string {
	return strings.NewReplacer(`"`, "&#34;", "'", "&#39;", "<", "&lt;", ">", "&gt;", "&", "&amp;").Replace(s)
}

func TestMaskKeepsTheDocumentsOrderAndFoldsNames(t *testing.T) {
	m, err := newMasker(nil)
	if err != nil {
		t.Fatal(err)
	}
	got := m.show(json.RawMessage(`{"z":1,"Stripe-API-Key":"x","a":[{"passWord":"y"},2],"b":"<p>"}`), false, false)
	want := "{\n  \"z\": 1,\n  \"Stripe-API-Key\": \"" + masked + "\",\n  \"a\": [\n    {\n      \"passWord\": \"" + masked +
		"\"\n    },\n    2\n  ],\n  \"b\": \"<p>\"\n}"
	if got.Text != want || got.Masked != 2 {
		t.Errorf("show = %q (%d masked), want %q (2)", got.Text, got.Masked, want)
	}
	if _, err := newMasker([]string{"_-"}); err == nil {
		t.Error("a secret field that folds to nothing: no error")
	}
}

// TestRetryRunsAFailedTaskAgainInTheOperatorsName: POST /tasks/{id}/retry
// makes a new task, whose trail and the old task's page say who.
func TestRetryRunsAFailedTaskAgainInTheOperatorsName(t *testing.T) {
	b := setup(t, testToken)
	old := b.failed("noop", 2, `{"n": 1}`, "boom")
	csrf := b.login("alice")
	_, page, _ := b.get(fmt.Sprintf("/tasks/%d", old.ID))
	if !strings.Contains(page, `id="retry"`) {
		t.Fatalf("a failed task's page offers no retry:\n%s", page)
	}
	status, _, h := b.post(fmt.Sprintf("/tasks/%d/retry", old.ID), url.Values{"csrf": {csrf}})
	m := regexp.MustCompile(`^/tasks/(\d+)$`).FindStringSubmatch(h.Get("Location"))
	if status != http.StatusSeeOther || m == nil || m[1] == fmt.Sprint(old.ID) {
		t.Fatalf("retry: %d to %q, want the new task's page", status, h.Get("Location"))
	}
	_, page, _ = b.get(h.Get("Location"))
	if !strings.Contains(page, fmt.Sprintf("task %d runs again as task %s, by ui:alice", old.ID, m[1])) ||
		!strings.Contains(page, fmt.Sprintf("retry of task %d by ui:alice", old.ID)) || !strings.Contains(page, `id="retry-of"`) {
		t.Errorf("the new task's page does not say whose retry of what it is:\n%s", page)
	}
	_, page, _ = b.get(fmt.Sprintf("/tasks/%d", old.ID))
	if !strings.Contains(page, `id="retried-as"`) || strings.Contains(page, `id="retry"`) {
		t.Errorf("the old task's page does not link its retry, or offers another:\n%s", page)
	}
	if status, body, _ := b.post(fmt.Sprintf("/tasks/%d/retry", old.ID), url.Values{"csrf": {csrf}}); status != http.StatusConflict ||
		!strings.Contains(body, "run again already") {
		t.Errorf("a second retry: %d\n%s", status, body)
	}
	queued := b.create(store.NewTask{Key: "q", Bucket: 3})[0]
	if status, _, _ := b.post(fmt.Sprintf("/tasks/%d/retry", queued.ID), url.Values{"csrf": {csrf}}); status != http.StatusConflict {
		t.Errorf("a retry of a queued task: %d, want 409", status)
	}
}

// TestAFailedExecTasksOutputIsShown: the output an exec task kept is shown
// with its exit code, stderr above stdout.
func TestAFailedExecTasksOutputIsShown(t *testing.T) {
	b := setup(t, "")
	created := b.create(store.NewTask{Kind: "exec", Key: "k", Bucket: 1, MaxAttempts: 1, Payload: json.RawMessage(`{"argv":["/bin/sh"]}`)})[0]
	res, _ := json.Marshal(map[string]any{"exit_code": 3, "stdout": "line 1\nline 2", "stderr": "fatal: <disk> full", "duration": "1.2s"})
	b.endAs(created.ID, "exec", 1, task.Failed, "exec /bin/sh: exit status 3: fatal: <disk> full", res)
	_, page, _ := b.get(fmt.Sprintf("/tasks/%d", created.ID))
	for _, want := range []string{`id="exit">exit code 3`, "ran 1.2s", `id="stderr">fatal: &lt;disk&gt; full`, "line 1\nline 2"} {
		if !strings.Contains(page, want) {
			t.Errorf("the page does not show %q:\n%s", want, page)
		}
	}
	if strings.Index(page, `id="payload"`) > strings.Index(page, `id="trail"`) {
		t.Error("the payload comes after the trail")
	}
}

// TestAPipelinesPageDrawsItsGraphAndActsOnIt: the list, the graph with each
// step's state and each edge's policy, a skipped step's reason, task rows
// that name their step, and retry-from-step, pause, resume and stop.
func TestAPipelinesPageDrawsItsGraphAndActsOnIt(t *testing.T) {
	b := setup(t, testToken)
	p, err := b.store.CreatePipeline(b.ctx, store.NewPipeline{Name: "etl", Key: "etl-key", Steps: []task.Step{
		{Name: "extract", Kind: "noop", MaxAttempts: 1},
		{Name: "load", Kind: "noop", DependsOn: []task.Dependency{{Step: "extract"}}},
		{Name: "cleanup", Kind: "noop", DependsOn: []task.Dependency{{Step: "extract", On: task.OnFailure}}},
		{Name: "report", Kind: "noop", DependsOn: []task.Dependency{{Step: "load", On: task.OnAny}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	extract, _ := p.Step("extract")
	b.endAs(extract.Task.ID, "noop", p.Bucket, task.Failed, "source unreachable", nil)
	csrf := b.login("alice")

	_, list, _ := b.get("/pipelines")
	if !strings.Contains(list, fmt.Sprintf(`data-pipeline="%d"`, p.ID)) || !strings.Contains(list, "1 queued · 1 failed · 2 skipped") {
		t.Errorf("the list does not show the pipeline and its steps counted:\n%s", list)
	}
	_, page, _ := b.get(fmt.Sprintf("/pipelines/%d", p.ID))
	for _, want := range []string{
		`<svg id="graph"`, `data-step="extract" data-status="failed"`, `data-step="load" data-status="skipped"`,
		`data-step="cleanup" data-status="queued"`, `class="edge success"`, `class="edge failure"`, `class="edge any"`,
		"dependency extract ended failed; this step runs on success", "dependency load was skipped",
		`<option>extract</option>`, "source unreachable",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the pipeline's page lacks %q", want)
		}
	}
	if strings.Contains(page, "<script>") || strings.Contains(page, " style=") {
		t.Error("the pipeline's page carries inline script or style")
	}
	_, tasks, _ := b.get("/tasks")
	if !strings.Contains(tasks, fmt.Sprintf(`<a class="step" href="/pipelines/%d" title="pipeline %d">load</a>`, p.ID, p.ID)) {
		t.Errorf("the task list does not name the step and link its pipeline:\n%s", tasks)
	}
	load, _ := p.Step("load")
	_, stepPage, _ := b.get(fmt.Sprintf("/tasks/%d", load.Task.ID))
	if !strings.Contains(stepPage, `id="pipeline-link" href="/pipelines/`) ||
		!strings.Contains(stepPage, `<td id="skipped">dependency extract ended failed; this step runs on success</td>`) {
		t.Errorf("a skipped step's page does not link its pipeline or say why:\n%s", stepPage)
	}

	// A retry from extract runs its descendants again too, once they ended.
	if status, body, _ := b.post(fmt.Sprintf("/pipelines/%d/retry", p.ID), url.Values{"csrf": {csrf}, "step": {"extract"}}); status != http.StatusConflict ||
		!strings.Contains(body, "cleanup") {
		t.Errorf("retry while cleanup is queued: %d, want 409 naming cleanup\n%s", status, body)
	}
	cleanup, _ := p.Step("cleanup")
	b.endAs(cleanup.Task.ID, "noop", p.Bucket, task.Succeeded, "", nil)
	status, _, h := b.post(fmt.Sprintf("/pipelines/%d/retry", p.ID), url.Values{"csrf": {csrf}, "step": {"extract"}})
	if status != http.StatusSeeOther || h.Get("Location") != fmt.Sprintf("/pipelines/%d", p.ID) {
		t.Fatalf("retry from extract: %d to %q", status, h.Get("Location"))
	}
	after, _ := b.store.GetPipeline(b.ctx, p.ID)
	var states []string
	for _, st := range after.Steps {
		states = append(states, st.Name+"="+string(st.Task.Status))
	}
	if got := strings.Join(states, " "); got != "extract=queued load=pending cleanup=succeeded report=pending" {
		t.Errorf("after the retry: %s", got)
	}
	ev, _ := b.store.TaskEvents(b.ctx, func() int64 { s, _ := after.Step("extract"); return s.Task.ID }())
	if !strings.Contains(ev[0].Reason, "(step extract) by ui:alice") {
		t.Errorf("the retried step's trail: %q", ev[0].Reason)
	}
	for _, step := range []struct {
		action string
		want   task.Status
	}{{"pause", task.Paused}, {"resume", task.Queued}, {"stop", task.Cancelled}} {
		status, _, _ := b.post(fmt.Sprintf("/pipelines/%d/%s", p.ID, step.action), url.Values{"csrf": {csrf}})
		if status != http.StatusSeeOther {
			t.Fatalf("%s: %d", step.action, status)
		}
		cur, _ := b.store.GetPipeline(b.ctx, p.ID)
		if s, _ := cur.Step("extract"); s.Task.Status != step.want {
			t.Errorf("after %s, extract is %s, want %s", step.action, s.Task.Status, step.want)
		}
	}
	if status, _, _ := b.post(fmt.Sprintf("/pipelines/%d/retry", p.ID), url.Values{"csrf": {csrf}, "step": {"nope"}}); status != http.StatusNotFound {
		t.Errorf("retry from a missing step: %d, want 404", status)
	}
}

// TestBulkActionsNeedAFilterAReviewedCountAndACap.
func TestBulkActionsNeedAFilterAReviewedCountAndACap(t *testing.T) {
	b := setup(t, testToken, func(c *Config) { c.BulkCap = 4 })
	var failed []*task.Task
	for i := range 3 {
		failed = append(failed, b.failed("report", i, `{}`, "boom"))
	}
	ok := b.create(store.NewTask{Kind: "report", Key: "ok", Bucket: 5})[0]
	b.endAs(ok.ID, "report", 5, task.Succeeded, "", nil)
	csrf := b.login("alice")
	_, list, _ := b.get("/tasks?kind=report&state=failed")
	if !strings.Contains(list, `id="bulk-form"`) {
		t.Fatalf("the filtered list offers no bulk action:\n%s", list)
	}
	_, review, _ := b.get("/tasks/bulk?kind=report&state=failed&action=retry")
	if !strings.Contains(review, "<b>3</b> of the 3 tasks") || !strings.Contains(review, `name="expect" value="3"`) {
		t.Fatalf("the review does not count 3 tasks:\n%s", review)
	}
	form := url.Values{"csrf": {csrf}, "action": {"retry"}, "kind": {"report"}, "state": {"failed"}}
	form.Set("expect", "2")
	if status, body, _ := b.post("/tasks/bulk", form); status != http.StatusConflict || !strings.Contains(body, "review again") {
		t.Errorf("a bulk retry confirming 2 of 3: %d\n%s", status, body)
	}
	form.Set("expect", "3")
	status, _, h := b.post("/tasks/bulk", form)
	if status != http.StatusSeeOther || h.Get("Location") != "/tasks?kind=report&state=failed" {
		t.Fatalf("the bulk retry: %d to %q", status, h.Get("Location"))
	}
	_, after, _ := b.get(h.Get("Location"))
	if !strings.Contains(after, "bulk retry by ui:alice: 3 of 3 tasks") {
		t.Errorf("the notice does not count the retries:\n%s", after)
	}
	for _, f := range failed {
		r, err := b.store.TaskRetries(b.ctx, f.ID)
		if err != nil || r.As == nil || r.As.By != "ui:alice" {
			t.Fatalf("task %d: %+v %v, want run again by ui:alice", f.ID, r, err)
		}
		ev, _ := b.store.TaskEvents(b.ctx, r.As.RetryID)
		if !strings.Contains(ev[0].Reason, "by ui:alice: bulk retry from the dashboard") {
			t.Errorf("task %d's retry's trail: %q", f.ID, ev[0].Reason)
		}
	}
	// A second bulk retry of the same tasks is refused task by task: each
	// is run again once.
	status, _, h = b.post("/tasks/bulk", form)
	if _, again, _ := b.get(h.Get("Location")); status != http.StatusSeeOther ||
		!strings.Contains(again, "0 of 3 tasks; 3 refused, the first because task") || !strings.Contains(again, "run again already") {
		t.Errorf("a second bulk retry: %d\n%s", status, again)
	}
	// Cancel acts on the tasks that wait: the three new ones.
	_, review, _ = b.get("/tasks/bulk?kind=report&state=queued&action=cancel")
	if !strings.Contains(review, "<b>3</b> of the 3 tasks") {
		t.Errorf("cancel of the queued report tasks: want 3:\n%s", review)
	}
	// Past the cap, nothing is done.
	b.create(store.NewTask{Kind: "report", Key: "x", Bucket: 6}, store.NewTask{Kind: "report", Key: "y", Bucket: 7})
	if status, body, _ := b.post("/tasks/bulk", url.Values{"csrf": {csrf}, "action": {"cancel"}, "kind": {"report"},
		"state": {"queued"}, "expect": {"5"}}); status != http.StatusConflict || !strings.Contains(body, "more than 4 tasks") {
		t.Errorf("a bulk cancel over the cap: %d\n%s", status, body)
	}
	form = url.Values{"csrf": {csrf}, "action": {"cancel"}, "kind": {"report"}, "state": {"queued"}, "bucket": {"0-5"}, "expect": {"3"}}
	if status, _, _ := b.post("/tasks/bulk", form); status != http.StatusSeeOther {
		t.Errorf("a bulk cancel of 3: %d", status)
	}
	for _, f := range failed {
		r, _ := b.store.TaskRetries(b.ctx, f.ID)
		if got := b.taskNow(r.As.RetryID); got.Status != task.Cancelled {
			t.Errorf("task %d is %s after the bulk cancel", got.ID, got.Status)
		}
	}
	if status, body, _ := b.get("/tasks/bulk?action=stop"); status != http.StatusBadRequest || !strings.Contains(body, "needs a filter") {
		t.Errorf("a bulk action without a filter: %d\n%s", status, body)
	}
	if status, _, _ := b.get("/tasks/bulk?state=failed&action=delete"); status != http.StatusBadRequest {
		t.Errorf("an unknown bulk action: %d", status)
	}
}

// TestTheFleetPageCountsByKindAndChartsAttempts: the counts of unfinished
// tasks by kind and state, the last hour's ended attempts, and the charts.
func TestTheFleetPageCountsByKindAndChartsAttempts(t *testing.T) {
	b := setup(t, "")
	b.create(store.NewTask{Kind: "email", Key: "a", Bucket: 1}, store.NewTask{Kind: "email", Key: "b", Bucket: 2},
		store.NewTask{Kind: "report", Key: "c", Bucket: 3, Delay: time.Hour})
	now := time.Now().UTC().Truncate(time.Minute)
	if err := b.store.AddMinuteCounts(b.ctx, "n1", []store.MinuteCount{
		{Minute: now, Kind: "email", Status: task.Succeeded, Count: 40},
		{Minute: now.Add(-time.Minute), Kind: "email", Status: task.Failed, Count: 2},
		{Minute: now.Add(-3 * time.Hour), Kind: "report", Status: task.Succeeded, Count: 7},
	}); err != nil {
		t.Fatal(err)
	}
	_, page, _ := b.get("/fleet")
	for _, want := range []string{
		`<tr data-kind="email"><td><a href="/tasks?kind=email">email</a></td>`,
		`<a href="/tasks?kind=email&amp;state=queued">2</a>`, `<a href="/tasks?kind=report&amp;state=scheduled">1</a>`,
		`<span class="zero">0</span>`, "60 min ago", "24 h ago",
		`<a href="/tasks?kind=email&amp;state=succeeded">40</a>`, `<a class="bad failed-count" href="/tasks?kind=email&amp;state=failed">2</a>`,
		"the last hour, per minute: <span class=\"ok\">40 succeeded</span>, <span class=\"bad\">2 failed</span>",
		"the last day, per 10 minutes: <span class=\"ok\">47 succeeded</span>",
		"40 succeeded, 0 failed</title>",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the fleet page lacks %q", want)
		}
	}
	if strings.Contains(page, "No node wrote its per-minute counts") {
		t.Error("the page says no counts were written")
	}
}

// TestABigFleetsMapIsSummarised: 65,536 buckets make a page of runs by
// holder, not a cell per bucket.
func TestABigFleetsMapIsSummarised(t *testing.T) {
	b := bigFleet(t, 65536)
	_, page, _ := b.get("/fleet")
	if len(page) > 100_000 {
		t.Errorf("the fleet page of 65,536 buckets is %d bytes, want under 100 kB", len(page))
	}
	for _, want := range []string{`<svg class="bar" id="bucket-bar"`, `<tr data-holder="node-0">`, "0-16383", `<tr data-holder="">`,
		"buckets 0-16383: node-0", "65536 buckets"} {
		if !strings.Contains(page, want) {
			t.Errorf("the summarised map lacks %q", want)
		}
	}
	if strings.Contains(page, `class="grid"`) {
		t.Error("the page of 65,536 buckets draws the grid")
	}
	// A map of more runs than bins is drawn in bins.
	cells := make([]bucketCell, 65536)
	for i := range cells {
		cells[i].Bucket, cells[i].Holder, cells[i].Class = i, fmt.Sprintf("n%d", i%2), fmt.Sprintf("h%d", i%2)
	}
	if s := summarise(cells); len(s.Runs) != summaryBins || !strings.Contains(s.Runs[0].Title, "64 of 128 held by") ||
		!strings.Contains(s.Holders[0].Ranges, "more ranges") {
		t.Errorf("a map of alternating holders: %d runs (%q), ranges %q", len(s.Runs), s.Runs[0].Title, s.Holders[0].Ranges)
	}
}

func TestAgoShowsRelativeTimesWithTheAbsoluteOnHover(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		t    time.Time
		want string
	}{
		{now.Add(-3 * time.Second), ">3s ago<"},
		{now.Add(-(3*time.Minute + 12*time.Second)), ">3m12s ago<"},
		{now.Add(-26 * time.Hour), ">26h ago<"},
		{now.Add(-5 * 24 * time.Hour), ">5d ago<"},
		{now.Add(90 * time.Second), ">in 1m30s<"},
		{now, ">now<"},
	} {
		got := string(ago(now, c.t))
		if !strings.Contains(got, c.want) || !strings.Contains(got, `title="`+absolute(c.t)+`"`) {
			t.Errorf("ago(%v) = %s, want %s with the absolute time on hover", now.Sub(c.t), got, c.want)
		}
	}
	if got := ago(now, time.Time{}); got != "—" {
		t.Errorf("ago(zero) = %q", got)
	}
}
