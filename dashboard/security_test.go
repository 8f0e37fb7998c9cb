package dashboard

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

var (
	formTag         = regexp.MustCompile(`(?s)<form method="post" action="([^"]*)"[^>]*>(.*?)</form>`)
	hiddenField     = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)
	scheduleRowHTML = regexp.MustCompile(`(?s)<tr data-schedule="([^"]*)">(.*?)</tr>`)
	hrefAttr        = regexp.MustCompile(`href="([^"]*)"`)
)

// submit posts a form of page at pageURL as a browser would: its action
// resolved against the page's address (dot segments removed), with its
// hidden fields.
func (b *testBundle) submit(pageURL, action, body string) (int, string, *url.URL) {
	b.t.Helper()
	base, _ := url.Parse(b.srv.URL + pageURL)
	ref, err := url.Parse(html.UnescapeString(action))
	if err != nil {
		b.t.Fatalf("form action %q: %v", action, err)
	}
	target := base.ResolveReference(ref)
	form := url.Values{}
	for _, m := range hiddenField.FindAllStringSubmatch(body, -1) {
		form.Set(html.UnescapeString(m[1]), html.UnescapeString(m[2]))
	}
	status, page, _ := b.post(strings.TrimPrefix(target.String(), b.srv.URL), form)
	return status, page, target
}

// TestASchedulesNameNeverBecomesAnotherAddress: a schedule's name is any
// text, and a name such as "../tasks/1/stop?" must not turn its Pause button
// into a stop of task 1 in the operator's name; "a/b", "..", "." and names
// with '?' and '#' are paused as themselves. Every link made from a name
// leads to the list filtered by exactly that name.
func TestASchedulesNameNeverBecomesAnotherAddress(t *testing.T) {
	b := setup(t, testToken)
	victim := b.create(store.NewTask{Key: "k", Bucket: 1})[0]
	names := []string{fmt.Sprintf("../tasks/%d/stop?", victim.ID), "a/b", "..", ".", "x?y#z&w=1", "%2e%2e", " spaced "}
	for i, n := range names {
		if _, err := b.store.UpsertSchedule(b.ctx, store.Schedule{Name: n, Spec: "@every 1h", Kind: "noop", Bucket: i % testBuckets,
			Enabled: true, NextFireAt: time.Now().Add(time.Hour)}, store.UpsertCreate); err != nil {
			t.Fatalf("schedule %q: %v", n, err)
		}
	}
	b.login("alice")
	_, page, _ := b.get("/schedules")
	rows := scheduleRowHTML.FindAllStringSubmatch(page, -1)
	if len(rows) != len(names) {
		t.Fatalf("%d schedule rows, want %d:\n%s", len(rows), len(names), page)
	}
	for _, row := range rows {
		name := html.UnescapeString(row[1])
		for _, m := range hrefAttr.FindAllStringSubmatch(row[2], -1) {
			u, _ := url.Parse(b.srv.URL + "/schedules")
			link := u.ResolveReference(mustParse(t, html.UnescapeString(m[1])))
			if link.Path != "/tasks" || link.Query().Get("schedule") != name {
				t.Errorf("schedule %q links to %s, want /tasks filtered by its name", name, link)
			}
		}
		form := formTag.FindStringSubmatch(row[2])
		if form == nil {
			t.Fatalf("schedule %q has no form", name)
		}
		status, body, target := b.submit("/schedules", form[1], form[2])
		if status != http.StatusSeeOther {
			t.Errorf("pausing %q posted to %s: %d\n%s", name, target.Path, status, body)
			continue
		}
		sc, err := b.store.GetSchedule(b.ctx, name)
		if err != nil || sc.Enabled {
			t.Errorf("after its Pause, schedule %q is enabled=%v (%v), posted to %s", name, sc.Enabled, err, target.Path)
		}
	}
	if got := b.status(victim.ID); got != task.Queued {
		t.Errorf("task %d is %s after schedules were paused, want queued: a name became a stop", victim.ID, got)
	}
}

func mustParse(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return u
}

// TestSignOutEndsTheSessionOnTheServer: a copy of the session cookie, taken
// before signing out, signs in nobody afterwards; sessions also end after
// SessionIdle unused, and SessionMaxAge in all.
func TestSignOutEndsTheSessionOnTheServer(t *testing.T) {
	b := setup(t, testToken, func(c *Config) { c.SessionIdle, c.SessionMaxAge = time.Hour, 3*time.Hour })
	clock := time.Now()
	b.dash.now = func() time.Time { return clock }
	tk := b.create(store.NewTask{Key: "k", Bucket: 1})[0]
	csrf := b.login("alice")
	u, _ := url.Parse(b.srv.URL)
	var stolen *http.Cookie
	for _, c := range b.http.Jar.Cookies(u) {
		if c.Name == sessionCookie {
			stolen = c
		}
	}
	if stolen == nil {
		t.Fatal("no session cookie after signing in")
	}
	if status, _, _ := b.post("/logout", url.Values{"csrf": {csrf}}); status != http.StatusSeeOther {
		t.Fatalf("sign-out: %d", status)
	}
	thief := setupClient(b)
	thief.http.Jar.SetCookies(u, []*http.Cookie{{Name: sessionCookie, Value: stolen.Value, Path: "/"}})
	if status, _, h := thief.get("/fleet"); status != http.StatusSeeOther || h.Get("Location") != "/login" {
		t.Errorf("a page with the signed-out cookie: %d to %q, want the sign-in", status, h.Get("Location"))
	}
	if status, _, _ := thief.post(fmt.Sprintf("/tasks/%d/stop", tk.ID), url.Values{"csrf": {csrf}}); status != http.StatusUnauthorized {
		t.Errorf("a stop with the signed-out cookie and its CSRF token: %d, want 401", status)
	}
	if got := b.status(tk.ID); got != task.Queued {
		t.Errorf("the task is %s, want queued", got)
	}

	// Idle: used 59 minutes apart it lives; an hour unused ends it.
	b.login("bob")
	clock = clock.Add(59 * time.Minute)
	if status, _, _ := b.get("/fleet"); status != http.StatusOK {
		t.Fatalf("a session used within its idle time: %d", status)
	}
	clock = clock.Add(time.Hour)
	if status, _, _ := b.get("/fleet"); status != http.StatusSeeOther {
		t.Errorf("a session an hour unused: %d, want a redirect to the sign-in", status)
	}
	// Max age: used every 50 minutes, it still ends 3 hours after sign-in.
	b.login("carol")
	for range 3 {
		clock = clock.Add(50 * time.Minute)
		if status, _, _ := b.get("/fleet"); status != http.StatusOK {
			t.Fatalf("a session in use before its max age: %d", status)
		}
	}
	clock = clock.Add(31 * time.Minute)
	if status, _, _ := b.get("/fleet"); status != http.StatusSeeOther {
		t.Errorf("a session past its max age: %d, want a redirect to the sign-in", status)
	}
}

// TestNoticesComeFromTheServerOnly: no address puts text in the notice box.
func TestNoticesComeFromTheServerOnly(t *testing.T) {
	b := setup(t, testToken)
	tk := b.create(store.NewTask{Key: "k", Bucket: 1})[0]
	b.login("alice")
	const forged = "Your token expired: sign in again at evil.example"
	for _, path := range []string{fmt.Sprintf("/tasks/%d?done=%s", tk.ID, url.QueryEscape(forged)),
		"/schedules?done=" + url.QueryEscape(forged), "/fleet?flash=" + url.QueryEscape(forged),
		"/tasks?done=" + url.QueryEscape(forged)} {
		status, page, _ := b.get(path)
		if status != http.StatusOK || strings.Contains(page, "evil.example") || strings.Contains(page, `id="flash"`) {
			t.Errorf("GET %s: %d, shows text from the address:\n%s", path, status, page)
		}
	}
}

// sseField is one field of an event stream as the HTML standard's parser
// reads it: lines end at CR LF, LF or CR, each "name: value".
type sseField struct{ name, value string }

func parseEventStream(t *testing.T, raw string) (fields []sseField, events map[string][]string) {
	t.Helper()
	events = map[string][]string{}
	var data []string
	event := ""
	lines := regexp.MustCompile("\r\n|\r|\n").Split(raw, -1)
	for _, line := range lines {
		if line == "" {
			if data != nil {
				name := event
				if name == "" {
					name = "message"
				}
				events[name] = append(events[name], strings.Join(data, "\n"))
			}
			data, event = nil, ""
			continue
		}
		name, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		fields = append(fields, sseField{name, value})
		switch name {
		case "data":
			data = append(data, value)
		case "event":
			event = value
		}
	}
	return fields, events
}

// TestTheLiveStreamEncodesEveryLineEnding: an error with a bare CR (a
// progress bar on stderr), CR LF or LF in it reaches the browser as the
// same text, and never as a field of its own.
func TestTheLiveStreamEncodesEveryLineEnding(t *testing.T) {
	b := setup(t, "")
	tk := b.running(3)
	const errText = "50%\rretry: 1\rdata: <b>forged</b>\r\nevent: fleet-live\nid: 9\r\rdone"
	if out, err := b.store.AdvanceActive(b.ctx, "n1/x", []store.ActiveTransition{{Ref: tk.Ref(), To: task.Failed,
		Error: errText, Node: "n1"}}); err != nil || out[0].Err != nil {
		t.Fatal(err, out)
	}
	_, raw, _ := b.get(fmt.Sprintf("/tasks/%d/live", tk.ID))
	fields, events := parseEventStream(t, raw)
	for _, f := range fields {
		if f.name != "event" && f.name != "data" {
			t.Errorf("the stream carries a %q field (%q): a line ending inside the data split it", f.name, f.value)
		}
	}
	for name := range events {
		if name != "task-live" && name != "task-trail" {
			t.Errorf("the stream carries an event %q", name)
		}
	}
	if len(events["task-live"]) == 0 {
		t.Fatalf("no task-live event in:\n%q", raw)
	}
	want := html.EscapeString(strings.NewReplacer("\r\n", "\n", "\r", "\n").Replace(errText))
	if got := events["task-live"][0]; !strings.Contains(got, want) {
		t.Errorf("the error does not reach the browser whole: want %q within\n%q", want, got)
	}
}

func TestSSEEventSplitsAtEveryLineEnding(t *testing.T) {
	for _, c := range []struct{ data, want string }{
		{"a", "event: e\ndata: a\n\n"},
		{"a\nb", "event: e\ndata: a\ndata: b\n\n"},
		{"a\rb", "event: e\ndata: a\ndata: b\n\n"},
		{"a\r\nb", "event: e\ndata: a\ndata: b\n\n"},
		{"a\n\rb", "event: e\ndata: a\ndata: \ndata: b\n\n"},
		{"a\r", "event: e\ndata: a\ndata: \n\n"},
		{"", "event: e\ndata: \n\n"},
	} {
		if got := string(sseEvent("e\r\n", c.data)); got != c.want {
			t.Errorf("sseEvent(%q) = %q, want %q", c.data, got, c.want)
		}
	}
}

// TestReadingNeedsSignInWhenATokenIsSet: with a token, every page and
// stream needs a session (AuthAll, the default), and payloads reach nobody
// else; under AuthActions reading is open, and the pages say so.
func TestReadingNeedsSignInWhenATokenIsSet(t *testing.T) {
	const secret = "argv-secret-4711"
	paths := func(b *testBundle) []string {
		tk := b.create(store.NewTask{Kind: "exec", Key: "k", Bucket: 1, Payload: json.RawMessage(`{"argv":["/bin/echo","` + secret + `"]}`)})[0]
		return []string{"/", "/fleet", "/tasks", fmt.Sprintf("/tasks/%d", tk.ID), "/pipelines", "/schedules",
			"/tasks/bulk?state=queued&action=stop"}
	}
	b := setup(t, testToken)
	for _, path := range paths(b) {
		status, body, h := b.get(path)
		if status != http.StatusSeeOther || h.Get("Location") != "/login" || strings.Contains(body, secret) {
			t.Errorf("GET %s without a session: %d to %q, want a redirect to the sign-in", path, status, h.Get("Location"))
		}
	}
	for _, path := range []string{"/fleet/live", "/tasks/1/live", "/pipelines/1/live"} {
		if status, body, _ := b.get(path); status != http.StatusUnauthorized || strings.Contains(body, secret) {
			t.Errorf("GET %s without a session: %d, want 401", path, status)
		}
	}
	for _, path := range []string{"/login", "/static/app.js", "/static/app.css"} {
		if status, _, _ := b.get(path); status != http.StatusOK {
			t.Errorf("GET %s without a session: %d, want it served", path, status)
		}
	}
	b.login("alice")
	if status, body, _ := b.get("/tasks/1"); status != http.StatusOK || !strings.Contains(body, secret) {
		t.Errorf("the task's page, signed in: %d", status)
	}

	open := setup(t, testToken, func(c *Config) { c.Auth = AuthActions })
	for _, path := range paths(open) {
		status, body, _ := open.get(path)
		if path == "/" {
			continue
		}
		if status != http.StatusOK || !strings.Contains(body, `id="open-read"`) {
			t.Errorf("GET %s under AuthActions: %d, want the page with the open-reading banner", path, status)
		}
	}
	if _, err := New(context.Background(), Config{Store: b.store, Auth: AuthActions}); err == nil {
		t.Error("Auth without a token: no error")
	}
	if _, err := ParseAuthMode("some"); err == nil || !strings.Contains(err.Error(), `"all"`) {
		t.Errorf("ParseAuthMode(some): %v, want an error naming the modes", err)
	}
}

// signIn posts a sign-in from addr through the handler itself, so that the
// test chooses the peer's address.
func signIn(d *Server, addr, token string, header ...string) *httptest.ResponseRecorder {
	form := url.Values{"name": {"alice"}, "token": {token}}
	req := httptest.NewRequest(http.MethodPost, "/login", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	req.RemoteAddr = addr
	w := httptest.NewRecorder()
	d.ServeHTTP(w, req)
	return w
}

// TestSignInIsLimitedPerAddressAndOverall: wrong tokens from one address
// are answered 429 after a few, for twice as long each time, and logged a
// few lines in all; many addresses together are held to the overall rate;
// the wait ends on the clock.
func TestSignInIsLimitedPerAddressAndOverall(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	b := setup(t, testToken, func(c *Config) { c.Logger = zap.New(core) })
	clock := time.Now()
	b.dash.now = func() time.Time { return clock }
	const attacker = "203.0.113.5:4000"
	codes := map[int]int{}
	for range 200 {
		w := signIn(b.dash, attacker, "wrong-token-wrong-token")
		codes[w.Code]++
		if w.Code == http.StatusTooManyRequests && w.Header().Get("Retry-After") == "" {
			t.Fatal("a 429 without Retry-After")
		}
	}
	if codes[http.StatusUnauthorized] != signInFreeFailures+1 || codes[http.StatusTooManyRequests] != 200-signInFreeFailures-1 {
		t.Errorf("200 wrong tokens from one address at once: %v, want %d refused as wrong, then 429", codes, signInFreeFailures+1)
	}
	if n := logs.FilterMessageSnippet("sign-in refused").Len(); n > signInLogBurst {
		t.Errorf("%d log lines for the refusals, want at most %d", n, signInLogBurst)
	}
	if w := signIn(b.dash, attacker, testToken); w.Code != http.StatusTooManyRequests {
		t.Errorf("the right token while the address waits: %d, want 429", w.Code)
	}
	if w := signIn(b.dash, "198.51.100.9:1", testToken); w.Code != http.StatusSeeOther {
		t.Errorf("another address meanwhile: %d, want signed in", w.Code)
	}
	clock = clock.Add(signInFirstBlock + time.Millisecond)
	if w := signIn(b.dash, attacker, testToken); w.Code != http.StatusSeeOther {
		t.Errorf("the right token once the wait is over: %d, want signed in", w.Code)
	}

	// Overall: a burst from many addresses, then one a second.
	b2 := setup(t, testToken)
	b2.dash.now = func() time.Time { return clock }
	refused := 0
	for i := range signInBurst + 10 {
		if w := signIn(b2.dash, fmt.Sprintf("192.0.2.%d:1", i), "wrong-token-wrong-token"); w.Code == http.StatusTooManyRequests {
			refused++
		}
	}
	if refused != 10 {
		t.Errorf("%d tries from as many addresses at once: %d refused, want the 10 past the burst of %d", signInBurst+10, refused, signInBurst)
	}
	clock = clock.Add(time.Second)
	if w := signIn(b2.dash, "192.0.2.250:1", testToken); w.Code != http.StatusSeeOther {
		t.Errorf("a try a second later: %d, want signed in", w.Code)
	}
}

// TestTheCookieIsSecureBehindATrustedProxy: X-Forwarded-Proto and
// X-Forwarded-For count from the configured proxies only.
func TestTheCookieIsSecureBehindATrustedProxy(t *testing.T) {
	b := setup(t, testToken, func(c *Config) { c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")} })
	secure := func(w *httptest.ResponseRecorder) bool {
		for _, c := range w.Result().Cookies() {
			if c.Name == sessionCookie {
				return c.Secure
			}
		}
		t.Fatalf("no session cookie: %d", w.Code)
		return false
	}
	if !secure(signIn(b.dash, "10.1.2.3:5000", testToken, "X-Forwarded-Proto", "https")) {
		t.Error("behind a trusted proxy that says https, the cookie is not Secure")
	}
	if secure(signIn(b.dash, "192.0.2.1:5000", testToken, "X-Forwarded-Proto", "https")) {
		t.Error("a client that says https itself gets a Secure cookie over plain HTTP")
	}
	if secure(signIn(b.dash, "10.1.2.3:5000", testToken)) {
		t.Error("behind a trusted proxy that says nothing, the cookie is Secure")
	}
	// The limit counts the client the proxy names, not the proxy.
	for range signInFreeFailures + 1 {
		signIn(b.dash, "10.1.2.3:5000", "wrong-token-wrong-token", "X-Forwarded-For", "203.0.113.7")
	}
	if w := signIn(b.dash, "10.1.2.3:5000", testToken, "X-Forwarded-For", "203.0.113.7"); w.Code != http.StatusTooManyRequests {
		t.Errorf("the guessing client behind the proxy: %d, want 429", w.Code)
	}
	if w := signIn(b.dash, "10.1.2.3:5000", testToken, "X-Forwarded-For", "203.0.113.8"); w.Code != http.StatusSeeOther {
		t.Errorf("another client behind the same proxy: %d, want signed in", w.Code)
	}
	// A forged hop before the proxy's own is the client's to write.
	if w := signIn(b.dash, "10.1.2.3:5000", testToken, "X-Forwarded-For", "198.51.100.1, 203.0.113.7"); w.Code != http.StatusTooManyRequests {
		t.Errorf("the guessing client naming another address first: %d, want 429", w.Code)
	}
}

// countingStore counts the reads of one task.
type countingStore struct {
	store.Store
	mu    sync.Mutex
	reads int
}

func (c *countingStore) GetTask(ctx context.Context, id int64) (*task.Task, error) {
	c.mu.Lock()
	c.reads++
	c.mu.Unlock()
	return c.Store.GetTask(ctx, id)
}

// TestViewersOfAPageShareOneReader: five viewers of one task's live page
// cost the store one reading per interval, not five.
func TestViewersOfAPageShareOneReader(t *testing.T) {
	b := setup(t, "")
	tk := b.create(store.NewTask{Key: "k", Bucket: 1})[0]
	counting := &countingStore{Store: b.store}
	d, err := New(b.ctx, Config{Store: counting, LiveInterval: 40 * time.Millisecond, LiveFor: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d)
	t.Cleanup(func() { d.Close(); srv.Close() })
	const viewers = 5
	events := make([]int, viewers)
	var wg sync.WaitGroup
	for i := range viewers {
		wg.Go(func() {
			resp, err := http.Get(fmt.Sprintf("%s/tasks/%d/live", srv.URL, tk.ID))
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				if sc.Text() == "event: task-live" {
					events[i]++
				}
			}
		})
	}
	wg.Wait()
	counting.mu.Lock()
	reads := counting.reads
	counting.mu.Unlock()
	total := 0
	for _, n := range events {
		total += n
	}
	if reads == 0 || total < 2*reads {
		t.Errorf("%d viewers received %d renderings from %d reads of the task: want each reading shared (at least twice as many renderings)",
			viewers, total, reads)
	}
	t.Logf("%d viewers, %v renderings each, %d reads", viewers, events, reads)
}
