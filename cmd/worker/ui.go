package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"
	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla/dashboard"
	"github.com/flotilla-dev/flotilla/metrics"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/store"
	storedsn "github.com/flotilla-dev/flotilla/store/dsn"
	"github.com/flotilla-dev/flotilla/store/postgres"
	"github.com/flotilla-dev/flotilla/store/sqlite"
)

// uiTokenEnv stands in for --token-file: the dashboard's token, which turns
// its actions on.
const uiTokenEnv = "FLOTILLA_UI_TOKEN"

// defaultUIListen keeps the dashboard on this host unless asked otherwise.
const defaultUIListen = "127.0.0.1:8089"

func uiCommand() *cli.Command {
	return &cli.Command{
		Name:      "ui",
		Usage:     "serve the dashboard: the bucket map, nodes, tasks, pipelines and schedules (needs only the database)",
		ArgsUsage: " ",
		Flags: commonFlags(
			&cli.StringFlag{Name: "listen", Value: defaultUIListen, Usage: "address to serve on; other hosts reach it only if you bind more than loopback"},
			&cli.StringFlag{Name: "token-file", Usage: "file holding the token that operators sign in with (default: $" + uiTokenEnv + "; without either the dashboard is read-only and open to read); refused unless only its owner may read it"},
			&cli.StringFlag{Name: "auth", Usage: `what the token guards: "all" (reading needs signing in too) or "actions" (anyone who reaches the address reads every page)`, DefaultText: "all, with a token"},
			&cli.StringSliceFlag{Name: "trusted-proxy", Usage: "address or CIDR of a TLS proxy in front of the dashboard (repeatable): its X-Forwarded-Proto: https makes the session cookie Secure, its X-Forwarded-For names the client the sign-in limit counts"},
			&cli.StringSliceFlag{Name: "secret-field", Usage: "mask payload and result fields whose names contain this too (repeatable), besides " + strings.Join(dashboard.DefaultSecretFields, ", ")},
			&cli.DurationFlag{Name: "query-timeout", Value: dashboard.DefaultQueryTimeout, Usage: "statement timeout of every page's queries"},
		),
		Action: func(c *cli.Context) error {
			if err := noArgs(c, "did you mean --listen?"); err != nil {
				return err
			}
			qt := c.Duration("query-timeout")
			if qt <= 0 {
				return invalid(fmt.Errorf("invalid --query-timeout %v: give a positive duration such as 2s", qt))
			}
			token, err := uiToken(c, "token-file")
			if err != nil {
				return err
			}
			cfg, err := uiConfig(c, token)
			if err != nil {
				return err
			}
			log, err := newLogger(c, c.App.ErrWriter)
			if err != nil {
				return err
			}
			defer func() { _ = log.Sync() }()
			dsn, target, err := requireDSN(c)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			s, err := openConsoleStore(ctx, dsn, target, qt, uiMaxConns, token != "")
			if err != nil {
				return err
			}
			defer s.Close()
			cfg.Store, cfg.QueryTimeout, cfg.Logger = s, qt, log
			d, err := dashboard.New(ctx, cfg)
			if err != nil {
				return err
			}
			defer d.Close()
			ln, err := net.Listen("tcp", c.String("listen"))
			if err != nil {
				return invalid(fmt.Errorf("--listen %s: %w", c.String("listen"), err))
			}
			srv := &http.Server{Handler: d, ReadHeaderTimeout: 5 * time.Second}
			go func() { _ = srv.Serve(ln) }()
			warnIfExposed(log, ln.Addr())
			log.Info("serving the dashboard", zap.String("addr", ln.Addr().String()), zap.Bool("actions", token != ""),
				zap.String("auth", string(d.Auth())))
			<-ctx.Done()
			d.Close() // ends the live streams, so that Shutdown does not wait for them
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return srv.Shutdown(sctx)
		},
	}
}

// openSQLiteDashboard opens the SQLite file of the dashboard, never
// creating one: read-only, unless its token allows actions (stop, pause,
// resume), which write.
func openSQLiteDashboard(ctx context.Context, target storedsn.Target, actions bool) (store.Store, error) {
	if !actions {
		s, err := target.OpenReadOnly(ctx)
		return s, noFileHint(err)
	}
	if ok, err := target.Exists(); err != nil {
		return nil, err
	} else if !ok {
		return nil, noFileHint(&sqlite.NoFileError{Path: target.Path})
	}
	return target.Open(ctx)
}

// Pools of the dashboard's own on PostgreSQL: its pages never wait for a
// node's claims and lease renewals, nor those for its pages.
const (
	uiMaxConns   = 8 // `worker ui`, a process of its own
	nodeUIConns  = 3 // `worker run --ui`, beside the node's pool
	uiAppName    = "flotilla-ui"
	nodeUIPrefix = "the dashboard of `worker run --ui`"
)

// openConsoleStore opens the store the dashboard reads: on PostgreSQL a
// pool of its own, of at most conns connections, each statement bounded by
// qt on the server too; on SQLite the file.
func openConsoleStore(ctx context.Context, dsn string, target storedsn.Target, qt time.Duration, conns int, actions bool) (store.Store, error) {
	if target.Kind != storedsn.PostgreSQL {
		return openSQLiteDashboard(ctx, target, actions)
	}
	// The server also bounds each statement, for a page whose context
	// the dashboard's own timeout cannot reach.
	return postgres.New(ctx, dsn, postgres.WithStatementTimeout(qt), postgres.WithApplicationName(uiAppName),
		postgres.WithMaxConns(conns))
}

// uiConfig maps the dashboard's access flags onto its Config.
func uiConfig(c *cli.Context, token string) (dashboard.Config, error) {
	cfg := dashboard.Config{Token: token, SecretFields: c.StringSlice("secret-field")}
	if c.IsSet("auth") {
		mode, err := dashboard.ParseAuthMode(c.String("auth"))
		if err != nil {
			return cfg, invalid(fmt.Errorf("invalid --auth: %w", err))
		}
		if token == "" {
			return cfg, invalid(fmt.Errorf("--auth %s needs a token (--token-file or $%s): without one the dashboard is read-only and open to read",
				mode, uiTokenEnv))
		}
		cfg.Auth = mode
	}
	for _, p := range c.StringSlice("trusted-proxy") {
		prefix, err := netip.ParsePrefix(p)
		if err != nil {
			addr, aerr := netip.ParseAddr(p)
			if aerr != nil {
				return cfg, invalid(fmt.Errorf("invalid --trusted-proxy %q: give an address such as 10.0.0.7 or a CIDR such as 10.0.0.0/24", p))
			}
			prefix = netip.PrefixFrom(addr.Unmap(), addr.Unmap().BitLen())
		}
		cfg.TrustedProxies = append(cfg.TrustedProxies, prefix.Masked())
	}
	for _, f := range cfg.SecretFields {
		if strings.Trim(f, "-_. ") == "" {
			return cfg, invalid(fmt.Errorf("invalid --secret-field %q: give a name such as pin", f))
		}
	}
	return cfg, nil
}

// uiToken reads the dashboard's token from the file flag named, or from
// $FLOTILLA_UI_TOKEN; "" means read-only. The error never repeats the token.
func uiToken(c *cli.Context, fileFlag string) (string, error) {
	env := os.Getenv(uiTokenEnv)
	if !c.IsSet(fileFlag) {
		if env != "" && len(env) < dashboard.MinTokenLength {
			return "", invalid(fmt.Errorf("$%s has %d characters: give a token of at least %d", uiTokenEnv, len(env), dashboard.MinTokenLength))
		}
		return env, nil
	}
	if env != "" {
		return "", invalid(fmt.Errorf("--%s and $%s both give the dashboard's token: give one of them", fileFlag, uiTokenEnv))
	}
	path := c.String(fileFlag)
	raw, err := readSecretFile(fileFlag, path)
	if err != nil {
		return "", err
	}
	token := strings.TrimSpace(string(raw))
	if len(token) < dashboard.MinTokenLength {
		return "", invalid(fmt.Errorf("invalid --%s %s: the token has %d characters; give at least %d", fileFlag, path,
			len(token), dashboard.MinTokenLength))
	}
	return token, nil
}

// warnIfExposed warns when the dashboard listens beyond loopback: it serves
// plain HTTP, and its token and session cookie would cross the network.
func warnIfExposed(log *zap.Logger, addr net.Addr) {
	if tcp, ok := addr.(*net.TCPAddr); ok && !tcp.IP.IsLoopback() {
		log.Warn("the dashboard listens beyond loopback over plain HTTP: put it behind a TLS proxy, "+
			"or bind 127.0.0.1 and reach it through an SSH tunnel", zap.String("addr", addr.String()))
	}
}

// nodeHTTP is what `worker run --http` serves: /healthz, /readyz and
// /metrics, and, with --ui, the dashboard at every other path, on a store
// of its own (see openConsoleStore). close ends the dashboard and its store.
func nodeHTTP(ctx context.Context, s store.Store, n *node.Node, opts httpOptions, addr net.Addr, log *zap.Logger) (http.Handler, func(), error) {
	health := node.HealthHandler(n)
	if !opts.ui {
		return health, func() {}, nil
	}
	// Its token and session cookie cross the network as they would from
	// `worker ui`.
	warnIfExposed(log, addr)
	console := s
	closeStore := func() {}
	if opts.target.Kind == storedsn.PostgreSQL {
		own, err := openConsoleStore(ctx, opts.dsn, opts.target, dashboard.DefaultQueryTimeout, nodeUIConns, true)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", nodeUIPrefix, err)
		}
		console, closeStore = own, own.Close
	}
	d, err := dashboard.New(ctx, dashboard.Config{Store: console, Token: opts.uiToken, Logger: log})
	if err != nil {
		closeStore()
		return nil, nil, err
	}
	mux := http.NewServeMux()
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		mux.Handle(p, health)
	}
	mux.Handle("/", d)
	return mux, func() { d.Close(); closeStore() }, nil
}

// nodeMetrics makes the node's Prometheus metrics when --http serves them,
// and nil otherwise: nobody would read them, and sampling their gauges costs
// a statement every interval. Start samples them once the node runs.
func nodeMetrics(s store.Store, httpAddr string, log *zap.Logger) (*metrics.Metrics, error) {
	if httpAddr == "" {
		return nil, nil
	}
	return metrics.New(s, metrics.Options{Logger: log})
}
