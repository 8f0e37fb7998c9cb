package dashboard

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/store"
	"github.com/flotilla-dev/flotilla/task"
)

// pipelinesView is one page of the pipeline list.
type pipelinesView struct {
	Pipelines []pipelineRow
	Next      string
}

type pipelineRow struct {
	store.PipelineSummary
	Counts string // "3 succeeded · 1 failed"
}

// countsText lists a pipeline's steps by state, in the states' order.
func countsText(steps map[task.Status]int) string {
	var parts []string
	for _, st := range task.All() {
		if n := steps[st]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, st))
		}
	}
	return strings.Join(parts, " · ")
}

func (s *Server) pipelinesPage(w http.ResponseWriter, r *http.Request) {
	f := store.PipelineFilter{Limit: PageSize + 1}
	if b := r.URL.Query().Get("before"); b != "" {
		id, err := strconv.ParseInt(b, 10, 64)
		if err != nil || id <= 0 {
			s.fail(w, r, http.StatusBadRequest, fmt.Errorf("before %q is not a pipeline id (a positive integer)", b))
			return
		}
		f.BeforeID = id
	}
	ctx, cancel := s.query(r)
	defer cancel()
	ps, err := s.cfg.Store.ListPipelines(ctx, f)
	if err != nil {
		s.fail(w, r, statusOf(err), err)
		return
	}
	v := pipelinesView{}
	if len(ps) > PageSize {
		ps = ps[:PageSize]
		v.Next = fmt.Sprintf("/pipelines?before=%d", ps[PageSize-1].ID)
	}
	for _, p := range ps {
		v.Pipelines = append(v.Pipelines, pipelineRow{PipelineSummary: p, Counts: countsText(p.Steps)})
	}
	s.render(w, r, http.StatusOK, "pipelines", page{Title: "Pipelines", Nav: "pipelines", Data: v})
}

// pipelineView is one pipeline: what its live part shows.
type pipelineView struct {
	store.Pipeline
	Status string
	Counts string
	Graph  *graph
	Rows   []stepRow
}

type stepRow struct {
	store.PipelineStep
	Deps    string // "extract (success), audit (any)"
	Skipped string // which dependency ended how, for a skipped step
}

// pipelinePageView adds what the page shows once: the actions.
type pipelinePageView struct {
	pipelineView
	Retryable []string // steps a retry may start from
	CanStop   bool
	CanResume bool
}

func (s *Server) pipeline(ctx context.Context, id int64) (pipelineView, error) {
	p, err := s.cfg.Store.GetPipeline(ctx, id)
	if err != nil {
		return pipelineView{}, err
	}
	v := pipelineView{Pipeline: p, Status: p.Status(), Counts: countsText(store.SummaryOf(p).Steps), Graph: layoutGraph(p, s.now())}
	for _, st := range p.Steps {
		var deps []string
		for _, d := range st.DependsOn {
			deps = append(deps, fmt.Sprintf("%s (%s)", d.Step, d.Policy()))
		}
		v.Rows = append(v.Rows, stepRow{PipelineStep: st, Deps: strings.Join(deps, ", "), Skipped: skippedBecause(p, st)})
	}
	return v, nil
}

func (s *Server) pipelinePage(w http.ResponseWriter, r *http.Request) {
	id, err := parseID(r, "pipeline")
	if err != nil {
		s.fail(w, r, statusOf(err), err)
		return
	}
	ctx, cancel := s.query(r)
	defer cancel()
	v, err := s.pipeline(ctx, id)
	if err != nil {
		s.fail(w, r, statusOf(err), err)
		return
	}
	pv := pipelinePageView{pipelineView: v}
	for _, st := range v.Steps {
		if store.Retryable(st.Task.Status) {
			pv.Retryable = append(pv.Retryable, st.Name)
		}
		pv.CanStop = pv.CanStop || !st.Task.Status.Terminal()
		pv.CanResume = pv.CanResume || st.Task.Status == task.Paused
	}
	s.render(w, r, http.StatusOK, "pipeline", page{Title: fmt.Sprintf("Pipeline %d", id), Nav: "pipelines", Data: pv})
}

func (s *Server) pipelineLive(w http.ResponseWriter, r *http.Request) {
	id, err := parseID(r, "pipeline")
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.live(w, r, fmt.Sprintf("/pipelines/%d/live", id),
		s.liveReader("pipeline", func(ctx context.Context) (any, error) { return s.pipeline(ctx, id) }, "pipeline-live"))
}

// pipelineAction stops, pauses or resumes a pipeline's steps, or runs one
// step again with its descendants, in the operator's name.
func (s *Server) pipelineAction(w http.ResponseWriter, r *http.Request, sess *session) {
	id, action, reason, err := actionOn(r, "pipeline")
	if err != nil {
		s.fail(w, r, http.StatusBadRequest, err)
		return
	}
	ctx, cancel := s.query(r)
	defer cancel()
	target := fmt.Sprintf("/pipelines/%d", id)
	if action == "retry" {
		step := r.PostFormValue("step")
		p, err := s.cfg.Store.GetPipeline(ctx, id)
		if err != nil {
			s.fail(w, r, statusOf(err), err)
			return
		}
		st, ok := p.Step(step)
		if !ok {
			s.fail(w, r, http.StatusNotFound, fmt.Errorf("pipeline %d has no step %q: %w", id, step, store.ErrNotFound))
			return
		}
		fresh, err := s.cfg.Store.RetryTask(ctx, store.RetryRequest{ID: st.Task.ID, By: sess.Actor(), Reason: reason})
		if err != nil {
			s.fail(w, r, statusOf(err), err)
			return
		}
		s.cfg.Logger.Info("dashboard action", zapActor(sess), zapPipeline(id), zapAction(action), zapStep(step), zapRetry(fresh.ID))
		s.notice(sess, "step %s runs again from task %d, with the steps after it that did not succeed, by %s",
			step, fresh.ID, sess.Actor())
		http.Redirect(w, r, target, http.StatusSeeOther)
		return
	}
	act := map[string]func(context.Context, int64, ...flotilla.CommandOption) ([]flotilla.PipelineStepResult, error){
		"stop": s.client.StopPipeline, "pause": s.client.PausePipeline, "resume": s.client.ResumePipeline,
	}[action]
	if act == nil {
		s.fail(w, r, http.StatusNotFound, fmt.Errorf("no action %q for a pipeline: use stop, pause, resume or retry", action))
		return
	}
	res, err := act(ctx, id, flotilla.Reason(reason), flotilla.By(sess.Actor()))
	if err != nil {
		s.fail(w, r, statusOf(err), err)
		return
	}
	s.cfg.Logger.Info("dashboard action", zapActor(sess), zapPipeline(id), zapAction(action), zapSteps(len(res)))
	s.notice(sess, "%s by %s: %d steps of pipeline %d acted on", action, sess.Actor(), len(res), id)
	http.Redirect(w, r, target, http.StatusSeeOther)
}
