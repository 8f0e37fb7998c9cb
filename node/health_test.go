package node

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestHealthAndReadiness(t *testing.T) {
	b := setup(t, withManualClock())
	s := &unreachable{Store: b.store}
	cfg := b.config(t, "health")
	n, err := New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	n.Register("work", noop)
	srv := httptest.NewServer(HealthHandler(n))
	defer srv.Close()
	get := func(path string) (int, Health) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var h Health
		if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, h
	}

	if code, h := get("/readyz"); code != http.StatusServiceUnavailable || h.Ready {
		t.Errorf("readyz before Start: %d %+v", code, h)
	}
	if err := n.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	if code, h := get("/healthz"); code != http.StatusOK || h.State != "running" {
		t.Errorf("healthz while running: %d %+v", code, h)
	}
	if code, h := get("/readyz"); code != http.StatusOK || !h.Ready || h.Held == "" {
		t.Errorf("readyz while running: %d %+v", code, h)
	}

	// The database stops answering: past a TTL without a renewal the node
	// is alive but not ready.
	s.setDown(true)
	b.manual.Advance(cfg.BucketLeaseTTL + time.Second)
	code, h := get("/readyz")
	if code != http.StatusServiceUnavailable || h.Ready || h.Reason == "" {
		t.Errorf("readyz with the database unreachable past the TTL: %d %+v", code, h)
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Errorf("healthz with the database unreachable: %d, want 200 (the process is alive)", code)
	}
	s.setDown(false)
	if err := n.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if code, h := get("/healthz"); code != http.StatusServiceUnavailable || h.State != "stopped" {
		t.Errorf("healthz after Shutdown: %d %+v", code, h)
	}
}
