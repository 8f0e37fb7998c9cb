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

	"github.com/urfave/cli/v2"
	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/internal/hardening"
	"github.com/flotilla-dev/flotilla/kinds"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store"
	storedsn "github.com/flotilla-dev/flotilla/store/dsn"
)

func runCommand() *cli.Command {
	return &cli.Command{
		Name:      "run",
		Usage:     "run a node: hold the declared buckets and run their tasks until SIGTERM or SIGINT",
		ArgsUsage: " ",
		Flags: commonFlags(
			&cli.StringFlag{Name: "buckets", Usage: `the buckets this node declares, e.g. "0-31" (default: every bucket)`},
			numBucketsFlag,
			&cli.StringFlag{Name: "node-id", Usage: "this node's name (default: host-pid-random)"},
			&cli.IntFlag{Name: "concurrency", Value: node.DefaultConcurrency, Usage: "handlers run at once"},
			&cli.DurationFlag{Name: "bucket-lease-ttl", Value: node.DefaultBucketLeaseTTL, Usage: "bucket lease duration: how long a dead node's buckets wait for a successor"},
			&cli.DurationFlag{Name: "bucket-lease-heartbeat", Usage: "how often bucket leases are renewed (default: TTL/3)"},
			&cli.DurationFlag{Name: "task-lease-ttl", Value: node.DefaultTaskLeaseTTL, Usage: "task lease duration, renewed every TTL/3"},
			&cli.DurationFlag{Name: "shutdown-timeout", Value: node.DefaultShutdownTimeout, Usage: "how long shutdown waits for running handlers"},
			&cli.DurationFlag{Name: "poll-interval", Value: node.DefaultPollInterval, Usage: "how often to look for work when no notification arrives"},
			&cli.DurationFlag{Name: "reconcile-interval", Usage: "how often to rescue tasks of held buckets whose lease expired (default: the task lease TTL)"},
			&cli.DurationFlag{Name: "command-poll", Value: node.DefaultCommandPoll, Usage: "how often to read pending stop/pause commands when no notification arrives"},
			&cli.DurationFlag{Name: "stop-grace", Value: node.DefaultStopGrace, Usage: "how long a stopped handler may take to return before it is abandoned"},
			&cli.StringSliceFlag{Name: "allow-exec", Usage: "let exec tasks run this executable (repeatable); without it exec tasks fail; prefer absolute paths"},
			&cli.StringSliceFlag{Name: "allow-exec-env", Usage: "let an exec task's payload set this environment variable (repeatable); without it a payload may set none. " +
				"Variables that make programs run other code (LD_*, BASH_*, PATH, PYTHON*, GIT_*, ...) are refused: see docs/exec.md"},
			&cli.StringFlag{Name: "exec-user", Usage: "run exec children as this user (name or uid), with its primary group and no supplementary group; needs the node to run as root"},
			&cli.StringFlag{Name: "http", Usage: "serve /healthz and /readyz on this address, e.g. 127.0.0.1:8080"},
		),
		Action: func(c *cli.Context) error {
			if err := noArgs(c, "did you mean --buckets?"); err != nil {
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
				Version: version, AllBuckets: !c.IsSet("buckets"),
			}
			// The bucket set is checked before anything connects; its upper
			// bound once the fleet's count is known.
			if c.IsSet("buckets") {
				set, err := bucket.ParseSet(c.String("buckets"), 0)
				if err != nil {
					return invalid(fmt.Errorf("invalid --buckets: %w", err))
				}
				cfg.Buckets = set
			}
			if cfg.NumBuckets != 0 {
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
			return runNode(c.Context, target, c.String("http"), cfg, exec, log)
		},
	}
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
func runNode(ctx context.Context, target storedsn.Target, httpAddr string, cfg node.Config, exec kinds.ExecConfig, log *zap.Logger) error {
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
	if _, err := s.Migrate(ctx, cfg.NumBuckets); err != nil {
		return startError(err)
	}
	n, err := node.New(s, cfg)
	if err != nil {
		return invalid(err)
	}
	kinds.Register(n)
	kinds.RegisterExec(n, exec)

	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if httpAddr != "" {
		// Listen before starting, so that a taken address fails the start
		// rather than a running node.
		ln, err := net.Listen("tcp", httpAddr)
		if err != nil {
			return fmt.Errorf("--http %s: %w", httpAddr, err)
		}
		srv := &http.Server{Handler: node.HealthHandler(n), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer func() { _ = srv.Close() }()
		log.Info("serving health checks", zap.String("addr", ln.Addr().String()))
	}
	if err := n.Start(ctx); err != nil {
		return startError(err)
	}
	<-ctx.Done()
	log.Info("shutting down", zap.String("node", n.ID()))
	return n.Shutdown(context.Background())
}

func startError(err error) error {
	switch {
	case errors.Is(err, bucket.ErrInvalidSet), errors.Is(err, store.ErrBucketCount):
		return invalid(err)
	case errors.Is(err, store.ErrNodeAlive), errors.Is(err, store.ErrSchema):
		return refused(err)
	}
	return err
}
