// Httpservice embeds a node in an HTTP service: the service submits tasks
// from its own endpoint (POST /tasks), reports them (GET /tasks/{id}),
// serves the node's Prometheus metrics on /metrics (package metrics), and
// shuts down gracefully on SIGINT or SIGTERM: the HTTP server stops taking
// requests, then the node lets running handlers finish, within a timeout,
// and hands its buckets over.
//
// To show the whole life in one run, the program is its own first client:
// it submits a task over HTTP, waits for it, scrapes /metrics once, prints
// a metric line, and sends itself SIGTERM.
//
// It needs nothing installed: the fleet is an SQLite file in a temporary
// directory, removed at exit.
//
//	go run ./examples/httpservice
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/examples/internal/tempfleet"
	"github.com/flotilla-dev/flotilla/metrics"
	"github.com/flotilla-dev/flotilla/node"
	"github.com/flotilla-dev/flotilla/task"
)

// shutdownTimeout bounds the graceful shutdown: the HTTP server's drain and
// the node's, together.
const shutdownTimeout = 10 * time.Second

// WelcomeEmail is the payload of the task the service submits for a
// sign-up.
type WelcomeEmail struct {
	To string `json:"to"`
}

func (WelcomeEmail) Kind() string { return "welcome-email" }

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "httpservice:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	signalled, stopSignals := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stopSignals()

	fleet, err := tempfleet.Open(ctx)
	if err != nil {
		return err
	}
	defer fleet.Close()

	m, err := metrics.New(fleet.Store, metrics.Options{})
	if err != nil {
		return err
	}
	// The service logs with log/slog; the node logs there too, and the
	// middleware measures every handler and logs its failures.
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	n, err := node.New(fleet.Store, node.Config{
		NodeID: "web-1", AllBuckets: true, Metrics: m, ShutdownTimeout: shutdownTimeout / 2,
		Slog:       logger,
		Middleware: []node.Middleware{m.Middleware(), node.LogAttempts(logger)},
	})
	if err != nil {
		return err
	}
	m.Watch(n)
	err = flotilla.Handle(n, func(ctx context.Context, job *flotilla.Job[WelcomeEmail]) (struct{}, error) {
		fmt.Printf("handler: sending the welcome email of task %d to %s\n", job.ID, job.Args.To)
		return struct{}{}, nil
	})
	if err != nil {
		return err
	}
	if err := n.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = n.Shutdown(context.WithoutCancel(ctx)) }()
	if err := m.Start(ctx); err != nil {
		return err
	}
	defer m.Stop()

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m)
	mux.HandleFunc("POST /tasks", submitHandler(fleet.Client))
	mux.HandleFunc("GET /tasks/{id}", getHandler(fleet.Client))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	base := "http://" + ln.Addr().String()
	fmt.Printf("listening on %s (node %s)\n", base, n.ID())

	failed := make(chan error, 1)
	go func() {
		if err := useTheService(signalled, base); err != nil {
			failed <- err
			return
		}
		fmt.Println("client: done; sending SIGTERM to the service")
		_ = syscall.Kill(os.Getpid(), syscall.SIGTERM)
	}()

	var runErr error
	select {
	case <-signalled.Done():
		fmt.Println("signal received: shutting down gracefully")
	case runErr = <-failed:
	case runErr = <-served:
	}

	stopping, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(stopping); err != nil {
		return errors.Join(runErr, fmt.Errorf("HTTP server shutdown: %w", err))
	}
	if err := n.Shutdown(stopping); err != nil {
		return errors.Join(runErr, fmt.Errorf("node shutdown: %w", err))
	}
	if runErr != nil {
		return runErr
	}
	fmt.Println("HTTP server and node shut down; exiting")
	return nil
}

// submitHandler submits a welcome email for the address in the request.
func submitHandler(c *flotilla.Client) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Email string `json:"email"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || !strings.Contains(req.Email, "@") {
			http.Error(w, `want a JSON body like {"email":"ada@example.com"}`, http.StatusBadRequest)
			return
		}
		t, err := flotilla.SubmitArgs(r.Context(), c, WelcomeEmail{To: req.Email}, flotilla.WithKey(req.Email))
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		_ = json.NewEncoder(w).Encode(map[string]any{"id": t.ID, "status": t.Status})
	}
}

// getHandler reports a task's status.
func getHandler(c *flotilla.Client) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var id int64
		if _, err := fmt.Sscan(r.PathValue("id"), &id); err != nil {
			http.Error(w, fmt.Sprintf("task id %q is not a number", r.PathValue("id")), http.StatusBadRequest)
			return
		}
		t, err := c.Get(r.Context(), id)
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"id": t.ID, "status": t.Status})
	}
}

// useTheService is the service's first client: it submits a task over
// HTTP, waits until it has succeeded, and scrapes /metrics.
func useTheService(ctx context.Context, base string) error {
	var created struct {
		ID     int64
		Status string
	}
	body := bytes.NewBufferString(`{"email":"ada@example.com"}`)
	if err := call(ctx, http.MethodPost, base+"/tasks", body, &created); err != nil {
		return err
	}
	fmt.Printf("client: POST /tasks created task %d (%s)\n", created.ID, created.Status)

	const succeeded = `flotilla_transitions_total{from="running",to="succeeded"}`
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		var got struct{ Status string }
		if err := call(ctx, http.MethodGet, fmt.Sprintf("%s/tasks/%d", base, created.ID), nil, &got); err != nil {
			return err
		}
		if got.Status == string(task.Succeeded) {
			// The node counts the transition once it has written it.
			line, err := scrape(ctx, base+"/metrics", succeeded)
			if err != nil {
				return err
			}
			if line != "" {
				fmt.Printf("client: task %d %s; /metrics says: %s\n", created.ID, got.Status, line)
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("task %d is %s: %w", created.ID, got.Status, context.Cause(ctx))
		case <-tick.C:
		}
	}
}

// call sends a request and decodes the JSON answer into out.
func call(ctx context.Context, method, url string, body *bytes.Buffer, out any) error {
	var req *http.Request
	var err error
	if body != nil {
		req, err = http.NewRequestWithContext(ctx, method, url, body)
	} else {
		req, err = http.NewRequestWithContext(ctx, method, url, nil)
	}
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s", method, url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// scrape returns the line of /metrics that starts with prefix, or "".
func scrape(ctx context.Context, url, prefix string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		if strings.HasPrefix(lines.Text(), prefix) {
			return lines.Text(), nil
		}
	}
	return "", lines.Err()
}
