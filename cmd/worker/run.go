package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/urfave/cli/v2"
	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/hardening"
	"github.com/flotilla-dev/flotilla/kinds"
	"github.com/flotilla-dev/flotilla/metrics"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/rollup"
	"github.com/flotilla-dev/flotilla/store"
	storedsn "github.com/flotilla-dev/flotilla/store/dsn"
	"github.com/flotilla-dev/flotilla/store/sqlite"
)

func runCommand() *cli.Command {
	return &cli.Command{
		Name:      "run",
		Usage:     "run a node: hold the declared buckets and run their tasks until SIGTERM or SIGINT",
		ArgsUsage: " ",
		Flags: commonFlags(
			&cli.StringFlag{Name: "buckets", Usage: `the buckets this node declares, e.g. "0-31", or "all"; nodes that declare the same buckets share them`, DefaultText: "all"},
			&cli.BoolFlag{Name: "no-balance", Usage: "do not share the declared buckets with other nodes: hold every one no live node holds, and give none away unless an operator moves it"},
			&cli.DurationFlag{Name: "handoff-timeout", Value: node.DefaultHandoffTimeout, Usage: "how long a bucket handed to another node waits for its running handlers before they are cancelled and their tasks released for the next holder"},
			numBucketsFlag,
			&cli.StringFlag{Name: "node-id", Usage: "this node's name", DefaultText: "host-pid-random"},
			&cli.BoolFlag{Name: "wait-for-node-id", Usage: "when a live process still uses --node-id (a restart right after a crash), " +
				"wait until its liveness expires, then start, instead of exiting with status 3"},
			&cli.IntFlag{Name: "concurrency", Value: node.DefaultConcurrency, Usage: "handlers run at once"},
			&cli.StringFlag{Name: "capacity", Usage: `what this node has of each resource, e.g. "gpu=1,mem=8"; it starts a task only when its free capacity covers the task's --resources`, DefaultText: "none: no task that needs resources"},
			&cli.DurationFlag{Name: "bucket-lease-ttl", Value: node.DefaultBucketLeaseTTL, Usage: "bucket lease duration: how long a dead node's buckets wait for a successor"},
			&cli.DurationFlag{Name: "bucket-lease-heartbeat", Usage: "how often bucket leases are renewed", DefaultText: "TTL/3"},
			&cli.DurationFlag{Name: "task-lease-ttl", Value: node.DefaultTaskLeaseTTL, Usage: "task lease duration, renewed every TTL/3"},
			&cli.DurationFlag{Name: "shutdown-timeout", Value: node.DefaultShutdownTimeout, Usage: "how long shutdown waits for running handlers; a second SIGINT or SIGTERM stops waiting"},
			&cli.DurationFlag{Name: "poll-interval", Value: node.DefaultPollInterval, Usage: "how often to look for work when no notification arrives"},
			&cli.DurationFlag{Name: "reconcile-interval", Usage: "how often to rescue tasks of held buckets whose lease expired", DefaultText: "the task lease TTL"},
			&cli.DurationFlag{Name: "command-poll", Value: node.DefaultCommandPoll, Usage: "how often to read pending stop/pause commands when no notification arrives"},
			&cli.DurationFlag{Name: "stop-grace", Value: node.DefaultStopGrace, Usage: "how long a stopped handler may take to return before it is abandoned"},
			&cli.StringSliceFlag{Name: "allow-exec", Usage: "let exec tasks run this executable (repeatable); without it the node does not run the exec kind; prefer absolute paths"},
			&cli.StringSliceFlag{Name: "allow-exec-env", Usage: "let an exec task's payload set this environment variable (repeatable); without it a payload may set none. " +
				"Variables that make programs run other code (LD_*, BASH_*, PATH, PYTHON*, GIT_*, ...) are refused: see docs/exec.md"},
			&cli.StringFlag{Name: "exec-user", Usage: "run exec children as this user (name or uid), with its primary group and no supplementary group; needs the node to run as root"},
			&cli.DurationFlag{Name: "prune-interval", Value: node.DefaultPruneInterval, Usage: "how often, on average (jittered), to prune the finished tasks of held buckets past their retention"},
			&cli.IntFlag{Name: "prune-batch", Value: node.DefaultPruneBatch, Usage: "finished tasks removed per prune statement"},
			retentionFlags()[0], retentionFlags()[1],
			&cli.StringFlag{Name: "http", Usage: "serve /healthz, /readyz and /metrics (Prometheus) on this address, e.g. 127.0.0.1:8080"},
			&cli.BoolFlag{Name: "ui", Usage: "also serve the dashboard on --http (read-only unless --ui-token-file or $" + uiTokenEnv + ")"},
			&cli.StringFlag{Name: "ui-token-file", Usage: "file holding the token that allows the dashboard's actions (default: $" + uiTokenEnv + ")"},
		),
		Action: func(c *cli.Context) error {
			if err := noArgs(c, "did you mean --buckets?"); err != nil {
				return err
			}
			if err := checkRunFlags(c); err != nil {
				return err
			}
			// Before anything else, and in every case: children of the
			// node's uid must not read its environment or memory (the DSN
			// is there) through /proc. See internal/hardening.
			if err := hardening.DisableDumping(); err != nil {
				return fmt.Errorf("cannot protect the node's memory from its children: %w", err)
			}
			cfg := node.Config{
				NodeID: c.String("node-id"), NumBuckets: c.Int(numBucketsFlag.Name),
				Concurrency: c.Int("concurrency"), BucketLeaseTTL: c.Duration("bucket-lease-ttl"),
				BucketLeaseHeartbeat: c.Duration("bucket-lease-heartbeat"), TaskLeaseTTL: c.Duration("task-lease-ttl"),
				ShutdownTimeout: c.Duration("shutdown-timeout"), PollInterval: c.Duration("poll-interval"),
				ReconcileInterval: c.Duration("reconcile-interval"),
				CommandPoll:       c.Duration("command-poll"), StopGrace: c.Duration("stop-grace"),
				Version: version, AllBuckets: !c.IsSet("buckets") || c.String("buckets") == "all",
				NoBalance: c.Bool("no-balance"), HandoffTimeout: c.Duration("handoff-timeout"),
			}
			// The bucket set is checked before anything connects; its upper
			// bound once the fleet's count is known.
			if c.IsSet("buckets") && !cfg.AllBuckets {
				set, err := bucket.ParseSet(c.String("buckets"), 0)
				if err != nil {
					return invalid(fmt.Errorf("invalid --buckets: %w", err))
				}
				cfg.Buckets = set
			}
			ret, err := parseRetention(c)
			if err != nil {
				return err
			}
			cfg.Retention = ret
			cfg.PruneInterval, cfg.PruneBatch = c.Duration("prune-interval"), c.Int("prune-batch")
			if c.IsSet("capacity") {
				capacity, err := parseResourcesFlag(c, "capacity")
				if err != nil {
					return err
				}
				cfg.Capacity = capacity
			}
			if c.IsSet(numBucketsFlag.Name) {
				if _, err := bucket.NewPolicy(cfg.NumBuckets); err != nil {
					return invalid(fmt.Errorf("invalid --num-buckets: %w", err))
				}
			}
			log, err := newLogger(c, c.App.ErrWriter)
			if err != nil {
				return err
			}
			defer func() { _ = log.Sync() }()
			cfg.Logger = log
			if err := node.ValidateConfig(cfg); err != nil {
				return invalid(err)
			}
			exec, err := execConfig(c, cfg.StopGrace)
			if err != nil {
				return err
			}
			dsn, target, origin, err := requireDSNFrom(c)
			if err != nil {
				return err
			}
			// The node keeps the DSN in memory only. Unsetting it does not
			// change /proc/<pid>/environ, which shows the environment the
			// process started with: DisableDumping above is what keeps
			// children from reading that.
			if err := os.Unsetenv(dsnEnv); err != nil {
				return fmt.Errorf("unset %s: %w", dsnEnv, err)
			}
			if origin == dsnDefault {
				log.Info("no --dsn, --dsn-file or $"+dsnEnv+": using the SQLite file in the working directory",
					zap.String("path", target.Path))
			}
			if origin == dsnFromFlag && hasPassword(dsn) {
				log.Warn("the database password was given on the command line, which every user of this host can read " +
					"(ps, /proc/<pid>/cmdline): give the connection string through " + dsnEnv + " or --dsn-file instead")
			}
			if err := checkDeclaredRange(c.Context, dsn, cfg); err != nil {
				return err
			}
			if err := checkListenAddr("--http", c.String("http")); err != nil {
				return err
			}
			if c.Bool("ui") && c.String("http") == "" {
				return invalid(errors.New("--ui serves the dashboard on --http: give --http too, e.g. --http 127.0.0.1:8080"))
			}
			uiTok, err := uiToken(c, "ui-token-file")
			if err != nil {
				return err
			}
			return runNode(c.Context, target, c.String("http"), cfg, exec, c.Bool("wait-for-node-id"), log,
				httpOptions{ui: c.Bool("ui"), uiToken: uiTok, dsn: dsn, target: target})
		},
	}
}

// checkListenAddr refuses an address that net.Listen could not read, before
// anything connects: it must be HOST:PORT (HOST may be empty), the port a
// number from 0 to 65535 or a service name. "" is no address.
func checkListenAddr(flag, addr string) error {
	if addr == "" {
		return nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		_, err = net.LookupPort("tcp", port)
	}
	if err != nil {
		return invalid(fmt.Errorf("invalid %s %q: give HOST:PORT, e.g. 127.0.0.1:8080 (%w)", flag, addr, err))
	}
	return nil
}

// listenError says why listening on addr failed: an address that does not
// resolve is invalid input; one in use, or not this host's, is not.
func listenError(flag, addr string, err error) error {
	var dnsErr *net.DNSError
	var addrErr *net.AddrError
	if errors.As(err, &dnsErr) || errors.As(err, &addrErr) {
		return invalid(fmt.Errorf("invalid %s %q: %w", flag, addr, err))
	}
	return fmt.Errorf("%s %s: %w", flag, addr, err)
}

// execConfig maps the exec flags onto kinds.ExecConfig and checks it, so
// that a node refuses to start (exit 2) rather than fail every exec task.
func execConfig(c *cli.Context, grace time.Duration) (kinds.ExecConfig, error) {
	cfg := kinds.ExecConfig{
		Allowed:    c.StringSlice("allow-exec"),
		AllowedEnv: c.StringSlice("allow-exec-env"),
		Grace:      grace,
	}
	if c.IsSet("exec-user") {
		u, err := kinds.LookupExecUser(c.String("exec-user"))
		if err != nil {
			return cfg, invalid(fmt.Errorf("invalid --exec-user: %w", err))
		}
		cfg.User = u
	}
	if err := cfg.Validate(); err != nil {
		return cfg, invalid(err)
	}
	return cfg, nil
}

// runNode connects, brings the schema up to date, starts the node and runs
// it until a signal asks it to stop.
// httpOptions is what --http serves besides health checks and metrics.
type httpOptions struct {
	ui      bool   // the dashboard
	uiToken string // its token; "" for a read-only dashboard
	// The database, for the dashboard's pool of its own.
	dsn    string
	target storedsn.Target
}

func runNode(ctx context.Context, target storedsn.Target, httpAddr string, cfg node.Config, exec kinds.ExecConfig, waitForID bool,
	log *zap.Logger, opts httpOptions) error {
	// A node sets its fleet up if nobody has: the database, the schema, the
	// bucket count. Both steps are safe to race with other nodes.
	if created, err := target.Ensure(ctx); err != nil {
		return err
	} else if created {
		log.Info("created the database")
	}
	s, err := target.Open(ctx)
	if err != nil {
		return err
	}
	defer s.Close()
	if target.Kind == storedsn.SQLite {
		if open := sqlite.ReadableByOthers(target.Path); len(open) > 0 {
			log.Warn("the database's files are readable by other users of this host, with every payload and result "+
				"in them: make them the node's user's alone (chmod 600), as the files created now are",
				zap.Strings("files", open))
		}
	}
	if _, err := s.Migrate(ctx, cfg.NumBuckets); err != nil {
		return err
	}
	m, err := nodeMetrics(s, httpAddr, log)
	if err != nil {
		return err
	}
	// The per-minute counts of ended attempts, for the dashboard's charts,
	// pass every fact on to the Prometheus metrics when --http serves them.
	var next node.Metrics
	if m != nil {
		next = m
		cfg.Middleware = append(cfg.Middleware, m.Middleware())
	}
	cfg.Middleware = append(cfg.Middleware, adviseFlags)
	counts := rollup.New(s, rollup.Options{Next: next, Logger: log})
	cfg.Metrics = counts
	n, err := node.New(s, cfg)
	if err != nil {
		return invalid(err)
	}
	if err := counts.Start(ctx, n.ID()); err != nil {
		return err
	}
	defer counts.Stop()
	m.Watch(n)
	kinds.Register(n)
	// A node that may run nothing does not advertise the exec kind, so
	// that an exec task is refused at submit rather than failed here.
	if len(exec.Allowed) > 0 {
		kinds.RegisterExec(n, exec)
	}
	return serveNode(ctx, s, n, m, httpAddr, opts, cfg, waitForID, log)
}

// serveNode starts the node and runs it until SIGINT or SIGTERM, then shuts
// it down; a second signal stops waiting for running handlers.
func serveNode(ctx context.Context, s store.Store, n *node.Node, m *metrics.Metrics, httpAddr string, opts httpOptions,
	cfg node.Config, waitForID bool, log *zap.Logger) error {
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(signals)
	runCtx, stopRunning := context.WithCancel(ctx)
	defer stopRunning()
	// Shutdown's context ends only on the second signal: the first lets
	// the node wait up to --shutdown-timeout for its handlers.
	shutdownCtx, force := context.WithCancel(context.WithoutCancel(ctx))
	defer force()
	done := make(chan struct{})
	watched := make(chan struct{})
	defer func() {
		close(done)
		<-watched // nothing is logged once serveNode has returned
	}()
	go func() {
		defer close(watched)
		// Only a signal asks for a shutdown: a start that failed ends
		// serveNode with its own error, which says what went wrong.
		select {
		case <-signals:
		case <-done:
			return
		}
		log.Info("shutting down: waiting up to "+shutdownTimeout(cfg).String()+
			" for running handlers; press Ctrl-C again to force", zap.String("node", n.ID()))
		stopRunning()
		select {
		case sig := <-signals:
			log.Warn("forcing the exit: every handler is cancelled, and those that return within "+
				node.ForcedExitGrace.String()+" have their tasks released to queued; the others are left running, "+
				"their buckets to lapse, so that their tasks are rescued after the lease expires; every other bucket is released",
				zap.String("signal", sig.String()), zap.String("node", n.ID()))
			force()
		case <-done:
		}
	}()
	if httpAddr != "" {
		// Listen before starting, so that a taken address fails the start
		// rather than a running node.
		ln, err := net.Listen("tcp", httpAddr)
		if err != nil {
			return listenError("--http", httpAddr, err)
		}
		handler, closeUI, err := nodeHTTP(ctx, s, n, opts, ln.Addr(), log)
		if err != nil {
			_ = ln.Close()
			return err
		}
		defer closeUI()
		srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer func() { _ = srv.Close() }()
		log.Info("serving health checks and metrics", zap.String("addr", ln.Addr().String()), zap.Bool("dashboard", opts.ui))
	}
	if err := startNode(runCtx, s, n, cfg, waitForID, log); err != nil {
		if runCtx.Err() != nil {
			return nil // asked to stop before the node started
		}
		return err
	}
	if err := m.Start(runCtx); err != nil {
		return err
	}
	defer m.Stop()
	<-runCtx.Done()
	return n.Shutdown(shutdownCtx)
}

func shutdownTimeout(cfg node.Config) time.Duration {
	if cfg.ShutdownTimeout > 0 {
		return cfg.ShutdownTimeout
	}
	return node.DefaultShutdownTimeout
}

// startNode starts the node. Under --wait-for-node-id, while another live
// incarnation uses the node id (a restart right after a crash: the old one
// is dead but its liveness has not expired), it logs whom it waits on and
// until when, waits, and tries again.
func startNode(ctx context.Context, s store.Store, n *node.Node, cfg node.Config, waitForID bool, log *zap.Logger) error {
	for {
		err := n.Start(ctx)
		var alive *store.NodeAliveError
		if err == nil || !waitForID || !errors.As(err, &alive) {
			return err
		}
		until, wait := aliveUntil(ctx, s, alive, cfg)
		log.Info("waiting for the node id's live incarnation to expire before starting",
			zap.String("node", alive.NodeID), zap.String("incarnation", alive.Incarnation),
			zap.Time("until", until), zap.Duration("wait", wait))
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
		}
	}
}

// aliveUntil reads when the incarnation that holds the node id stops being
// live, by the database clock, and how long that is from now; when it
// cannot tell, a third of the bucket lease TTL, the heartbeat's period.
func aliveUntil(ctx context.Context, s store.Store, alive *store.NodeAliveError, cfg node.Config) (time.Time, time.Duration) {
	ttl := cfg.BucketLeaseTTL
	if ttl <= 0 {
		ttl = node.DefaultBucketLeaseTTL
	}
	fallback := ttl / 3
	nodes, err := s.ListNodes(ctx)
	if err != nil {
		return time.Time{}, fallback
	}
	now, err := s.Now(ctx)
	if err != nil {
		return time.Time{}, fallback
	}
	for _, ni := range nodes {
		if ni.ID == alive.NodeID && ni.Incarnation == alive.Incarnation {
			// A little past the expiry, so that the database sees it
			// expired whatever the rounding.
			return ni.ExpiresAt, max(ni.ExpiresAt.Sub(now)+50*time.Millisecond, 50*time.Millisecond)
		}
	}
	return time.Time{}, fallback
}

// checkRunFlags refuses run's flags that would be silently changed or that
// cannot work: a node id store.CheckName refuses, a concurrency below 1
// (node.Config would take 0 for its default), negative durations.
func checkRunFlags(c *cli.Context) error {
	if err := checkNameFlag(c, "node-id", false); err != nil {
		return err
	}
	if err := checkPositive(c, "concurrency"); err != nil {
		return err
	}
	if n := c.Int("prune-batch"); n < 1 || n > store.MaxPruneBatch {
		return invalid(fmt.Errorf("--prune-batch %d is out of range: give 1 to %d", n, store.MaxPruneBatch))
	}
	for _, name := range []string{"bucket-lease-ttl", "bucket-lease-heartbeat", "task-lease-ttl", "shutdown-timeout",
		"poll-interval", "reconcile-interval", "command-poll", "stop-grace", "prune-interval", "handoff-timeout"} {
		if err := checkDurationFlag(c, name, true); err != nil {
			return err
		}
	}
	return nil
}

// checkDeclaredRange refuses --buckets beyond the fleet's count before
// anything is created: against --num-buckets when given; else, when the
// set reaches past a new fleet's count, against the existing fleet's count,
// or a new fleet's when there is no fleet yet (the database or its schema
// missing), so that a refused node leaves no database or schema behind.
func checkDeclaredRange(ctx context.Context, dsn string, cfg node.Config) error {
	if cfg.AllBuckets {
		return nil
	}
	if cfg.NumBuckets != 0 {
		if err := cfg.Buckets.CheckRange(cfg.NumBuckets); err != nil {
			return invalid(fmt.Errorf("invalid --buckets for --num-buckets %d: %w", cfg.NumBuckets, err))
		}
		return nil
	}
	if cfg.Buckets.CheckRange(bucket.DefaultCount) == nil {
		return nil // within every fleet's count
	}
	s, meta, err := openFleet(ctx, dsn)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		s.Close()
		if err := cfg.Buckets.CheckRange(meta.NumBuckets); err != nil {
			return invalid(fmt.Errorf("invalid --buckets for this fleet: %w", err))
		}
		return nil
	case errors.Is(err, store.ErrSchema), errors.As(err, &pgErr) && pgErr.Code == "3D000": // invalid_catalog_name
		if err := cfg.Buckets.CheckRange(bucket.DefaultCount); err != nil {
			return invalid(fmt.Errorf("invalid --buckets: there is no fleet yet, and a new one has %d buckets: %w "+
				"(give --num-buckets to create it with more)", bucket.DefaultCount, err))
		}
		return nil
	}
	return err
}
