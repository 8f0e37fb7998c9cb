package dashboard

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/store"
)

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
	// Summary replaces the grid of a fleet of more than gridMaxBuckets
	// buckets: runs of buckets by holder, and each holder's share.
	Summary *mapSummary
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
	v := fleetView{At: now, Buckets: make([]bucketCell, 0, len(buckets))}
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
		if len(leases) <= gridMaxBuckets {
			c.Title = bucketTitle(b) // a summarised map shows no cell
		}
		v.Queued += b.Queued
		v.Waiting += b.Waiting
		v.Running += b.Running
		v.Buckets = append(v.Buckets, c)
	}
	for _, n := range nodes {
		v.Nodes = append(v.Nodes, nodeRow{NodeInfo: n, Class: class[n.ID], Held: len(held[n.ID]),
			Kinds: strings.Join(n.Kinds, ", "), HeldSet: bucket.Of(held[n.ID]...).String()})
	}
	if len(v.Buckets) > gridMaxBuckets {
		v.Summary = summarise(v.Buckets)
		v.Buckets = nil
		for i := range v.Nodes {
			v.Nodes[i].HeldSet = shorten(v.Nodes[i].HeldSet, maxRangesText)
		}
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
	v, err := s.fleetPageView(ctx)
	if err != nil {
		s.fail(w, r, statusOf(err), err)
		return
	}
	s.render(w, r, http.StatusOK, "fleet", page{Title: "Fleet", Nav: "fleet", Data: v})
}

func (s *Server) fleetLive(w http.ResponseWriter, r *http.Request) {
	s.live(w, r, "fleet", s.liveReader("fleet", func(ctx context.Context) (any, error) { return s.fleetPageView(ctx) },
		"fleet-live"))
}

// fleetPageData is what the fleet page shows: the map and the nodes, and
// the counts and charts.
type fleetPageData struct {
	fleetView
	Counts countsView
}

func (s *Server) fleetPageView(ctx context.Context) (fleetPageData, error) {
	v, err := s.fleet(ctx)
	if err != nil {
		return fleetPageData{}, err
	}
	c, err := s.counts(ctx)
	if err != nil {
		return fleetPageData{}, err
	}
	return fleetPageData{fleetView: v, Counts: c}, nil
}
