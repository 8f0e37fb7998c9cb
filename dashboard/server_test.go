package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/store/memory"
	"github.com/flotilla-dev/flotilla/task"
)

const (
	testToken   = "0123456789abcdef-token"
	testBuckets = 8
)

type testBundle struct {
	t     *testing.T
	ctx   context.Context
	store *memory.Store
	srv   *httptest.Server
	dash  *Server
	http  *http.Client
}

// setup serves a dashboard over a memory store; token "" is read-only.
// configure, when given, changes the dashboard's Config before New.
func setup(t *testing.T, token string, configure ...func(*Config)) *testBundle {
	t.Helper()
	ctx := context.Background()
	s := memory.New()
	t.Cleanup(s.Close)
	if _, err := s.Migrate(ctx, testBuckets); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Store: s, Token: token, LiveInterval: 10 * time.Millisecond, LiveFor: 200 * time.Millisecond}
	for _, c := range configure {
		c(&cfg)
	}
	d, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d)
	t.Cleanup(func() { d.Close(); srv.Close() })
	b := &testBundle{t: t, ctx: ctx, store: s, srv: srv, dash: d}
	return setupClient(b)
}

// setupClient is another browser on b's dashboard: a cookie jar of its
// own, no redirect followed.
func setupClient(b *testBundle) *testBundle {
	jar, _ := cookiejar.New(nil)
	c := *b
	c.http = &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return &c
}

func (b *testBundle) do(req *http.Request) (int, string, http.Header) {
	b.t.Helper()
	resp, err := b.http.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		b.t.Fatal(err)
	}
	return resp.StatusCode, string(body), resp.Header
}

func (b *testBundle) get(path string) (int, string, http.Header) {
	b.t.Helper()
	req, err := http.NewRequest(http.MethodGet, b.srv.URL+path, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	return b.do(req)
}

func (b *testBundle) post(path string, form url.Values, header ...string) (int, string, http.Header) {
	b.t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.srv.URL+path, strings.NewReader(form.Encode()))
	if err != nil {
		b.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return b.do(req)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([A-Za-z0-9_-]+)"`)

// login signs in as name and returns the CSRF token of the session.
func (b *testBundle) login(name string) string {
	b.t.Helper()
	status, body, _ := b.post("/login", url.Values{"name": {name}, "token": {testToken}})
	if status != http.StatusSeeOther {
		b.t.Fatalf("sign-in: %d %s", status, body)
	}
	_, page, _ := b.get("/fleet")
	m := csrfField.FindStringSubmatch(page)
	if m == nil {
		b.t.Fatalf("no CSRF token on the page after signing in:\n%s", page)
	}
	return m[1]
}

func (b *testBundle) create(nt ...store.NewTask) []*task.Task {
	b.t.Helper()
	for i := range nt {
		if nt[i].Kind == "" {
			nt[i].Kind = "noop"
		}
	}
	ts, err := b.store.CreateTasks(b.ctx, nt)
	if err != nil {
		b.t.Fatal(err)
	}
	return ts
}

// running claims a task as node n1 would.
func (b *testBundle) running(bucketNo int) *task.Task {
	b.t.Helper()
	created := b.create(store.NewTask{Key: "k", Bucket: bucketNo})[0]
	leases, err := b.store.AcquireBuckets(b.ctx, store.AcquireRequest{Owner: "n1/x", Node: "n1", Buckets: bucket.Of(bucketNo), TTL: time.Minute})
	if err != nil {
		b.t.Fatal(err)
	}
	claimed, err := b.store.ClaimTasks(b.ctx, store.ClaimRequest{Owner: "n1/x", Node: "n1",
		Buckets: []store.HeldBucket{{Bucket: bucketNo, Epoch: leases[0].Epoch}}, Kinds: []string{"noop"}, Limit: 1, LeaseTTL: time.Minute})
	if err != nil || len(claimed) != 1 || claimed[0].ID != created.ID {
		b.t.Fatalf("claim: %v %v", claimed, err)
	}
	return claimed[0]
}

func (b *testBundle) status(id int64) task.Status {
	b.t.Helper()
	got, err := b.store.GetTask(b.ctx, id)
	if err != nil {
		b.t.Fatal(err)
	}
	return got.Status
}

func TestEveryPageRendersWithARestrictiveContentSecurityPolicy(t *testing.T) {
	b := setup(t, testToken)
	tk := b.create(store.NewTask{Key: "k", Bucket: 1})[0]
	if _, err := b.store.UpsertSchedule(b.ctx, store.Schedule{Name: "nightly", Spec: "@every 1h", Kind: "noop", Bucket: 2,
		Enabled: true, NextFireAt: time.Now().Add(time.Hour)}, store.UpsertCreate); err != nil {
		t.Fatal(err)
	}
	p, err := b.store.CreatePipeline(b.ctx, store.NewPipeline{Name: "etl", Steps: []task.Step{{Name: "a", Kind: "noop"}}})
	if err != nil {
		t.Fatal(err)
	}
	b.login("alice")
	for _, path := range []string{"/fleet", "/tasks", fmt.Sprintf("/tasks/%d", tk.ID), "/schedules", "/login", "/static/app.js",
		"/static/app.css", "/pipelines", fmt.Sprintf("/pipelines/%d", p.ID), "/tasks/bulk?state=queued&action=stop"} {
		status, body, h := b.get(path)
		if status != http.StatusOK {
			t.Errorf("GET %s: %d\n%s", path, status, body)
		}
		if csp := h.Get("Content-Security-Policy"); csp != contentSecurityPolicy || !strings.Contains(csp, "script-src 'self'") {
			t.Errorf("GET %s: Content-Security-Policy %q", path, csp)
		}
		if h.Get("X-Content-Type-Options") != "nosniff" || h.Get("X-Frame-Options") != "DENY" {
			t.Errorf("GET %s: headers %v", path, h)
		}
	}
	if status, _, h := b.get("/"); status != http.StatusSeeOther || h.Get("Location") != "/fleet" {
		t.Errorf("GET /: %d to %q, want a redirect to /fleet", status, h.Get("Location"))
	}
	_, body, _ := b.get("/schedules")
	if !strings.Contains(body, "nightly") || !strings.Contains(body, "@every 1h") {
		t.Errorf("the schedule is not listed:\n%s", body)
	}
	if status, _, _ := b.get("/tasks/999"); status != http.StatusNotFound {
		t.Errorf("a missing task: %d, want 404", status)
	}
}

func TestHostileKeysPayloadsAndErrorsAreEscaped(t *testing.T) {
	b := setup(t, testToken)
	const hostile = `<script>alert("x")</script><img src=x onerror=alert(1)>`
	payload, _ := json.Marshal(map[string]string{"note": `</pre>` + hostile})
	tk := b.running(3)
	// A key and an error are free text; so is the payload's content.
	created := b.create(store.NewTask{Key: hostile, Bucket: 3, Payload: payload})[0]
	out, err := b.store.AdvanceActive(b.ctx, "n1/x", []store.ActiveTransition{{Ref: tk.Ref(), To: task.Failed, Error: hostile, Node: "n1"}})
	if err != nil || out[0].Err != nil {
		t.Fatal(err, out)
	}
	b.login("alice")
	pages := []string{"/tasks", fmt.Sprintf("/tasks/%d", created.ID), fmt.Sprintf("/tasks/%d", tk.ID),
		"/tasks?key=" + url.QueryEscape(hostile), "/tasks?payload=" + url.QueryEscape(`{"note":"`+hostile+`"}`)}
	for _, path := range pages {
		_, body, _ := b.get(path)
		if strings.Contains(body, "<script>alert") || strings.Contains(body, "<img src=x") {
			t.Errorf("GET %s: the hostile text reached the page unescaped:\n%s", path, body)
		}
		if !strings.Contains(body, "&lt;script&gt;alert") {
			t.Errorf("GET %s: the hostile text is not shown escaped", path)
		}
	}
	// A bad filter's error names the value, escaped too.
	status, body, _ := b.get("/tasks?state=" + url.QueryEscape(hostile))
	if status != http.StatusBadRequest || strings.Contains(body, "<script>alert") || !strings.Contains(body, "not a task state") {
		t.Errorf("a hostile state filter: %d\n%s", status, body)
	}
}

func TestAReadOnlyDashboardRefusesEveryAction(t *testing.T) {
	b := setup(t, "")
	tk := b.create(store.NewTask{Key: "k", Bucket: 1})[0]
	_, page, _ := b.get(fmt.Sprintf("/tasks/%d", tk.ID))
	if strings.Contains(page, `id="stop"`) || strings.Contains(page, "Sign in") {
		t.Errorf("a read-only dashboard offers actions:\n%s", page)
	}
	for _, path := range []string{fmt.Sprintf("/tasks/%d/stop", tk.ID), fmt.Sprintf("/tasks/%d/pause", tk.ID),
		fmt.Sprintf("/tasks/%d/retry", tk.ID), fmt.Sprintf("/tasks/%d/reveal", tk.ID), "/schedules/pause", "/tasks/bulk",
		"/pipelines/1/stop", "/login"} {
		status, body, _ := b.post(path, url.Values{"csrf": {"anything"}, "name": {"a"}, "token": {""}})
		if status != http.StatusForbidden || !strings.Contains(body, "read-only") {
			t.Errorf("POST %s on a read-only dashboard: %d, want 403 saying it is read-only\n%s", path, status, body)
		}
	}
	if got := b.status(tk.ID); got != task.Queued {
		t.Errorf("the task is %s after refused actions, want queued", got)
	}
}

func TestActionsNeedASessionAndItsCSRFToken(t *testing.T) {
	b := setup(t, testToken)
	tk := b.create(store.NewTask{Key: "k", Bucket: 1})[0]
	stop := fmt.Sprintf("/tasks/%d/stop", tk.ID)
	if status, _, _ := b.post(stop, url.Values{"csrf": {"0000"}}); status != http.StatusUnauthorized {
		t.Errorf("a stop without a session: %d, want 401", status)
	}
	other := setupClient(b)
	otherCSRF := other.login("mallory")
	csrf := b.login("alice")
	cases := []struct {
		name   string
		form   url.Values
		header []string
	}{
		{"no CSRF token", url.Values{}, nil},
		{"a wrong CSRF token", url.Values{"csrf": {strings.Repeat("0", len(csrf))}}, nil},
		{"another session's CSRF token", url.Values{"csrf": {otherCSRF}}, nil},
		{"another origin", url.Values{"csrf": {csrf}}, []string{"Origin", "https://evil.example"}},
	}
	for _, c := range cases {
		status, body, _ := b.post(stop, c.form, c.header...)
		if status != http.StatusForbidden || !strings.Contains(body, "refused") {
			t.Errorf("%s: %d, want 403\n%s", c.name, status, body)
		}
	}
	if got := b.status(tk.ID); got != task.Queued {
		t.Fatalf("the task is %s after refused stops, want queued", got)
	}
	// A forged cookie is no session.
	u, _ := url.Parse(b.srv.URL)
	b.http.Jar.SetCookies(u, []*http.Cookie{{Name: sessionCookie, Value: "abc.YWxpY2U.deadbeef", Path: "/"}})
	if status, _, _ := b.post(stop, url.Values{"csrf": {csrf}}); status != http.StatusUnauthorized {
		t.Errorf("a forged session cookie: %d, want 401", status)
	}
}

func TestSignInRefusesAWrongTokenAndABadName(t *testing.T) {
	b := setup(t, testToken)
	if status, body, _ := b.post("/login", url.Values{"name": {"alice"}, "token": {"wrong-token-wrong-token"}}); status != http.StatusUnauthorized ||
		!strings.Contains(body, "wrong token") {
		t.Errorf("a wrong token: %d\n%s", status, body)
	}
	if status, body, _ := b.post("/login", url.Values{"name": {"al ice<"}, "token": {testToken}}); status != http.StatusBadRequest ||
		!strings.Contains(body, "is not valid") || strings.Contains(body, "al ice<\"") {
		t.Errorf("a bad name: %d\n%s", status, body)
	}
	if _, err := New(context.Background(), Config{Store: memory.New(), Token: "short"}); err == nil ||
		!strings.Contains(err.Error(), "at least 16") {
		t.Errorf("a short token: %v, want an error asking for 16 characters", err)
	}
}

func TestStopOfARunningTaskIssuesACommandInTheOperatorsName(t *testing.T) {
	b := setup(t, testToken)
	tk := b.running(2)
	csrf := b.login("alice")
	_, page, _ := b.get(fmt.Sprintf("/tasks/%d", tk.ID))
	if !strings.Contains(page, `id="stop"`) || !strings.Contains(page, `id="pause"`) || strings.Contains(page, `id="resume"`) {
		t.Errorf("a running task's page should offer stop and pause only:\n%s", page)
	}
	status, _, h := b.post(fmt.Sprintf("/tasks/%d/stop", tk.ID), url.Values{"csrf": {csrf}})
	if status != http.StatusSeeOther || !strings.Contains(h.Get("Location"), "?command=") {
		t.Fatalf("stop: %d to %q, want a redirect to the task following its command", status, h.Get("Location"))
	}
	_, page, _ = b.get(h.Get("Location"))
	if !strings.Contains(page, "issued by ui:alice") || !strings.Contains(page, "waiting for the node") {
		t.Errorf("the page does not show the pending command and its issuer:\n%s", page)
	}
	cid, _ := strconv64(strings.SplitN(h.Get("Location"), "command=", 2)[1])
	cmd, err := b.store.GetCommand(b.ctx, cid)
	if err != nil || cmd.IssuedBy != "ui:alice" || cmd.Kind != store.CommandStop {
		t.Fatalf("command %+v (%v), want a stop issued by ui:alice", cmd, err)
	}
	// The node applies it: the task stops, and the store acknowledges.
	if _, err := b.store.AdvanceActive(b.ctx, "n1/x", []store.ActiveTransition{{Ref: tk.Ref(), To: task.Stopping, Node: "n1", Reason: "stop requested by ui:alice"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.AdvanceActive(b.ctx, "n1/x", []store.ActiveTransition{{Ref: tk.Ref(), To: task.Stopped, Node: "n1"}}); err != nil {
		t.Fatal(err)
	}
	_, page, _ = b.get(h.Get("Location"))
	if !strings.Contains(page, "acknowledged by n1") || !strings.Contains(page, "<b>stopped</b>") {
		t.Errorf("the page does not show the acknowledgement:\n%s", page)
	}
	if !strings.Contains(page, "ui:alice") || !strings.Contains(page, `data-to="stopped"`) {
		t.Errorf("the trail does not end in stopped with the actor:\n%s", page)
	}
}

func strconv64(s string) (int64, error) {
	var id int64
	_, err := fmt.Sscan(s, &id)
	return id, err
}

func TestPauseResumeAndStopOfAWaitingTaskAreDirect(t *testing.T) {
	b := setup(t, testToken)
	tk := b.create(store.NewTask{Key: "k", Bucket: 1})[0]
	csrf := b.login("bob")
	steps := []struct {
		action string
		want   task.Status
	}{{"pause", task.Paused}, {"resume", task.Queued}, {"stop", task.Cancelled}}
	for _, s := range steps {
		status, _, h := b.post(fmt.Sprintf("/tasks/%d/%s", tk.ID, s.action), url.Values{"csrf": {csrf}})
		if status != http.StatusSeeOther || h.Get("Location") != fmt.Sprintf("/tasks/%d", tk.ID) {
			t.Fatalf("%s: %d to %q", s.action, status, h.Get("Location"))
		}
		if got := b.status(tk.ID); got != s.want {
			t.Fatalf("after %s the task is %s, want %s", s.action, got, s.want)
		}
		// The notice is shown once, on the next page.
		_, page, _ := b.get(h.Get("Location"))
		if want := fmt.Sprintf("%s by ui:bob: task %d is %s", s.action, tk.ID, s.want); !strings.Contains(page, want) {
			t.Errorf("after %s the page does not say %q:\n%s", s.action, want, page)
		}
		if _, again, _ := b.get(h.Get("Location")); strings.Contains(again, `id="flash"`) {
			t.Errorf("the notice of %s is shown twice", s.action)
		}
	}
	events, err := b.store.TaskEvents(b.ctx, tk.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events[1:] {
		if !strings.Contains(e.Reason, "ui:bob") {
			t.Errorf("event %d (%s -> %s) does not name the actor: %q", e.Seq, e.From, e.To, e.Reason)
		}
	}
	// A finished task: stopping it again is reported, a pause refused.
	status, body, _ := b.post(fmt.Sprintf("/tasks/%d/pause", tk.ID), url.Values{"csrf": {csrf}})
	if status != http.StatusConflict {
		t.Errorf("pause of a cancelled task: %d, want 409\n%s", status, body)
	}
	if status, _, _ := b.post(fmt.Sprintf("/tasks/%d/bogus", tk.ID), url.Values{"csrf": {csrf}}); status != http.StatusNotFound {
		t.Errorf("an unknown action: %d, want 404", status)
	}
}

func TestSchedulesPauseAndResume(t *testing.T) {
	b := setup(t, testToken)
	if _, err := b.store.UpsertSchedule(b.ctx, store.Schedule{Name: "hourly", Spec: "@every 1h", Kind: "noop", Bucket: 2,
		Enabled: true, NextFireAt: time.Now().Add(time.Hour)}, store.UpsertCreate); err != nil {
		t.Fatal(err)
	}
	csrf := b.login("carol")
	for _, step := range []struct {
		action  string
		enabled bool
	}{{"pause", false}, {"resume", true}} {
		status, _, h := b.post("/schedules/"+step.action, url.Values{"csrf": {csrf}, "name": {"hourly"}})
		if status != http.StatusSeeOther {
			t.Fatalf("%s: %d", step.action, status)
		}
		sc, err := b.store.GetSchedule(b.ctx, "hourly")
		if err != nil || sc.Enabled != step.enabled {
			t.Fatalf("after %s: enabled %v (%v), want %v", step.action, sc.Enabled, err, step.enabled)
		}
		_, page, _ := b.get(h.Get("Location"))
		if !strings.Contains(page, "by ui:carol") {
			t.Errorf("the schedules page does not say who acted:\n%s", page)
		}
	}
	if status, _, _ := b.post("/schedules/pause", url.Values{"csrf": {csrf}, "name": {"missing"}}); status != http.StatusNotFound {
		t.Errorf("pause of a missing schedule: %d, want 404", status)
	}
}

func TestTaskFiltersAndKeysetPages(t *testing.T) {
	b := setup(t, "")
	var nts []store.NewTask
	for i := range PageSize + 5 {
		nts = append(nts, store.NewTask{Key: fmt.Sprintf("k%d", i), Bucket: i % testBuckets,
			Payload: json.RawMessage(fmt.Sprintf(`{"customer": %d}`, i%3))})
	}
	created := b.create(nts...)
	_, page, _ := b.get("/tasks")
	next := regexp.MustCompile(`id="next" href="([^"]+)"`).FindStringSubmatch(page)
	if next == nil {
		t.Fatalf("no next page link with %d tasks", len(created))
	}
	if got := strings.Count(page, `<tr data-task=`); got != PageSize {
		t.Errorf("first page has %d tasks, want %d", got, PageSize)
	}
	_, page2, _ := b.get(strings.ReplaceAll(next[1], "&amp;", "&"))
	if got := strings.Count(page2, `<tr data-task=`); got != 5 || strings.Contains(page2, `id="next"`) {
		t.Errorf("second page has %d tasks, want 5 and no next link", got)
	}
	if !strings.Contains(page2, fmt.Sprintf(`href="/tasks/%d"`, created[0].ID)) {
		t.Errorf("the oldest task is not on the last page")
	}
	_, page, _ = b.get("/tasks?payload=" + url.QueryEscape(`{"customer": 2}`) + "&bucket=0-3")
	for _, tk := range created {
		want := tk.Bucket <= 3 && strings.Contains(string(tk.Payload), `"customer": 2`)
		if got := strings.Contains(page, fmt.Sprintf(`href="/tasks/%d"`, tk.ID)); got != want {
			t.Errorf("task %d (bucket %d, payload %s) listed %v, want %v", tk.ID, tk.Bucket, tk.Payload, got, want)
		}
	}
	for query, want := range map[string]string{
		"state=bogus":  `state &#34;bogus&#34; is not a task state`,
		"payload=%7Bx": `is not JSON`,
		"bucket=99":    `bucket &#34;99&#34;`,
		"before=-1":    `not a task id`,
		"before=abc":   `not a task id`,
	} {
		status, body, _ := b.get("/tasks?" + query)
		if status != http.StatusBadRequest || !strings.Contains(body, want) {
			t.Errorf("GET /tasks?%s: %d, want 400 with %q\n%s", query, status, want, body)
		}
	}
}

func TestTheFleetMapColoursBucketsByHolder(t *testing.T) {
	b := setup(t, "")
	for _, n := range []store.NodeInfo{{ID: "n1", Incarnation: "n1/x", Buckets: bucket.Of(0, 1, 2, 3)}, {ID: "n2", Incarnation: "n2/y", Buckets: bucket.Of(4, 5)}} {
		if err := b.store.RegisterNode(b.ctx, n, time.Minute); err != nil {
			t.Fatal(err)
		}
		if _, err := b.store.AcquireBuckets(b.ctx, store.AcquireRequest{Owner: n.Incarnation, Node: n.ID, Buckets: n.Buckets, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	_, page, _ := b.get("/fleet")
	cell := regexp.MustCompile(`class="b (\w+)" href="/tasks\?bucket=(\d+)" data-bucket="\d+" data-holder="(\w*)"`)
	got := map[string]string{}
	for _, m := range cell.FindAllStringSubmatch(page, -1) {
		got[m[2]] = m[1] + "/" + m[3]
	}
	want := map[string]string{"0": "h0/n1", "3": "h0/n1", "4": "h1/n2", "5": "h1/n2", "6": "free/", "7": "free/"}
	for b, w := range want {
		if got[b] != w {
			t.Errorf("bucket %s: %q, want %q", b, got[b], w)
		}
	}
	if len(got) != testBuckets || !strings.Contains(page, `<span id="unheld">2</span>`) {
		t.Errorf("%d cells, want %d, and 2 unheld:\n%s", len(got), testBuckets, page)
	}
	if !strings.Contains(page, `data-node="n1"`) || !strings.Contains(page, "4 (0-3)") {
		t.Errorf("the nodes table does not show n1 holding 0-3:\n%s", page)
	}
}

func TestTheLiveStreamSendsTheFleetAsEvents(t *testing.T) {
	b := setup(t, "")
	status, body, h := b.get("/fleet/live")
	if status != http.StatusOK || h.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("GET /fleet/live: %d %s", status, h.Get("Content-Type"))
	}
	events := strings.Count(body, "event: fleet-live\n")
	if events < 2 || !strings.Contains(body, `data: <div class="grid" id="buckets">`) {
		t.Errorf("the stream (ended after LiveFor) carries %d fleet events:\n%s", events, body)
	}
}

func TestRedactSecrets(t *testing.T) {
	for in, want := range map[string]string{
		"dial postgres://u:s3cret@db:5432/x failed": "dial postgres://u:[redacted]@db:5432/x failed",
		"host=db password=s3cret user=u":            "host=db password=[redacted] user=u",
		"nothing here":                              "nothing here",
	} {
		if got := redactSecrets(in); got != want || strings.Contains(got, "s3cret") {
			t.Errorf("redactSecrets(%q) = %q, want %q", in, got, want)
		}
	}
	if _, err := New(context.Background(), Config{}); err == nil || !errors.Is(err, err) || !strings.Contains(err.Error(), "Store") {
		t.Errorf("no store: %v", err)
	}
}

func TestTheFleetMapShowsMovesInProgress(t *testing.T) {
	b := setup(t, "")
	n := store.NodeInfo{ID: "n1", Incarnation: "n1/x", Buckets: bucket.Of(0, 1, 2)}
	for _, r := range []store.NodeInfo{n, {ID: "n2", Incarnation: "n2/y", Buckets: bucket.Of(1, 2)}} {
		if err := b.store.RegisterNode(b.ctx, r, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	held, err := b.store.AcquireBuckets(b.ctx, store.AcquireRequest{Owner: n.Incarnation, Node: n.ID, Buckets: n.Buckets, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.MarkHandoff(b.ctx, n.Incarnation, []store.Handoff{
		{Bucket: 1, Epoch: held[1].Epoch, To: "n2/y", ToNode: "n2"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.HandOff(b.ctx, n.Incarnation, []store.Handoff{
		{Bucket: 2, Epoch: held[2].Epoch, To: "n2/y", ToNode: "n2"}}, time.Minute); err != nil {
		t.Fatal(err)
	}
	_, page, _ := b.get("/fleet")
	cell := regexp.MustCompile(`class="b ([\w ]+)" href="/tasks\?bucket=(\d+)" data-bucket="\d+" data-holder="\w*"( data-successor="(\w+)")? title="([^"]*)"`)
	got := map[string][]string{}
	for _, m := range cell.FindAllStringSubmatch(page, -1) {
		got[m[2]] = m[1:]
	}
	if c := got["0"]; c == nil || strings.Contains(c[0], "moving") {
		t.Errorf("bucket 0, not moving, is drawn %q", c)
	}
	if c := got["1"]; c == nil || !strings.Contains(c[0], "moving") || c[3] != "n2" || !strings.Contains(c[4], "moving to n2 since") {
		t.Errorf("bucket 1, being handed to n2, is drawn %q", c)
	}
	if c := got["2"]; c == nil || c[0] != "h1 moving" || !strings.Contains(c[4], "handed over by n1") {
		t.Errorf("bucket 2, handed to n2 and not taken up, is drawn %q", c)
	}
	if !strings.Contains(page, `<span id="moving">2</span> moving`) {
		t.Errorf("the summary does not count 2 moving:\n%s", page)
	}
}
