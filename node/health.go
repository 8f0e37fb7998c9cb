package node

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// Health is what /healthz and /readyz report.
type Health struct {
	Node    string `json:"node"`
	State   string `json:"state"` // new, starting, running, stopped
	Ready   bool   `json:"ready"`
	Reason  string `json:"reason,omitempty"` // why not ready
	Held    string `json:"held"`             // the buckets served now
	Standby int    `json:"standby"`          // declared buckets another node holds
	// LastRenewal is when the database last answered a bucket lease
	// renewal (its sending time, on this node's clock).
	LastRenewal time.Time `json:"last_renewal"`
}

// Health reports the node's state. A node is ready while it runs and the
// database has answered a bucket lease renewal within the lease TTL: it can
// claim in what it holds, and take over what it stands by for. A node that
// holds nothing because live nodes hold all it declares is ready: it is
// doing its job as a standby.
func (n *Node) Health() Health {
	n.mu.Lock()
	st, k := n.state, n.keeper
	n.mu.Unlock()
	h := Health{Node: n.id, State: st.String()}
	if k == nil || st != stateRunning {
		h.Reason = "the node is " + h.State
		return h
	}
	held, standby, lastOK := k.status()
	h.Held, h.Standby, h.LastRenewal = describeHeld(held), standby, lastOK
	if age := n.cfg.Clock.Now().Sub(lastOK); age > n.cfg.BucketLeaseTTL {
		h.Reason = fmt.Sprintf("no bucket lease renewal answered for %v (TTL %v): the database is unreachable",
			age.Round(time.Millisecond), n.cfg.BucketLeaseTTL)
		return h
	}
	h.Ready = true
	return h
}

// HealthHandler serves /healthz (200 while the process runs a node that has
// not stopped) and /readyz (200 while Health says ready, 503 with the reason
// otherwise), each with the Health as JSON; and /metrics when the node's
// Config.Metrics serves HTTP (package metrics does).
func HealthHandler(n *Node) http.Handler {
	mux := http.NewServeMux()
	if h, ok := n.cfg.Metrics.(http.Handler); ok {
		mux.Handle("/metrics", h)
	}
	write := func(w http.ResponseWriter, ok bool, h Health) {
		w.Header().Set("Content-Type", "application/json")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(h)
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		h := n.Health()
		write(w, h.State == stateRunning.String() || h.State == stateStarting.String(), h)
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		h := n.Health()
		write(w, h.Ready, h)
	})
	return mux
}
