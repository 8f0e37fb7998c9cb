package dashboard

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/commands"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// A bulk action applies retry, stop or cancel to every task a filter of the
// task list matches, at most Config.BulkCap of them. It takes two steps: a
// review (GET) that counts what the action would change, and the action
// (POST) that carries the count the operator confirmed, and is refused when
// the filter matches another count by then. Each task is changed on its own,
// in the operator's name, so each trail says who.
var bulkActions = map[string]struct {
	verb     string
	eligible func(task.Status) bool
}{
	"retry":  {"run again", store.Retryable},
	"stop":   {"stop", func(s task.Status) bool { return !s.Terminal() }},
	"cancel": {"cancel", func(s task.Status) bool { return !s.Terminal() && !s.Active() }},
}

// bulkPreviewIDs is how many of the matching tasks the review lists.
const bulkPreviewIDs = 20

type bulkView struct {
	Action   string
	Verb     string
	Filter   url.Values
	Query    string
	ListURL  string // the task list under the filter
	Matched  int    // tasks the filter matches, up to the cap
	Over     bool   // more than the cap match
	Cap      int
	Eligible []*task.Task
	Preview  []*task.Task
}

// bulkTargets reads the tasks a bulk action would change.
func (s *Server) bulkTargets(ctx context.Context, q url.Values) (bulkView, error) {
	action := q.Get("action")
	a, ok := bulkActions[action]
	if !ok {
		return bulkView{}, fmt.Errorf("bulk action %q is not one: use retry, stop or cancel: %w", action, store.ErrInvalid)
	}
	if filterQuery(q) == "" {
		return bulkView{}, fmt.Errorf("a bulk action needs a filter (a state, a kind, ...): it never applies to every task: %w",
			store.ErrInvalid)
	}
	f, err := s.taskFilter(q)
	if err != nil {
		return bulkView{}, err
	}
	f.BeforeID, f.Limit = 0, s.cfg.BulkCap+1
	tasks, err := s.cfg.Store.ListTasks(ctx, f)
	if err != nil {
		return bulkView{}, err
	}
	v := bulkView{Action: action, Verb: a.verb, Filter: q, Query: filterQuery(q), ListURL: "/tasks?" + filterQuery(q),
		Cap: s.cfg.BulkCap}
	if len(tasks) > s.cfg.BulkCap {
		v.Over, tasks = true, tasks[:s.cfg.BulkCap]
	}
	v.Matched = len(tasks)
	for _, t := range tasks {
		if a.eligible(t.Status) {
			v.Eligible = append(v.Eligible, t)
		}
	}
	v.Preview = v.Eligible[:min(len(v.Eligible), bulkPreviewIDs)]
	return v, nil
}

func (s *Server) bulkPage(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := s.query(r)
	defer cancel()
	v, err := s.bulkTargets(ctx, r.URL.Query())
	if err != nil {
		s.fail(w, r, statusOf(err), err)
		return
	}
	s.render(w, r, http.StatusOK, "bulk", page{Title: "Bulk " + v.Action, Nav: "tasks", Data: v})
}

// bulkAction applies a reviewed bulk action.
func (s *Server) bulkAction(w http.ResponseWriter, r *http.Request, sess *session) {
	if err := r.ParseForm(); err != nil {
		s.fail(w, r, http.StatusBadRequest, err)
		return
	}
	q := url.Values{}
	for _, k := range append([]string{"action"}, filterKeys...) {
		if v := r.PostForm.Get(k); v != "" {
			q.Set(k, v)
		}
	}
	expect, err := strconv.Atoi(r.PostForm.Get("expect"))
	if err != nil || expect < 0 {
		s.fail(w, r, http.StatusBadRequest, fmt.Errorf("expect %q is not the count of tasks reviewed: review the action again",
			r.PostForm.Get("expect")))
		return
	}
	ctx, cancel := s.query(r)
	v, err := s.bulkTargets(ctx, q)
	cancel()
	switch {
	case err != nil:
		s.fail(w, r, statusOf(err), err)
		return
	case v.Over:
		s.fail(w, r, http.StatusConflict, fmt.Errorf("more than %d tasks match the filter: narrow it, and act on at most %d at once: %w",
			v.Cap, v.Cap, store.ErrConflict))
		return
	case len(v.Eligible) != expect:
		s.fail(w, r, http.StatusConflict, fmt.Errorf("the filter now matches %d tasks to %s, not the %d reviewed: review again: %w",
			len(v.Eligible), v.Verb, expect, store.ErrConflict))
		return
	}
	reason := "bulk " + v.Action + " from the dashboard"
	done, refused := 0, 0
	var firstErr error
	for _, t := range v.Eligible {
		// Each task on its own deadline: a thousand of them take longer
		// than one page may.
		octx, cancel := context.WithTimeout(r.Context(), s.cfg.QueryTimeout)
		err := s.bulkOne(octx, v.Action, t, reason, sess.Actor())
		cancel()
		if err != nil {
			refused++
			if firstErr == nil {
				firstErr = fmt.Errorf("task %d: %w", t.ID, err)
			}
			if errors.Is(err, context.Canceled) {
				break // the operator went away
			}
			continue
		}
		done++
	}
	s.cfg.Logger.Info("dashboard bulk action", zapActor(sess), zapAction(v.Action), zap.String("filter", v.Query),
		zap.Int("done", done), zap.Int("refused", refused))
	msg := fmt.Sprintf("bulk %s by %s: %d of %d tasks", v.Action, sess.Actor(), done, len(v.Eligible))
	if refused > 0 {
		msg += fmt.Sprintf("; %d refused, the first because %s", refused, redactSecrets(firstErr.Error()))
	}
	s.notice(sess, "%s", msg)
	http.Redirect(w, r, v.ListURL, http.StatusSeeOther)
}

func (s *Server) bulkOne(ctx context.Context, action string, t *task.Task, reason, by string) error {
	switch action {
	case "retry":
		_, err := s.cfg.Store.RetryTask(ctx, store.RetryRequest{ID: t.ID, By: by, Reason: reason})
		return err
	case "stop":
		_, err := commands.Stop(ctx, s.cfg.Store, t.ID, reason, by)
		return err
	}
	// cancel: only a task that waits, as it was read; one that started
	// since is left to run, which is what cancel promises.
	_, err := s.cfg.Store.Transition(ctx, store.Transition{ID: t.ID, Version: t.StatusVersion, To: task.Cancelled,
		Reason: strings.Join([]string{"cancel requested by", by + ":", reason}, " ")})
	return err
}
