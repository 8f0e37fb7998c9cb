package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// tasksView is one page of the task list.
type tasksView struct {
	Filter  url.Values
	Query   string // the filter as a query string, for the bulk actions
	State   string
	States  []task.Status
	Tasks   []*task.Task
	Next    string // the next page; "" on the last
	Queued  int
	Waiting int
	Running int
}

// filterKeys are the query parameters of the task list's filter.
var filterKeys = []string{"state", "kind", "key", "bucket", "node", "schedule", "payload"}

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

// filterQuery is the filter part of q, encoded.
func filterQuery(q url.Values) string {
	out := url.Values{}
	for _, k := range filterKeys {
		if v := q.Get(k); v != "" {
			out.Set(k, v)
		}
	}
	return out.Encode()
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
	v := tasksView{Filter: q, Query: filterQuery(q), State: q.Get("state"), States: task.All(), Tasks: tasks}
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

// parseID reads a positive id from the path.
func parseID(r *http.Request, what string) (int64, error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("%s id %q is not a positive integer: %w", what, r.PathValue("id"), store.ErrInvalid)
	}
	return id, nil
}

// actionOn reads what an action names: the id of the task or pipeline in
// the path, the action, and the reason the form gives ("from the dashboard"
// when none).
func actionOn(r *http.Request, what string) (id int64, action, reason string, err error) {
	id, err = parseID(r, what)
	reason = strings.TrimSpace(r.PostFormValue("reason"))
	if reason == "" {
		reason = "from the dashboard"
	}
	return id, r.PathValue("action"), reason, err
}

// taskAction stops, pauses, resumes or retries a task in the name of the
// session's operator. Stop, pause and resume go through package commands:
// a running task gets a command, and the page then follows its
// acknowledgement. A retry is a new task, whose page comes next.
func (s *Server) taskAction(w http.ResponseWriter, r *http.Request, sess *session) {
	id, action, reason, err := actionOn(r, "task")
	if err != nil {
		s.fail(w, r, http.StatusBadRequest, err)
		return
	}
	ctx, cancel := s.query(r)
	defer cancel()
	if action == "retry" {
		fresh, err := s.cfg.Store.RetryTask(ctx, store.RetryRequest{ID: id, By: sess.Actor(), Reason: reason})
		if err != nil {
			s.fail(w, r, statusOf(err), err)
			return
		}
		s.cfg.Logger.Info("dashboard action", zapActor(sess), zapTask(id), zapAction(action), zapRetry(fresh.ID))
		s.notice(sess, "task %d runs again as task %d, by %s", id, fresh.ID, sess.Actor())
		http.Redirect(w, r, fmt.Sprintf("/tasks/%d", fresh.ID), http.StatusSeeOther)
		return
	}
	act := map[string]func(context.Context, int64, string, string) (commandsResult, error){
		"stop": s.stop, "pause": s.pause, "resume": s.resume,
	}[action]
	if act == nil {
		s.fail(w, r, http.StatusNotFound, fmt.Errorf("no action %q for a task: use stop, pause, resume or retry", action))
		return
	}
	res, err := act(ctx, id, reason, sess.Actor())
	if err != nil {
		s.fail(w, r, statusOf(err), err)
		return
	}
	s.cfg.Logger.Info("dashboard action", zapActor(sess), zapTask(id), zapAction(action), zapStatus(string(res.Status)))
	target := fmt.Sprintf("/tasks/%d", id)
	if res.Command.ID != 0 {
		target += fmt.Sprintf("?command=%d", res.Command.ID)
	} else {
		s.notice(sess, "%s by %s: task %d is %s", action, sess.Actor(), id, res.Status)
	}
	http.Redirect(w, r, target, http.StatusSeeOther)
}
