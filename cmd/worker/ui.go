package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
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
		Usage:     "serve the dashboard: the bucket map, nodes, tasks and schedules (needs only the database)",
		ArgsUsage: " ",
		Flags: commonFlags(
			&cli.StringFlag{Name: "listen", Value: defaultUIListen, Usage: "address to serve on; other hosts reach it only if you bind more than loopback"},
			&cli.StringFlag{Name: "token-file", Usage: "file holding the token that allows stop, pause and resume (default: $" + uiTokenEnv + "; without either the dashboard is read-only)"},
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
			var s store.Store
			if target.Kind == storedsn.PostgreSQL {
				// The server also bounds each statement, for a page whose
				// context the dashboard's own timeout cannot reach.
				s, err = postgres.New(ctx, dsn, postgres.WithStatementTimeout(qt), postgres.WithApplicationName("flotilla-ui"),
					postgres.WithMaxConns(8))
			} else {
				s, err = openSQLiteDashboard(ctx, target, token != "")
			}
			if err != nil {
				return err
			}
			defer s.Close()
			d, err := dashboard.New(ctx, dashboard.Config{Store: s, Token: token, QueryTimeout: qt, Logger: log})
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
			log.Info("serving the dashboard", zap.String("addr", ln.Addr().String()), zap.Bool("actions", token != ""))
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
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", invalid(fmt.Errorf("invalid --%s %s: %w", fileFlag, path, err))
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
// /metrics, and, with --ui, the dashboard at every other path.
func nodeHTTP(ctx context.Context, s store.Store, n *node.Node, ui bool, token string, log *zap.Logger) (http.Handler, func(), error) {
	health := node.HealthHandler(n)
	if !ui {
		return health, func() {}, nil
	}
	d, err := dashboard.New(ctx, dashboard.Config{Store: s, Token: token, Logger: log})
	if err != nil {
		return nil, nil, err
	}
	mux := http.NewServeMux()
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		mux.Handle(p, health)
	}
	mux.Handle("/", d)
	return mux, d.Close, nil
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
