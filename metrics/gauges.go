package metrics

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/store"
)

var (
	descHeld = prometheus.NewDesc("flotilla_buckets_held",
		"Buckets this node holds and serves now.", nil, nil)
	descStandby = prometheus.NewDesc("flotilla_buckets_standby",
		"Buckets this node declares that a live node holds: it waits to take them over.", nil, nil)
	descShare = prometheus.NewDesc("flotilla_buckets_share",
		"Buckets the fleet's balance gives this node: what it holds once the moves under way are done.", nil, nil)
	descHandingOff = prometheus.NewDesc("flotilla_buckets_handing_off",
		"Buckets this node is handing to other nodes now (no more claims there; their tasks finish).", nil, nil)
	descActive = prometheus.NewDesc("flotilla_attempts_active",
		"Attempts this node runs now (handlers running, or outcomes waiting to be written), by kind.",
		[]string{"kind"}, nil)
	descReady = prometheus.NewDesc("flotilla_node_ready",
		"1 while the node is ready (see /readyz), 0 otherwise.", nil, nil)
	descTasks = prometheus.NewDesc("flotilla_tasks",
		"Unfinished tasks of the buckets this node holds, by state: queued (due), waiting (scheduled "+
			"or retrying, not yet due), active (running, stopping, pausing). Sampled every interval.",
		[]string{"state"}, nil)
	descOldestDue = prometheus.NewDesc("flotilla_oldest_due_age_seconds",
		"Age of the oldest due task in the buckets this node holds (0 when none). Sampled every interval.", nil, nil)
	descUnheld = prometheus.NewDesc("flotilla_buckets_unheld",
		"Buckets of the fleet that no live node holds, as this node last read the lease table. "+
			"The same on every node: alert on its max.", nil, nil)
	descSampleAge = prometheus.NewDesc("flotilla_sample_age_seconds",
		"Time since the database-backed gauges were last sampled.", nil, nil)
)

// gauges reads the node's memory and the last sample at scrape time; it
// sends no statement to the database.
type gauges struct{ m *Metrics }

func (g gauges) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descHeld, descStandby, descShare, descHandingOff, descActive, descReady,
		descTasks, descOldestDue, descUnheld, descSampleAge} {
		ch <- d
	}
}

func (g gauges) Collect(ch chan<- prometheus.Metric) {
	g.m.mu.Lock()
	n, s := g.m.node, g.m.sample
	g.m.mu.Unlock()
	if n != nil {
		ch <- prometheus.MustNewConstMetric(descHeld, prometheus.GaugeValue, float64(len(n.Held())))
		ch <- prometheus.MustNewConstMetric(descStandby, prometheus.GaugeValue, float64(n.Standby()))
		ch <- prometheus.MustNewConstMetric(descShare, prometheus.GaugeValue, float64(n.Share()))
		ch <- prometheus.MustNewConstMetric(descHandingOff, prometheus.GaugeValue, float64(len(n.Handoffs())))
		for kind, c := range n.ActiveByKind() {
			ch <- prometheus.MustNewConstMetric(descActive, prometheus.GaugeValue, float64(c), kind)
		}
		ready := 0.0
		if n.Health().Ready {
			ready = 1
		}
		ch <- prometheus.MustNewConstMetric(descReady, prometheus.GaugeValue, ready)
	}
	if s.at.IsZero() {
		return // nothing sampled yet: no figure rather than a false zero
	}
	ch <- prometheus.MustNewConstMetric(descTasks, prometheus.GaugeValue, float64(s.queued), "queued")
	ch <- prometheus.MustNewConstMetric(descTasks, prometheus.GaugeValue, float64(s.waiting), "waiting")
	ch <- prometheus.MustNewConstMetric(descTasks, prometheus.GaugeValue, float64(s.active), "active")
	ch <- prometheus.MustNewConstMetric(descOldestDue, prometheus.GaugeValue, s.oldestDueAge.Seconds())
	ch <- prometheus.MustNewConstMetric(descUnheld, prometheus.GaugeValue, float64(s.unheld))
	ch <- prometheus.MustNewConstMetric(descSampleAge, prometheus.GaugeValue, time.Since(s.at).Seconds())
}

// Start samples the database-backed gauges once, then every Interval, until
// Stop. It returns once the loop runs.
func (m *Metrics) Start(ctx context.Context) error {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.done != nil {
		return fmt.Errorf("metrics: started twice")
	}
	ctx, m.cancel = context.WithCancel(ctx)
	m.done = make(chan struct{})
	go func(done chan struct{}) {
		defer close(done)
		t := time.NewTicker(m.opts.Interval)
		defer t.Stop()
		for {
			if err := m.Sample(ctx); err != nil && ctx.Err() == nil {
				m.sampleErrors.Inc()
				m.opts.Logger.Warn("sampling the metrics' gauges failed; will retry", zap.Error(err))
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}(m.done)
	return nil
}

// Stop ends the sampling loop and waits for it. Safe to call twice, or
// without Start.
func (m *Metrics) Stop() {
	if m == nil {
		return
	}
	m.mu.Lock()
	cancel, done := m.cancel, m.done
	m.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}

// Sample reads the backlog of the buckets the watched node holds, and the
// lease table, each in one statement with SampleTimeout. The backlog is
// counted on the claim and active partial indexes only (store.BucketBacklog),
// never over finished tasks.
func (m *Metrics) Sample(ctx context.Context) error {
	m.mu.Lock()
	n := m.node
	m.mu.Unlock()
	sctx, cancel := context.WithTimeout(ctx, m.opts.SampleTimeout)
	defer cancel()
	now, err := m.store.Now(sctx)
	if err != nil {
		return fmt.Errorf("read the database clock: %w", err)
	}
	leases, err := m.store.ListBuckets(sctx)
	if err != nil {
		return fmt.Errorf("read the bucket leases: %w", err)
	}
	s := sample{at: time.Now()}
	for _, l := range leases {
		if l.Holder == "" || !l.ExpiresAt.After(now) {
			s.unheld++
		}
	}
	if n != nil {
		held := map[int]bool{}
		for _, h := range n.Held() {
			held[h.Bucket] = true
		}
		var backlog []store.Backlog
		if len(held) > 0 {
			if backlog, err = m.store.BucketBacklog(sctx); err != nil {
				return fmt.Errorf("read the backlog: %w", err)
			}
		}
		var oldest time.Time
		for _, b := range backlog {
			if !held[b.Bucket] {
				continue
			}
			s.queued += b.Queued
			s.waiting += b.Waiting
			s.active += b.Active
			if !b.OldestDue.IsZero() && (oldest.IsZero() || b.OldestDue.Before(oldest)) {
				oldest = b.OldestDue
			}
		}
		if !oldest.IsZero() {
			s.oldestDueAge = max(now.Sub(oldest), 0)
		}
	}
	m.mu.Lock()
	m.sample = s
	m.mu.Unlock()
	return nil
}
