package flotillatest

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/task"
)

// Fleet is a fleet of one node on a temporary SQLite file, for a test: the
// node runs what register registered, and the client submits and reads.
type Fleet struct {
	Client *flotilla.Client
	Node   *node.Node
	// DSN is the file's, for a second client or a process of the test's.
	DSN string

	t testing.TB
}

// FleetOption configures NewFleet.
type FleetOption func(*fleetOptions)

type fleetOptions struct {
	config     node.Config
	numBuckets int
	client     []flotilla.ClientOption
}

// WithNodeConfig starts the node with cfg (AllBuckets unless it declares
// Buckets; the test's short intervals where it leaves them zero).
func WithNodeConfig(cfg node.Config) FleetOption {
	return func(o *fleetOptions) { o.config = cfg }
}

// WithNumBuckets sets the fleet's bucket count (default 16).
func WithNumBuckets(n int) FleetOption { return func(o *fleetOptions) { o.numBuckets = n } }

// WithClientOptions opens the fleet's client with opts
// (flotilla.WithSubmitMiddleware, ...).
func WithClientOptions(opts ...flotilla.ClientOption) FleetOption {
	return func(o *fleetOptions) { o.client = append(o.client, opts...) }
}

// NewFleet migrates a new SQLite file in t.TempDir(), opens a client on it,
// registers the handlers with register (flotilla.Handle, node.Register) and
// starts a node that holds every bucket. The test's end shuts the node down
// (letting running handlers finish, for up to ShutdownTimeout) and closes
// the client; a failure fails the test.
//
// Unless the node's configuration says otherwise, retries wait 1 to 100 ms,
// not seconds, and the node looks for work every 20 ms as well as when it is
// told of it.
func NewFleet(t testing.TB, register func(n *node.Node) error, opts ...FleetOption) *Fleet {
	t.Helper()
	o := fleetOptions{numBuckets: 16}
	for _, opt := range opts {
		opt(&o)
	}
	ctx := t.Context()
	dsn := "sqlite:" + filepath.Join(t.TempDir(), "fleet.db")
	if err := flotilla.Migrate(ctx, dsn, flotilla.WithNumBuckets(o.numBuckets)); err != nil {
		t.Fatalf("flotillatest: %v", err)
	}
	c, err := flotilla.Connect(ctx, dsn, o.client...)
	if err != nil {
		t.Fatalf("flotillatest: %v", err)
	}
	t.Cleanup(c.Close)

	cfg := o.config
	if cfg.NodeID == "" {
		cfg.NodeID = "flotillatest"
	}
	if cfg.Buckets.Empty() {
		cfg.AllBuckets = true
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 20 * time.Millisecond
	}
	if cfg.BackoffBase == 0 && cfg.BackoffMax == 0 {
		cfg.BackoffBase, cfg.BackoffMax = time.Millisecond, 100*time.Millisecond
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = 10 * time.Second
	}
	n, err := node.New(c.Store(), cfg)
	if err != nil {
		t.Fatalf("flotillatest: %v", err)
	}
	if register != nil {
		if err := register(n); err != nil {
			t.Fatalf("flotillatest: register the handlers: %v", err)
		}
	}
	if err := n.Start(ctx); err != nil {
		t.Fatalf("flotillatest: start the node: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout+5*time.Second)
		defer cancel()
		if err := n.Shutdown(ctx); err != nil {
			t.Errorf("flotillatest: shut the node down: %v", err)
		}
	})
	return &Fleet{Client: c, Node: n, DSN: dsn, t: t}
}

// Wait waits for task id to end, and returns it as it ended; it fails the
// test when the test's context ends first, or after a minute.
func (f *Fleet) Wait(id int64) *task.Task {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.t.Context(), time.Minute)
	defer cancel()
	t, err := f.Client.Wait(ctx, id)
	if err != nil {
		f.t.Fatalf("flotillatest: wait for task %d: %v", id, err)
	}
	return t
}
