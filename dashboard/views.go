package dashboard

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// holderColours is the number of colours of the bucket map; nodes past it
// share colours.
const holderColours = 12

var funcs = template.FuncMap{
	"ts": func(t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		return t.UTC().Format("2006-01-02 15:04:05.000Z")
	},
	"pretty": func(raw json.RawMessage) string {
		if len(raw) == 0 {
			return ""
		}
		var buf bytes.Buffer
		if err := json.Indent(&buf, raw, "", "  "); err != nil {
			return string(raw)
		}
		return buf.String()
	},
	"dur": func(d time.Duration) string {
		if d == 0 {
			return "none"
		}
		return d.String()
	},
}

func parsePages() (map[string]*template.Template, error) {
	names, err := fs.Glob(templateFiles, "templates/*.html")
	if err != nil {
		return nil, err
	}
	pages := map[string]*template.Template{}
	for _, f := range names {
		name := strings.TrimSuffix(strings.TrimPrefix(f, "templates/"), ".html")
		if name == "layout" {
			continue
		}
		t, err := template.New(name).Funcs(funcs).ParseFS(templateFiles, "templates/layout.html", f)
		if err != nil {
			return nil, fmt.Errorf("dashboard template %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

// fleetView is the bucket map and the nodes.
type fleetView struct {
	Buckets []bucketCell
	Nodes   []nodeRow
	Unheld  int
	Moving  int // buckets in a hand-off
	Queued  int
	Waiting int
	Running int
	At      time.Time
}

type bucketCell struct {
	flotilla.BucketReport
	Class string // the holder's colour, or "free"
	Title string // what a hover shows
}

type nodeRow struct {
	store.NodeInfo
	Class   string
	Held    int
	Kinds   string
	HeldSet string
}

// fleet reads the fleet's view, or returns the one read less than
// LiveInterval ago: every open fleet page asks for it each LiveInterval, and
// they share one reading.
func (s *Server) fleet(ctx context.Context) (fleetView, error) {
	s.cache.mu.Lock()
	defer s.cache.mu.Unlock()
	if !s.cache.fleetAt.IsZero() && time.Since(s.cache.fleetAt) < s.cfg.LiveInterval {
		return s.cache.fleet, nil
	}
	v, err := s.readFleet(ctx)
	if err != nil {
		return fleetView{}, err
	}
	s.cache.fleet, s.cache.fleetAt = v, time.Now()
	return v, nil
}

// backlog is store.BucketBacklog, shared like the fleet's view: it counts
// the unfinished tasks on the partial indexes, which grows with the queue.
func (s *Server) backlog(ctx context.Context) ([]store.Backlog, error) {
	s.cache.mu.Lock()
	defer s.cache.mu.Unlock()
	return s.backlogLocked(ctx)
}

func (s *Server) backlogLocked(ctx context.Context) ([]store.Backlog, error) {
	if !s.cache.backlogAt.IsZero() && time.Since(s.cache.backlogAt) < s.cfg.LiveInterval {
		return s.cache.backlog, nil
	}
	bl, err := s.cfg.Store.BucketBacklog(ctx)
	if err != nil {
		return nil, err
	}
	s.cache.backlog, s.cache.backlogAt = bl, time.Now()
	return bl, nil
}

// readFleet reads the leases, the nodes and the backlog: what
// flotilla.Client.Buckets reports, with the shared backlog.
func (s *Server) readFleet(ctx context.Context) (fleetView, error) {
	nodes, err := s.cfg.Store.ListNodes(ctx)
	if err != nil {
		return fleetView{}, err
	}
	leases, err := s.cfg.Store.ListBuckets(ctx)
	if err != nil {
		return fleetView{}, err
	}
	backlog, err := s.backlogLocked(ctx)
	if err != nil {
		return fleetView{}, err
	}
	now, err := s.cfg.Store.Now(ctx)
	if err != nil {
		return fleetView{}, err
	}
	byBucket := map[int]store.Backlog{}
	for _, b := range backlog {
		byBucket[b.Bucket] = b
	}
	buckets := make([]flotilla.BucketReport, len(leases))
	for i, l := range leases {
		r := flotilla.BucketReport{Bucket: l.Bucket, Epoch: l.Epoch, Successor: l.Successor,
			HandoffSince: l.HandoffSince, HandedBy: l.HandedBy, Pin: l.Pin}
		if l.Holder != "" {
			r.Holder, r.ExpiresAt = l.Node, l.ExpiresAt
		}
		for _, n := range nodes {
			if n.Alive && n.Incarnation != l.Holder && n.Buckets.Contains(l.Bucket) {
				r.Standby = append(r.Standby, n.ID)
			}
		}
		bl := byBucket[l.Bucket]
		r.Queued, r.Waiting, r.Running = bl.Queued, bl.Waiting, bl.Active
		buckets[i] = r
	}
	// A node keeps its colour while it is registered: its place among the
	// registered nodes by id, so that a dead node's buckets change colour
	// when another takes them, and nobody else's do.
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].ID < nodes[j].ID })
	class := map[string]string{}
	v := fleetView{At: now}
	for i, n := range nodes {
		class[n.ID] = fmt.Sprintf("h%d", i%holderColours)
	}
	held := map[string][]int{}
	for _, b := range buckets {
		c := bucketCell{BucketReport: b, Class: "free"}
		if b.Holder != "" {
			c.Class = class[b.Holder]
			held[b.Holder] = append(held[b.Holder], b.Bucket)
		} else {
			v.Unheld++
		}
		if b.Successor != "" || b.HandedBy != "" {
			// A move in progress: its holder lets its tasks finish, or its
			// successor has yet to take it up.
			c.Class += " moving"
			v.Moving++
		}
		c.Title = bucketTitle(b)
		v.Queued += b.Queued
		v.Waiting += b.Waiting
		v.Running += b.Running
		v.Buckets = append(v.Buckets, c)
	}
	for _, n := range nodes {
		v.Nodes = append(v.Nodes, nodeRow{NodeInfo: n, Class: class[n.ID], Held: len(held[n.ID]),
			Kinds: strings.Join(n.Kinds, ", "), HeldSet: bucket.Of(held[n.ID]...).String()})
	}
	return v, nil
}

func bucketTitle(b flotilla.BucketReport) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "bucket %d\n", b.Bucket)
	if b.Holder == "" {
		sb.WriteString("held by nobody\n")
	} else {
		fmt.Fprintf(&sb, "held by %s\nepoch %d\nlease until %s\n", b.Holder, b.Epoch,
			b.ExpiresAt.UTC().Format("15:04:05.000Z"))
	}
	switch {
	case b.Successor != "":
		fmt.Fprintf(&sb, "moving to %s since %s\n", b.Successor, b.HandoffSince.UTC().Format("15:04:05.000Z"))
	case b.HandedBy != "":
		fmt.Fprintf(&sb, "handed over by %s\n", b.HandedBy)
	}
	if b.Pin != "" {
		fmt.Fprintf(&sb, "pinned to %s\n", b.Pin)
	}
	if len(b.Standby) > 0 {
		fmt.Fprintf(&sb, "standby: %s\n", strings.Join(b.Standby, ", "))
	}
	fmt.Fprintf(&sb, "queued %d, waiting %d, running %d", b.Queued, b.Waiting, b.Running)
	return sb.String()
}

func (s *Server) fleetPage(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := s.query(r)
	defer cancel()
	v, err := s.fleet(ctx)
	if err != nil {
		s.fail(w, r, statusOf(err), err)
		return
	}
	s.render(w, r, http.StatusOK, "fleet", page{Title: "Fleet", Nav: "fleet", Data: v})
}

func (s *Server) fleetLive(w http.ResponseWriter, r *http.Request) {
	s.live(w, r, "fleet", func(ctx context.Context) (any, error) { return s.fleet(ctx) })
}

// live streams a page's live fragment as server-sent events, every
// LiveInterval, for at most LiveFor.
func (s *Server) live(w http.ResponseWriter, r *http.Request, name string, view func(context.Context) (any, error)) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming is not supported here", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	flusher.Flush()
	end := time.NewTimer(s.cfg.LiveFor)
	defer end.Stop()
	tick := time.NewTicker(s.cfg.LiveInterval)
	defer tick.Stop()
	for {
		ctx, cancel := s.query(r)
		data, err := view(ctx)
		cancel()
		var buf bytes.Buffer
		if err == nil {
			err = s.pages[name].ExecuteTemplate(&buf, name+"-live", page{Data: data, Writable: s.cfg.Token != ""})
		}
		if err != nil {
			buf.Reset()
			fmt.Fprintf(&buf, `<p class="error">%s</p>`, template.HTMLEscapeString(redactSecrets(err.Error())))
		}
		var ev strings.Builder
		ev.WriteString("event: " + name + "\n")
		for _, line := range strings.Split(buf.String(), "\n") {
			ev.WriteString("data: " + strings.TrimRight(line, "\r") + "\n")
		}
		ev.WriteString("\n")
		if _, err := w.Write([]byte(ev.String())); err != nil {
			return
		}
		flusher.Flush()
		select {
		case <-r.Context().Done():
			return
		case <-s.closed:
			return
		case <-end.C:
			return
		case <-tick.C:
		}
	}
}

// tasksView is one page of the task list.
type tasksView struct {
	Filter  url.Values
	State   string
	States  []task.Status
	Tasks   []*task.Task
	Next    string // the next page; "" on the last
	Queued  int
	Waiting int
	Running int
}

// taskFilter reads the list's filters from the query, refusing a bad one
// with what would be valid.
func (s *Server) taskFilter(q url.Values) (store.TaskFilter, error) {
	f := store.TaskFilter{Kind: q.Get("kind"), Key: q.Get("key"), Schedule: q.Get("schedule"), Node: q.Get("node"),
		Limit: PageSize + 1}
	if st := q.Get("state"); st != "" {
		if !task.Status(st).Valid() {
			return f, fmt.Errorf("state %q is not a task state; use one of %v: %w", st, task.All(), store.ErrInvalid)
		}
		f.Statuses = []task.Status{task.Status(st)}
	}
	if b := q.Get("bucket"); b != "" {
		set, err := bucket.ParseSet(b, s.client.Policy().Count())
		if err != nil {
			return f, fmt.Errorf("bucket %q: %v: %w", b, err, store.ErrInvalid)
		}
		f.Buckets = &set
	}
	if p := q.Get("payload"); p != "" {
		if !json.Valid([]byte(p)) {
			return f, fmt.Errorf(`payload %q is not JSON; give a JSON value the payload must contain, such as {"customer": 7}: %w`,
				p, store.ErrInvalid)
		}
		f.Payload = json.RawMessage(p)
	}
	if b := q.Get("before"); b != "" {
		id, err := strconv.ParseInt(b, 10, 64)
		if err != nil || id <= 0 {
			return f, fmt.Errorf("before %q is not a task id (a positive integer): %w", b, store.ErrInvalid)
		}
		f.BeforeID = id
	}
	return f, nil
}

func (s *Server) tasksPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f, err := s.taskFilter(q)
	if err != nil {
		s.fail(w, r, statusOf(err), err)
		return
	}
	ctx, cancel := s.query(r)
	defer cancel()
	tasks, err := s.cfg.Store.ListTasks(ctx, f)
	if err != nil {
		s.fail(w, r, statusOf(err), err)
		return
	}
	v := tasksView{Filter: q, State: q.Get("state"), States: task.All(), Tasks: tasks}
	if len(tasks) > PageSize {
		v.Tasks = tasks[:PageSize]
		next := url.Values{}
		for k, vs := range q {
			next[k] = vs
		}
		next.Set("before", strconv.FormatInt(v.Tasks[PageSize-1].ID, 10))
		v.Next = "/tasks?" + next.Encode()
	}
	// Totals from the partial indexes: the unfinished tasks only, counted
	// per bucket; finished tasks are never counted.
	backlog, err := s.backlog(ctx)
	if err != nil {
		s.fail(w, r, statusOf(err), err)
		return
	}
	for _, b := range backlog {
		v.Queued += b.Queued
		v.Waiting += b.Waiting
		v.Running += b.Active
	}
	s.render(w, r, http.StatusOK, "tasks", page{Title: "Tasks", Nav: "tasks", Data: v})
}

// taskView is one task.
type taskView struct {
	*flotilla.TaskReport
	Command   *store.Command // the command this page follows, from ?command=
	Done      string         // what a direct action did, from ?done=
	CanStop   bool
	CanPause  bool
	CanResume bool
	LiveURL   string
}

func (s *Server) task(ctx context.Context, r *http.Request) (taskView, error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		return taskView{}, fmt.Errorf("task id %q is not a positive integer: %w", r.PathValue("id"), store.ErrInvalid)
	}
	rep, err := s.client.Get(ctx, id)
	if err != nil {
		return taskView{}, err
	}
	st := rep.Task.Status
	v := taskView{TaskReport: rep, CanStop: st.Active() || st.Claimable() || st == task.Paused || st == task.Pending,
		CanPause: st == task.Running || st.Claimable(), CanResume: st == task.Paused,
		LiveURL: fmt.Sprintf("/tasks/%d/live", id)}
	q := r.URL.Query()
	if c := q.Get("command"); c != "" {
		cid, err := strconv.ParseInt(c, 10, 64)
		if err != nil || cid <= 0 {
			return taskView{}, fmt.Errorf("command %q is not a command id (a positive integer): %w", c, store.ErrInvalid)
		}
		cmd, err := s.cfg.Store.GetCommand(ctx, cid)
		if err != nil {
			return taskView{}, err
		}
		if cmd.TaskID != id {
			return taskView{}, fmt.Errorf("command %d is for task %d, not %d: %w", cid, cmd.TaskID, id, store.ErrInvalid)
		}
		v.Command = &cmd
		v.LiveURL += "?command=" + c
	}
	v.Done = q.Get("done")
	return v, nil
}

func (s *Server) taskPage(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := s.query(r)
	defer cancel()
	v, err := s.task(ctx, r)
	if err != nil {
		s.fail(w, r, statusOf(err), err)
		return
	}
	s.render(w, r, http.StatusOK, "task", page{Title: fmt.Sprintf("Task %d", v.Task.ID), Nav: "tasks", Data: v})
}

func (s *Server) taskLive(w http.ResponseWriter, r *http.Request) {
	s.live(w, r, "task", func(ctx context.Context) (any, error) { return s.task(ctx, r) })
}

// taskAction stops, pauses or resumes a task through package commands, in
// the name of the session's operator, and shows the task with the command
// it issued, whose acknowledgement the page then follows.
func (s *Server) taskAction(w http.ResponseWriter, r *http.Request, sess *session) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		s.fail(w, r, http.StatusBadRequest, fmt.Errorf("task id %q is not a positive integer", r.PathValue("id")))
		return
	}
	act := map[string]func(context.Context, int64, string, string) (commandsResult, error){
		"stop": s.stop, "pause": s.pause, "resume": s.resume,
	}[r.PathValue("action")]
	if act == nil {
		s.fail(w, r, http.StatusNotFound, fmt.Errorf("no action %q for a task: use stop, pause or resume", r.PathValue("action")))
		return
	}
	ctx, cancel := s.query(r)
	defer cancel()
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	if reason == "" {
		reason = "from the dashboard"
	}
	res, err := act(ctx, id, reason, sess.Actor())
	if err != nil {
		s.fail(w, r, statusOf(err), err)
		return
	}
	s.cfg.Logger.Info("dashboard action", zapActor(sess), zapTask(id), zapAction(r.PathValue("action")), zapStatus(string(res.Status)))
	target := fmt.Sprintf("/tasks/%d", id)
	if res.Command.ID != 0 {
		target += fmt.Sprintf("?command=%d", res.Command.ID)
	} else {
		target += "?done=" + url.QueryEscape(fmt.Sprintf("%s: the task is %s", r.PathValue("action"), res.Status))
	}
	http.Redirect(w, r, target, http.StatusSeeOther)
}

// schedulesView lists the schedules with their bucket's holder.
type schedulesView struct {
	Schedules []scheduleRow
}

type scheduleRow struct {
	store.Schedule
	Holder string
}

func (s *Server) schedulesPage(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := s.query(r)
	defer cancel()
	scs, err := s.cfg.Store.ListSchedules(ctx)
	if err != nil {
		s.fail(w, r, statusOf(err), err)
		return
	}
	leases, err := s.cfg.Store.ListBuckets(ctx)
	if err != nil {
		s.fail(w, r, statusOf(err), err)
		return
	}
	holder := map[int]string{}
	for _, l := range leases {
		holder[l.Bucket] = l.Node
	}
	v := schedulesView{}
	for _, sc := range scs {
		v.Schedules = append(v.Schedules, scheduleRow{Schedule: sc, Holder: holder[sc.Bucket]})
	}
	s.render(w, r, http.StatusOK, "schedules", page{Title: "Schedules", Nav: "schedules", Data: v, Flash: r.URL.Query().Get("done")})
}

func (s *Server) scheduleAction(w http.ResponseWriter, r *http.Request, sess *session) {
	name, action := r.PathValue("name"), r.PathValue("action")
	ctx, cancel := s.query(r)
	defer cancel()
	var err error
	switch action {
	case "pause":
		_, err = s.client.PauseSchedule(ctx, name)
	case "resume":
		_, err = s.client.ResumeSchedule(ctx, name)
	default:
		s.fail(w, r, http.StatusNotFound, fmt.Errorf("no action %q for a schedule: use pause or resume", action))
		return
	}
	if err != nil {
		s.fail(w, r, statusOf(err), err)
		return
	}
	s.cfg.Logger.Info("dashboard action", zapActor(sess), zapSchedule(name), zapAction(action))
	http.Redirect(w, r, "/schedules?done="+url.QueryEscape(fmt.Sprintf("schedule %s: %s by %s", name, action, sess.Actor())),
		http.StatusSeeOther)
}
