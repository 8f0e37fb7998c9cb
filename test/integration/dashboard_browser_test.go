package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/internal/patience"
	"github.com/flotilla-dev/flotilla/internal/testenv"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// browserWithin bounds each wait for the page to show a change of the fleet.
// The page itself updates every second; the rest is the fleet's own time (a
// bucket lease TTL before a dead node's buckets pass on) on a loaded host.
const browserWithin = 45 * time.Second

// screenshotDirEnv names a directory to keep the browser test's screenshots
// in; by default they go to a new temporary directory, named in the log.
const screenshotDirEnv = "FLOTILLA_SCREENSHOTS"

// uiToken signs the test's operator in to `worker ui`.
const uiTestToken = "browser-test-token-0123456789"

// The browser's window, and the screenshots' width.
const windowWidth, windowHeight = 1280, 900

func findBrowser(t *testing.T) string {
	t.Helper()
	path, err := testenv.Browser()
	if err != nil {
		// Not a skip: the dashboard's behaviour in a browser is part of
		// what this suite checks. .ci/run installs Chromium when it is
		// missing, and make test says so before it starts.
		t.Fatal(err)
	}
	return path
}

// browser starts a headless Chromium with a fresh profile and returns a
// context to drive it with chromedp. The browser ends with the test.
func browser(t *testing.T) context.Context {
	t.Helper()
	path := findBrowser(t)
	profile := t.TempDir()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.UserDataDir(profile),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(windowWidth, windowHeight),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	// Registered after TempDir: the browser ends before its profile is
	// removed.
	t.Cleanup(func() { cancel(); cancelAlloc() })
	// The first run starts the browser, which lives as long as that run's
	// context: it gets no timeout of its own (the test's bounds it).
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("the browser %s did not start: %v", path, err)
	}
	return ctx
}

// screenshots saves full-page screenshots where a reader can find them.
type screenshots struct {
	t   *testing.T
	dir string
}

func newScreenshots(t *testing.T) *screenshots {
	t.Helper()
	dir := os.Getenv(screenshotDirEnv)
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "flotilla-dashboard-"); err != nil {
			t.Fatal(err)
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots in %s", dir)
	return &screenshots{t: t, dir: dir}
}

func (s *screenshots) take(ctx context.Context, name string) {
	s.t.Helper()
	// The whole page, at the window's width: the viewport is stretched to
	// the page's height for the capture (a capture beyond the viewport came
	// out at other sizes now and then), and set back after it.
	height, err := chromedp.Run(ctx, chromedp.Evaluate[int64](`document.documentElement.scrollHeight`))
	if err != nil {
		s.t.Fatalf("screenshot %s: %v", name, err)
	}
	if _, err := chromedp.Run(ctx, chromedp.EmulateViewport(windowWidth, max(height, windowHeight))); err != nil {
		s.t.Fatalf("screenshot %s: %v", name, err)
	}
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		s.t.Fatalf("screenshot %s: %v", name, err)
	}
	if _, err := chromedp.Run(ctx, chromedp.EmulateViewport(windowWidth, windowHeight)); err != nil {
		s.t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(s.dir, name+".png"), png, 0o644); err != nil {
		s.t.Fatal(err)
	}
}

// run runs browser actions with a deadline of their own.
func run(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	actx, cancel := context.WithTimeout(ctx, patience.Scale(browserWithin))
	defer cancel()
	for i, a := range actions {
		if _, err := chromedp.Run(actx, a); err != nil {
			dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			page, _ := chromedp.Run(dctx, chromedp.Evaluate[string](`location.href + "\n" + document.body.innerText`))
			t.Fatalf("%s, step %d: %v; the page:\n%s", what, i+1, err, page)
		}
	}
}

// evalUntil evaluates js in the page until check accepts its result.
func evalUntil[T any](t *testing.T, ctx context.Context, what, js string, check func(T) bool) T {
	t.Helper()
	var got T
	var lastErr error
	ok := poll(browserWithin, func() bool {
		ectx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		got, lastErr = chromedp.Run(ectx, chromedp.Evaluate[T](js))
		return lastErr == nil && check(got)
	})
	if !ok {
		t.Fatalf("%s: not within %v; last %v (error %v)", what, browserWithin, got, lastErr)
	}
	return got
}

// signInAs signs in to the dashboard at base as name, and waits for the
// fleet page's element shown.
func signInAs(t *testing.T, ctx context.Context, base, name, shown string) {
	t.Helper()
	run(t, ctx, "sign in",
		chromedp.Navigate(base+"/login"),
		chromedp.WaitVisible(chromedp.CSS("#name")),
		chromedp.SendKeys(chromedp.CSS("#name"), name),
		chromedp.SendKeys(chromedp.CSS("#token"), uiTestToken),
		chromedp.Click(chromedp.CSS("#signin")),
		chromedp.WaitVisible(chromedp.CSS(shown)),
	)
}

var dashboardAddr = regexp.MustCompile(`serving the dashboard\s+\{"addr": "([^"]+)"`)

// startUI starts `worker ui` on a free port and returns its base URL.
func startUI(t *testing.T, f *fleet) string {
	t.Helper()
	p := startBinaryWithEnv(t, workerBinary, f.dsn, []string{"FLOTILLA_UI_TOKEN=" + uiTestToken}, "ui", "--listen", "127.0.0.1:0")
	var addr string
	if !poll(startWithin, func() bool {
		m := dashboardAddr.FindStringSubmatch(p.output())
		if m != nil {
			addr = m[1]
		}
		return m != nil || p.exited()
	}) || addr == "" {
		t.Fatalf("worker ui did not start serving:\n%s", p.output())
	}
	return "http://" + addr
}

// TestDashboardInABrowser drives the dashboard of a real fleet, two `worker
// run` processes on PostgreSQL and a `worker ui`, from headless Chromium:
// the bucket map shows both holders; a running task stopped from its page
// shows its trail ending in stopped; a node killed with SIGKILL shows its
// buckets change colour as the other takes them over.
func TestDashboardInABrowser(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	f := newFleet(t)
	shots := newScreenshots(t)
	alphaSet, all := mustSet(t, "0-31"), mustSet(t, fmt.Sprintf("0-%d", fleetBuckets-1))
	betaOwn := mustSet(t, fmt.Sprintf("32-%d", fleetBuckets-1))
	alpha := f.worker("run", "--node-id", "alpha", "--buckets", alphaSet.String(), "--bucket-lease-ttl", leaseTTL(3*time.Second).String(), "--no-balance")
	f.waitUntilHeld("alpha", alphaSet, startWithin)
	f.worker("run", "--node-id", "beta", "--buckets", all.String(), "--bucket-lease-ttl", leaseTTL(3*time.Second).String(), "--no-balance")
	f.waitUntilHeld("beta", betaOwn, startWithin)
	f.waitUntilStandingBy("beta", alphaSet)
	base := startUI(t, f)
	ctx := browser(t)

	// Sign in: the pages and actions need the token, and the trail names
	// the operator.
	signInAs(t, ctx, base, "operator", "#buckets")
	holders := evalUntil(t, ctx, "the bucket map shows both holders",
		`Array.from(document.querySelectorAll('#buckets a.b')).map(a => a.dataset.holder)`,
		func(hs []string) bool { return slices.Contains(hs, "alpha") && slices.Contains(hs, "beta") })
	if len(holders) != fleetBuckets {
		t.Errorf("the map has %d buckets, want %d", len(holders), fleetBuckets)
	}
	shots.take(ctx, "fleet")

	// A running task, stopped from its page.
	key := keyIn(t, f.policy, betaOwn, "browser")
	id := f.submit("--kind", "sleep", "--key", key, "--payload", `{"duration":"1h"}`)
	f.waitForTask(id, "running", func(tk *task.Task) bool { return tk.Status == task.Running })
	run(t, ctx, "open the running task",
		chromedp.Navigate(fmt.Sprintf("%s/tasks/%d", base, id)),
		chromedp.WaitVisible(chromedp.CSS("#stop")),
	)
	evalUntil(t, ctx, "the task page shows it running", `document.querySelector('#status').textContent`,
		func(s string) bool { return s == "running" })
	run(t, ctx, "press Stop", chromedp.Click(chromedp.CSS("#stop")), chromedp.WaitVisible(chromedp.CSS("#ack")))
	evalUntil(t, ctx, "the trail ends in stopped",
		`Array.from(document.querySelectorAll('#trail li')).map(li => li.dataset.to)`,
		func(to []string) bool { return len(to) > 0 && to[len(to)-1] == "stopped" })
	ack := evalUntil(t, ctx, "the stop's acknowledgement is shown", `document.querySelector('#ack').textContent`,
		func(s string) bool { return strings.Contains(s, "acknowledged by") })
	if !strings.Contains(ack, "ui:operator") {
		t.Errorf("the acknowledgement %q does not name the operator", ack)
	}
	trail := evalUntil(t, ctx, "the trail names the operator", `document.querySelector('#trail').textContent`,
		func(string) bool { return true })
	if !strings.Contains(trail, "stop requested by ui:operator") {
		t.Errorf("the trail does not say who stopped the task:\n%s", trail)
	}
	if got := f.mustGet(id).Task.Status; got != task.Stopped {
		t.Errorf("the database has task %d %s, want stopped", id, got)
	}
	shots.take(ctx, "task-stopped")

	// kill -9 alpha: its buckets change colour on the live map as beta
	// takes them over.
	const colourOf = `getComputedStyle(document.querySelector('#buckets [data-bucket="0"]')).backgroundColor`
	run(t, ctx, "open the fleet page", chromedp.Navigate(base+"/fleet"), chromedp.WaitVisible(chromedp.CSS("#buckets")))
	before := evalUntil(t, ctx, "bucket 0's colour", colourOf, func(string) bool { return true })
	betaColour := evalUntil(t, ctx, "beta's colour",
		`getComputedStyle(document.querySelector('#buckets [data-holder="beta"]')).backgroundColor`, func(string) bool { return true })
	if before == betaColour {
		t.Fatalf("alpha's and beta's buckets have one colour, %s", before)
	}
	alpha.kill9()
	evalUntil(t, ctx, "bucket 0 changes colour to beta's", colourOf, func(c string) bool { return c != before && c == betaColour })
	evalUntil(t, ctx, "every bucket of alpha's is beta's",
		`Array.from(document.querySelectorAll('#buckets a.b')).filter(a => a.dataset.holder !== 'beta').length`,
		func(n int) bool { return n == 0 })
	shots.take(ctx, "fleet-after-kill")
	if errors.Is(ctx.Err(), context.Canceled) {
		t.Fatal("the browser ended early")
	}
}

var healthAddr = regexp.MustCompile(`serving health checks and metrics\s+\{"addr": "([^"]+)"`)

// TestWorkerRunServesMetricsAndTheDashboard: `worker run --http ADDR --ui`
// serves the health checks, Prometheus metrics whose figures match the
// database, and a read-only dashboard, from the node's own process.
func TestWorkerRunServesMetricsAndTheDashboard(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	f := newFleet(t)
	p := f.worker("run", "--node-id", "solo", "--http", "127.0.0.1:0", "--ui")
	f.waitUntilHeld("solo", mustSet(t, fmt.Sprintf("0-%d", fleetBuckets-1)), startWithin)
	var base string
	if !poll(startWithin, func() bool {
		if m := healthAddr.FindStringSubmatch(p.output()); m != nil {
			base = "http://" + m[1]
		}
		return base != ""
	}) {
		t.Fatalf("worker run did not log its --http address:\n%s", p.output())
	}
	id := f.submit("--kind", "noop", "--key", "k")
	f.waitForTask(id, "succeeded", succeeded)

	get := func(path string) (int, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), queryTimeout)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(body)
	}
	eventually(t, taskWithin, "/metrics counts the succeeded task", func() bool {
		status, body := get("/metrics")
		return status == http.StatusOK &&
			strings.Contains(body, `flotilla_transitions_total{from="running",to="succeeded"} 1`) &&
			strings.Contains(body, fmt.Sprintf("flotilla_buckets_held %d", fleetBuckets))
	})
	if status, body := get("/readyz"); status != http.StatusOK {
		t.Errorf("/readyz: %d %s", status, body)
	}
	status, body := get("/fleet")
	if status != http.StatusOK || !strings.Contains(body, `data-holder="solo"`) || !strings.Contains(body, "read-only") {
		t.Errorf("/fleet: %d, want the map held by solo, read-only\n%s", status, body)
	}
	if status, body := get(fmt.Sprintf("/tasks/%d", id)); status != http.StatusOK || !strings.Contains(body, "succeeded") {
		t.Errorf("the task's page: %d\n%s", status, body)
	}
}

// consoleStep is a script that fails, with a traceback on stderr, until
// the file fixed exists in dir, then succeeds: an operator's fix, then a
// retry.
func consoleStep(dir, name, batch string) []byte {
	script := fmt.Sprintf(`echo "%[2]s: reading batch"; if [ -e %[1]s/fixed ]; then echo "%[2]s: done"; exit 0; fi
echo 'Traceback (most recent call last):' >&2; echo '  File "etl.py", line 42, in %[2]s' >&2
printf 'processing 40%%%%\r80%%%%\r' >&2; echo 'KeyError: customer_id' >&2; exit 3`, dir, name)
	payload, _ := json.Marshal(map[string]any{"argv": []string{"sh", "-c", script}, "env": map[string]string{"BATCH": batch}})
	return payload
}

// TestConsoleFindsAndFixesAFailedPipelineStep drives the operator's console
// of a real fleet (`worker run` on PostgreSQL, `worker ui`) from headless
// Chromium: it signs in, follows the fleet page's failed count to a failed
// pipeline step, opens the pipeline's graph, reads the failed task's
// output, fixes the cause, retries from the step and watches the pipeline
// succeed; then it reviews and confirms a bulk retry of three failed tasks,
// each trail naming the operator. Screenshots of the fleet page, the
// pipeline and the failed task are kept (docs/images holds a set).
func TestConsoleFindsAndFixesAFailedPipelineStep(t *testing.T) {
	t.Parallel()
	needsIntegration(t)
	needsPostgres(t)
	f := newFleet(t)
	shots := newScreenshots(t)
	dir := t.TempDir()
	all := mustSet(t, fmt.Sprintf("0-%d", fleetBuckets-1))
	f.worker("run", "--node-id", "worker-eu-1", "--allow-exec", "sh", "--allow-exec-env", "BATCH", "--poll-interval", "200ms")
	f.waitUntilHeld("worker-eu-1", all, startWithin)
	base := startUI(t, f)

	exec := func(name, batch string) []byte { return consoleStep(dir, name, batch) }
	p, err := f.client.SubmitPipeline(t.Context(), flotilla.PipelineRequest{Name: "nightly-etl", Steps: []task.Step{
		{Name: "extract", Kind: "noop"},
		{Name: "transform", Kind: "exec", Payload: exec("transform", "etl"), MaxAttempts: 1, DependsOn: []task.Dependency{{Step: "extract"}}},
		{Name: "load", Kind: "noop", DependsOn: []task.Dependency{{Step: "transform"}}},
		{Name: "cleanup", Kind: "noop", DependsOn: []task.Dependency{{Step: "transform", On: task.OnFailure}}},
		{Name: "report", Kind: "noop", DependsOn: []task.Dependency{{Step: "load", On: task.OnAny}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	var batch []int64
	for i := range 3 {
		batch = append(batch, f.submit("--kind", "exec", "--key", fmt.Sprintf("import-%d", i), "--max-attempts", "1",
			"--payload", string(exec(fmt.Sprintf("import-%d", i), "nightly"))))
	}
	for _, id := range batch {
		f.waitForTask(id, "failed", func(tk *task.Task) bool { return tk.Status == task.Failed })
	}
	transform, _ := p.Step("transform")
	f.waitForTask(transform.Task.ID, "failed", func(tk *task.Task) bool { return tk.Status == task.Failed })

	ctx := browser(t)
	signInAs(t, ctx, base, "operator", "#kinds")
	// The fleet page counts the failures of the last hour by kind, from
	// the counts the node writes every few seconds.
	evalUntil(t, ctx, "the fleet page counts the exec failures",
		`(document.querySelector('#kinds tr[data-kind="exec"] a.failed-count') || {}).textContent || ""`,
		func(n string) bool { return n == "4" })
	shots.take(ctx, "console-fleet")
	run(t, ctx, "follow the failed count",
		chromedp.Evaluate[chromedp.Void](`document.querySelector('#kinds tr[data-kind="exec"] a.failed-count').click()`),
		chromedp.WaitVisible(chromedp.CSS("#tasks")),
	)
	run(t, ctx, "open the failed step's pipeline",
		chromedp.Evaluate[chromedp.Void](`Array.from(document.querySelectorAll('#tasks a.step')).find(a => a.textContent === 'transform').click()`),
		chromedp.WaitVisible(chromedp.CSS("#graph")),
	)
	states := evalUntil(t, ctx, "the graph shows each step's state",
		`Object.fromEntries(Array.from(document.querySelectorAll('#graph a.step-link')).map(a => [a.dataset.step, a.dataset.status]))`,
		func(m map[string]string) bool { return m["report"] == "skipped" && m["cleanup"] == "succeeded" })
	if states["transform"] != "failed" || states["load"] != "skipped" || states["extract"] != "succeeded" {
		t.Errorf("the graph shows %v", states)
	}
	why := evalUntil(t, ctx, "the skipped step says why",
		`document.querySelector('#steps tr[data-step="load"] .skip').textContent`, func(string) bool { return true })
	if why != "dependency transform ended failed; this step runs on success" {
		t.Errorf("load says %q", why)
	}
	shots.take(ctx, "console-pipeline")

	// The live page redraws its graph: the click is dispatched in the page
	// in one step, on the element there at that moment, rather than on a
	// node looked up a moment before and perhaps replaced since.
	run(t, ctx, "open the failed task",
		chromedp.Evaluate[chromedp.Void](`document.querySelector('#graph a.step-link[data-step="transform"] rect')`+
			`.dispatchEvent(new MouseEvent('click', {bubbles: true, cancelable: true, view: window}))`),
		chromedp.WaitVisible(chromedp.CSS("#stderr")),
	)
	stderr := evalUntil(t, ctx, "the failed task shows its stderr", `document.querySelector('#stderr').textContent`,
		func(s string) bool { return strings.Contains(s, "KeyError: customer_id") })
	if !strings.Contains(stderr, "Traceback") {
		t.Errorf("stderr shown: %q", stderr)
	}
	if masked := evalUntil(t, ctx, "the env value is masked", `document.querySelector('#payload').textContent`,
		func(string) bool { return true }); strings.Contains(masked, `"etl"`) {
		t.Errorf("the payload shows the env value unmasked:\n%s", masked)
	}
	shots.take(ctx, "console-task-failed")

	// The operator fixes the cause, then retries the pipeline from the step.
	if err := os.WriteFile(filepath.Join(dir, "fixed"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	run(t, ctx, "retry from the step",
		chromedp.Evaluate[chromedp.Void](`document.querySelector('#pipeline-link').click()`),
		chromedp.WaitVisible(chromedp.CSS("#retry-step")),
		chromedp.SetValue(chromedp.CSS("#retry-step"), "transform"),
		chromedp.Click(chromedp.CSS("#retry")),
		chromedp.WaitVisible(chromedp.CSS("#flash")),
	)
	evalUntil(t, ctx, "the pipeline succeeds", `document.querySelector('#pipeline-status').textContent`,
		func(s string) bool { return s == "succeeded" })
	shots.take(ctx, "console-pipeline-retried")
	after, err := f.client.GetPipeline(t.Context(), p.ID)
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := after.Step("transform"); s.Tries != 2 || s.Task.Status != task.Succeeded {
		t.Errorf("transform after the retry: %s after %d tries", s.Task.Status, s.Tries)
	}
	if r := f.mustGet(mustStep(t, after, "transform").Task.ID); !strings.Contains(r.Events[0].Reason, "(step transform) by ui:operator") {
		t.Errorf("the retried step's trail begins %q", r.Events[0].Reason)
	}

	// Bulk: the three failed imports of batch "nightly", by a filter.
	run(t, ctx, "filter the failed imports",
		chromedp.Navigate(base+"/tasks?kind=exec&state=failed"),
		chromedp.WaitVisible(chromedp.CSS("#bulk-form")),
		chromedp.SendKeys(chromedp.CSS(`input[name="payload"]`), `{"env": {"BATCH": "nightly"}, "argv": ["sh"]}`),
		chromedp.Click(chromedp.CSS("#filter")),
	)
	// The filtered list is a new page with the same form: wait until it
	// is the one shown, or the next step may act on the page it replaced.
	evalUntil(t, ctx, "the filtered list is shown",
		`location.search.includes('payload=') && document.readyState === 'complete'`, func(b bool) bool { return b })
	run(t, ctx, "the filtered list's bulk form", chromedp.WaitVisible(chromedp.CSS("#bulk-review")))
	run(t, ctx, "review the bulk retry",
		chromedp.SetValue(chromedp.CSS("#bulk-action"), "retry"),
		chromedp.Click(chromedp.CSS("#bulk-review")),
		chromedp.WaitVisible(chromedp.CSS("#bulk-count")),
	)
	count := evalUntil(t, ctx, "the review counts the failed tasks", `document.querySelector('#bulk-count').textContent`,
		func(string) bool { return true })
	if !strings.Contains(count, "3 of the 3 tasks") {
		t.Fatalf("the review says %q, want the 3 failed imports", count)
	}
	run(t, ctx, "confirm the bulk retry",
		chromedp.Click(chromedp.CSS("#bulk-confirm")),
		chromedp.WaitVisible(chromedp.CSS("#flash")),
	)
	notice := evalUntil(t, ctx, "the notice", `document.querySelector('#flash').textContent`, func(string) bool { return true })
	if !strings.Contains(notice, "bulk retry by ui:operator: 3 of 3 tasks") {
		t.Errorf("the notice says %q", notice)
	}
	for _, id := range batch {
		r := f.mustGet(id)
		if r.Task.Status != task.Failed {
			t.Errorf("task %d is %s: a retry leaves the old task as it ended", id, r.Task.Status)
		}
		retries, err := f.client.Store().TaskRetries(t.Context(), id)
		if err != nil || retries.As == nil || retries.As.By != "ui:operator" {
			t.Fatalf("task %d's retry links: %+v %v", id, retries, err)
		}
		fresh := f.waitForTask(retries.As.RetryID, "succeeded", succeeded)
		if !strings.Contains(fresh.Events[0].Reason, fmt.Sprintf("retry of task %d by ui:operator: bulk retry", id)) {
			t.Errorf("task %d's retry's trail begins %q", retries.As.RetryID, fresh.Events[0].Reason)
		}
	}
}

func mustStep(t *testing.T, p store.Pipeline, name string) store.PipelineStep {
	t.Helper()
	s, ok := p.Step(name)
	if !ok {
		t.Fatalf("pipeline %d has no step %s", p.ID, name)
	}
	return s
}
