// Command testworker is the node the fault scenarios of test/integration
// run: a flotilla node with the stock kinds, as `worker run` has them, plus
// the probe kind, which records every execution in a ledger table so that a
// test can prove that no two attempts of a task overlapped and that no task
// succeeded twice.
//
// Its flags mirror `worker run`'s. Three are its own: --ledger-dsn, the
// database the probe writes its ledger to (the test's database, reached
// directly, so that a proxy that cuts the node off from the fleet's store
// does not blind the ledger too); --ledger-file, a file the probe appends its
// ledger to instead (a fleet on SQLite); and --max-conns, to keep the pool
// of a fleet of several nodes small on a shared server. --dsn may name an
// SQLite file (sqlite:PATH).
//
// The ledger table is created by the test (see LedgerSchema in
// test/integration); the worker only writes to it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/flotilla-dev/flotilla/bucket"
	"github.com/flotilla-dev/flotilla/kinds"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store"
	storedsn "github.com/flotilla-dev/flotilla/store/dsn"
	"github.com/flotilla-dev/flotilla/store/postgres"
)

// Exit statuses, as `worker run` uses them.
const (
	exitFailure = 1
	exitInvalid = 2
	exitRefused = 3
)

func main() {
	os.Exit(run())
}

func run() int {
	fs := flag.NewFlagSet("testworker", flag.ContinueOnError)
	var (
		dsn          = fs.String("dsn", os.Getenv("FLOTILLA_DSN"), "the fleet's database (default $FLOTILLA_DSN)")
		ledgerDSN    = fs.String("ledger-dsn", "", "the database of the probe ledger (default: --dsn)")
		ledgerFile   = fs.String("ledger-file", "", "append the probe ledger to this file instead, as JSON lines")
		noBalance    = fs.Bool("no-balance", false, "do not share the declared buckets with other nodes")
		handoff      = fs.Duration("handoff-timeout", node.DefaultHandoffTimeout, "how long a hand-off waits for handlers")
		buckets      = fs.String("buckets", "", "the buckets this node declares (default: every bucket)")
		nodeID       = fs.String("node-id", "", "this node's name")
		concurrency  = fs.Int("concurrency", node.DefaultConcurrency, "handlers run at once")
		leaseTTL     = fs.Duration("bucket-lease-ttl", node.DefaultBucketLeaseTTL, "bucket lease duration")
		heartbeat    = fs.Duration("bucket-lease-heartbeat", 0, "bucket lease renewal period (default TTL/3)")
		taskLeaseTTL = fs.Duration("task-lease-ttl", node.DefaultTaskLeaseTTL, "task lease duration")
		shutdown     = fs.Duration("shutdown-timeout", node.DefaultShutdownTimeout, "how long shutdown waits for handlers")
		pollInterval = fs.Duration("poll-interval", node.DefaultPollInterval, "claim poll period")
		reconcile    = fs.Duration("reconcile-interval", 0, "rescue period (default: the task lease TTL)")
		commandPoll  = fs.Duration("command-poll", node.DefaultCommandPoll, "command poll period")
		stopGrace    = fs.Duration("stop-grace", node.DefaultStopGrace, "how long a stopped handler may take")
		misfire      = fs.Duration("schedule-misfire", 0, "how late a schedule tick may fire as on time (default schedule.DefaultMisfire)")
		maxConns     = fs.Int("max-conns", 4, "the store's pool size")
		httpAddr     = fs.String("http", "", "serve /healthz and /readyz on this address")
		logLevel     = fs.String("log-level", "info", "debug, info, warn or error")
	)
	var allowExec []string
	fs.Func("allow-exec", "let exec tasks run this executable (repeatable)", func(v string) error {
		allowExec = append(allowExec, v)
		return nil
	})
	var allowExecEnv []string
	fs.Func("allow-exec-env", "let an exec payload set this environment variable (repeatable)", func(v string) error {
		allowExecEnv = append(allowExecEnv, v)
		return nil
	})
	if err := fs.Parse(os.Args[1:]); err != nil {
		return exitInvalid
	}
	level, err := zapcore.ParseLevel(*logLevel)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testworker: invalid --log-level %q\n", *logLevel)
		return exitInvalid
	}
	encCfg := zap.NewProductionEncoderConfig()
	encCfg.EncodeTime = zapcore.RFC3339NanoTimeEncoder
	encCfg.EncodeDuration = zapcore.StringDurationEncoder
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(encCfg), zapcore.Lock(os.Stderr), level))
	defer func() { _ = log.Sync() }()

	cfg := node.Config{
		NodeID: *nodeID, Concurrency: *concurrency,
		BucketLeaseTTL: *leaseTTL, BucketLeaseHeartbeat: *heartbeat, TaskLeaseTTL: *taskLeaseTTL,
		ShutdownTimeout: *shutdown, PollInterval: *pollInterval, ReconcileInterval: *reconcile,
		CommandPoll: *commandPoll, StopGrace: *stopGrace, ScheduleMisfire: *misfire,
		AllBuckets: *buckets == "" || *buckets == "all", Logger: log, Version: "testworker",
		NoBalance: *noBalance, HandoffTimeout: *handoff,
	}
	if !cfg.AllBuckets {
		set, err := bucket.ParseSet(*buckets, 0)
		if err != nil {
			log.Error("invalid --buckets", zap.Error(err))
			return exitInvalid
		}
		cfg.Buckets = set
	}
	if err := node.ValidateConfig(cfg); err != nil {
		log.Error("invalid configuration", zap.Error(err))
		return exitInvalid
	}
	if *dsn == "" {
		log.Error("no database: give --dsn or set FLOTILLA_DSN")
		return exitInvalid
	}
	if *ledgerDSN == "" && *ledgerFile == "" {
		*ledgerDSN = *dsn
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	exec := kinds.ExecConfig{Allowed: allowExec, AllowedEnv: allowExecEnv, Grace: cfg.StopGrace}
	if err := exec.Validate(); err != nil {
		log.Error("invalid exec configuration", zap.Error(err))
		return exitInvalid
	}
	if err := serve(ctx, *dsn, ledgerAt{dsn: *ledgerDSN, file: *ledgerFile}, *maxConns, *httpAddr, cfg, exec, log); err != nil {
		log.Error("testworker failed", zap.Error(err))
		if errors.Is(err, store.ErrNodeAlive) {
			return exitRefused
		}
		return exitFailure
	}
	return 0
}

// serve runs the node until ctx ends, then shuts it down gracefully.
func serve(ctx context.Context, dsn string, at ledgerAt, maxConns int, httpAddr string, cfg node.Config,
	exec kinds.ExecConfig, log *zap.Logger) error {
	startCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	s, err := openStore(startCtx, dsn, maxConns)
	if err != nil {
		return err
	}
	defer s.Close()
	if _, err := s.Migrate(startCtx, 0); err != nil {
		return err
	}
	ledger, err := openLedger(startCtx, at, log)
	if err != nil {
		return err
	}
	defer ledger.close()

	n, err := node.New(s, cfg)
	if err != nil {
		return err
	}
	kinds.Register(n)
	kinds.RegisterExec(n, exec)
	n.Register(ProbeKind, ledger.probe)

	if httpAddr != "" {
		ln, err := net.Listen("tcp", httpAddr)
		if err != nil {
			return fmt.Errorf("--http %s: %w", httpAddr, err)
		}
		srv := &http.Server{Handler: node.HealthHandler(n), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer func() { _ = srv.Close() }()
		log.Info("serving health checks", zap.String("addr", ln.Addr().String()))
	}
	if err := n.Start(startCtx); err != nil {
		return err
	}
	log.Info("testworker started", zap.Int("pid", os.Getpid()), zap.String("incarnation", n.Incarnation()))
	<-ctx.Done()
	log.Info("shutting down", zap.String("node", n.ID()))
	return n.Shutdown(context.Background())
}

// openStore opens the fleet's store: PostgreSQL with a small pool, or the
// SQLite file a sqlite: DSN names.
func openStore(ctx context.Context, dsn string, maxConns int) (store.Store, error) {
	target, err := storedsn.Parse(dsn)
	if err != nil {
		return nil, err
	}
	if target.Kind == storedsn.SQLite {
		return target.Open(ctx)
	}
	return postgres.New(ctx, dsn, postgres.WithMaxConns(maxConns), postgres.WithApplicationName("flotilla-testworker"))
}
