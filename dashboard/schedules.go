package dashboard

import (
	"fmt"
	"net/http"

	"github.com/flotilla-dev/flotilla/store"
)

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
	s.render(w, r, http.StatusOK, "schedules", page{Title: "Schedules", Nav: "schedules", Data: v})
}

// scheduleAction pauses or resumes the schedule the form names in its body.
func (s *Server) scheduleAction(w http.ResponseWriter, r *http.Request, sess *session) {
	name, action := r.PostFormValue("name"), r.PathValue("action")
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
	s.notice(sess, "schedule %s: %s by %s", store.Shorten(name, 80), action, sess.Actor())
	http.Redirect(w, r, "/schedules", http.StatusSeeOther)
}
