package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// taskView is one task: what its live parts show (the fields, the trail),
// which every viewer of the task shares.
type taskView struct {
	*flotilla.TaskReport
	Command   *store.Command // the command this page follows, from ?command=
	CanStop   bool
	CanPause  bool
	CanResume bool
	CanRetry  bool
	Retries   store.Retries
	// Why says what the task waits for, while it waits.
	Why string
	// Skipped says which dependency ended how, for a skipped step.
	Skipped string
	// Deps are a step's dependencies, with their current state.
	Deps    []depState
	LiveURL string
}

// depState is one dependency of a step as it is now.
type depState struct {
	Step   string
	Policy string
	Task   *task.Task
}

// taskPageView adds what the page shows once, outside the live parts: the
// payload and result, masked unless revealed, and an exec task's output.
type taskPageView struct {
	taskView
	Payload  shown
	Result   shown
	Output   *execOutput
	Revealed bool
	Pipeline string // the pipeline's name, for a step
}

// execOutput is what the exec kind keeps of a child's run.
type execOutput struct {
	ExitCode int    `json:"exit_code"`
	Signal   string `json:"signal"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	Duration string `json:"duration"`
}

// taskRef names the task a page or a stream shows: its id, and the command
// it follows.
type taskRef struct {
	id      int64
	command int64
}

func parseTaskRef(r *http.Request) (taskRef, error) {
	id, err := parseID(r, "task")
	if err != nil {
		return taskRef{}, err
	}
	ref := taskRef{id: id}
	if c := r.URL.Query().Get("command"); c != "" {
		cid, err := strconv.ParseInt(c, 10, 64)
		if err != nil || cid <= 0 {
			return taskRef{}, fmt.Errorf("command %q is not a command id (a positive integer): %w", c, store.ErrInvalid)
		}
		ref.command = cid
	}
	return ref, nil
}

// liveKey names the stream of ref: viewers of one key share one reader.
func (ref taskRef) liveURL() string {
	u := fmt.Sprintf("/tasks/%d/live", ref.id)
	if ref.command != 0 {
		u += fmt.Sprintf("?command=%d", ref.command)
	}
	return u
}

func (s *Server) task(ctx context.Context, ref taskRef) (taskView, error) {
	rep, err := s.client.Report(ctx, ref.id)
	if err != nil {
		return taskView{}, err
	}
	t := rep.Task
	st := t.Status
	v := taskView{TaskReport: rep, CanStop: st.Active() || st.Claimable() || st == task.Paused || st == task.Pending,
		CanPause: st == task.Running || st.Claimable(), CanResume: st == task.Paused, LiveURL: ref.liveURL()}
	if ref.command != 0 {
		cmd, err := s.cfg.Store.GetCommand(ctx, ref.command)
		if err != nil {
			return taskView{}, err
		}
		if cmd.TaskID != ref.id {
			return taskView{}, fmt.Errorf("command %d is for task %d, not %d: %w", ref.command, cmd.TaskID, ref.id, store.ErrInvalid)
		}
		v.Command = &cmd
	}
	if v.Retries, err = s.cfg.Store.TaskRetries(ctx, ref.id); err != nil {
		return taskView{}, err
	}
	v.CanRetry = store.Retryable(st) && v.Retries.As == nil
	if st == task.Skipped {
		for _, e := range rep.Events {
			if e.To == task.Skipped {
				v.Skipped = e.Reason
			}
		}
	}
	if t.Pipeline != 0 {
		p, err := s.cfg.Store.GetPipeline(ctx, t.Pipeline)
		if err != nil {
			return taskView{}, err
		}
		if cur, ok := p.Step(t.Step); ok && cur.Task.ID != t.ID {
			v.CanRetry = false // only a step's current task is run again
		}
		for _, st := range p.Steps {
			if st.Name != t.Step {
				continue
			}
			for _, d := range st.DependsOn {
				dep, _ := p.Step(d.Step)
				v.Deps = append(v.Deps, depState{Step: d.Step, Policy: d.Policy(), Task: dep.Task})
			}
		}
	}
	v.Why = s.why(t, rep.Waiting, v.Deps)
	return v, nil
}

// why says what a waiting task waits for: a holder, a limit or resource,
// its dependencies, its time, a resume.
func (s *Server) why(t *task.Task, fleet string, deps []depState) string {
	switch {
	case t.Status == task.Pending:
		var open []string
		for _, d := range deps {
			if d.Task != nil && !d.Task.Status.Terminal() {
				open = append(open, fmt.Sprintf("%s (%s)", d.Step, d.Task.Status))
			}
		}
		if len(open) == 0 {
			return "its dependencies"
		}
		return "its dependencies " + strings.Join(open, ", ")
	case t.Status == task.Paused:
		return "a resume: it is paused"
	case !t.Status.Claimable():
		return ""
	case fleet != "":
		return fleet
	case t.WaitReason != "":
		return t.WaitReason
	case t.RunAt.After(s.now()):
		return "its time: not before " + absolute(t.RunAt)
	}
	return ""
}

func (s *Server) taskPage(w http.ResponseWriter, r *http.Request) {
	s.showTask(w, r, nil)
}

// showTask renders a task's page; sess, when set, is an operator who asked
// to see its secrets.
func (s *Server) showTask(w http.ResponseWriter, r *http.Request, revealFor *session) {
	ref, err := parseTaskRef(r)
	if err != nil {
		s.fail(w, r, statusOf(err), err)
		return
	}
	ctx, cancel := s.query(r)
	defer cancel()
	v, err := s.task(ctx, ref)
	if err != nil {
		s.fail(w, r, statusOf(err), err)
		return
	}
	t := v.Task
	reveal := revealFor != nil
	pv := taskPageView{taskView: v, Revealed: reveal,
		Payload: s.secrets.show(t.Payload, t.Kind == "exec", reveal), Result: s.secrets.show(t.Result, false, reveal)}
	if t.Kind == "exec" && len(t.Result) > 0 {
		var out execOutput
		if json.Unmarshal(t.Result, &out) == nil {
			pv.Output, pv.Result = &out, shown{}
		}
	}
	if t.Pipeline != 0 {
		if p, err := s.cfg.Store.GetPipeline(ctx, t.Pipeline); err == nil {
			pv.Pipeline = p.Name
		}
	}
	if reveal {
		s.cfg.Logger.Info("dashboard reveal: payload and result shown unmasked", zapActor(revealFor), zapTask(t.ID),
			zap.Int("masked_payload_fields", s.secrets.show(t.Payload, t.Kind == "exec", false).Masked),
			zap.Int("masked_result_fields", s.secrets.show(t.Result, false, false).Masked))
	}
	s.render(w, r, http.StatusOK, "task", page{Title: fmt.Sprintf("Task %d", t.ID), Nav: "tasks", Data: pv})
}

// revealTask shows a task with its secrets, in the operator's name, which
// the log records. It is a POST with the CSRF token, so that no link, no
// prefetch and no other site can make a browser reveal anything.
func (s *Server) revealTask(w http.ResponseWriter, r *http.Request, sess *session) {
	s.showTask(w, r, sess)
}

func (s *Server) taskLive(w http.ResponseWriter, r *http.Request) {
	ref, err := parseTaskRef(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.live(w, r, ref.liveURL(), s.liveReader("task", func(ctx context.Context) (any, error) { return s.task(ctx, ref) },
		"task-live", "task-trail"))
}
