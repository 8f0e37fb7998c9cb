package dashboard

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/flotilla-dev/flotilla"
	"github.com/flotilla-dev/flotilla/commands"
	"github.com/flotilla-dev/flotilla/store"
)

//go:embed templates/*.html
var templateFiles embed.FS

//go:embed static
var staticFiles embed.FS

// Defaults of Config.
const (
	// DefaultQueryTimeout bounds the store calls of one page.
	DefaultQueryTimeout = 2 * time.Second
	// DefaultLiveInterval is how often a live stream sends a fresh view.
	DefaultLiveInterval = time.Second
	// DefaultLiveFor is how long one live stream lasts; the browser opens
	// the next one on its own, so that no stream is held for ever.
	DefaultLiveFor = 5 * time.Minute
	// PageSize is the number of tasks on one page of the task list.
	PageSize = 50
)

// contentSecurityPolicy allows this origin's script, style and forms, and
// nothing else: no inline script or style, no frames, no other origin.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// Config configures a Server.
type Config struct {
	// Store is read for every page, and written through package commands.
	Store store.Store
	// Token enables actions: an operator signs in with it. Empty means
	// read-only: no page offers an action and every POST is refused.
	Token string
	// QueryTimeout bounds the store calls of one request
	// (DefaultQueryTimeout).
	QueryTimeout time.Duration
	// LiveInterval and LiveFor shape the live streams (DefaultLiveInterval,
	// DefaultLiveFor).
	LiveInterval time.Duration
	LiveFor      time.Duration
	// Logger receives one line per action and per failed page (default:
	// none).
	Logger *zap.Logger
}

// Server is the dashboard's HTTP handler.
type Server struct {
	cfg    Config
	client *flotilla.Client
	pages  map[string]*template.Template
	mux    *http.ServeMux
	keys   sessionKeys

	// cache shares the fleet's view and the backlog among the pages and
	// streams of one LiveInterval.
	cache struct {
		mu        sync.Mutex
		fleet     fleetView
		fleetAt   time.Time
		backlog   []store.Backlog
		backlogAt time.Time
	}

	closeOnce sync.Once
	closed    chan struct{}
}

// New checks cfg and reads the fleet's metadata (the bucket count).
func New(ctx context.Context, cfg Config) (*Server, error) {
	switch {
	case cfg.Store == nil:
		return nil, errors.New("dashboard config: Store is nil")
	case cfg.QueryTimeout < 0, cfg.LiveInterval < 0, cfg.LiveFor < 0:
		return nil, fmt.Errorf("dashboard config: QueryTimeout %v, LiveInterval %v and LiveFor %v must be positive "+
			"(or zero for the defaults)", cfg.QueryTimeout, cfg.LiveInterval, cfg.LiveFor)
	case cfg.Token != "" && len(cfg.Token) < MinTokenLength:
		return nil, fmt.Errorf("dashboard config: the token has %d characters; give at least %d", len(cfg.Token), MinTokenLength)
	}
	if cfg.QueryTimeout == 0 {
		cfg.QueryTimeout = DefaultQueryTimeout
	}
	if cfg.LiveInterval == 0 {
		cfg.LiveInterval = DefaultLiveInterval
	}
	if cfg.LiveFor == 0 {
		cfg.LiveFor = DefaultLiveFor
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	qctx, cancel := context.WithTimeout(ctx, cfg.QueryTimeout)
	defer cancel()
	client, err := flotilla.NewClient(qctx, cfg.Store)
	if err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, client: client, pages: pages, closed: make(chan struct{})}
	if cfg.Token != "" {
		s.keys = newSessionKeys(cfg.Token)
	}
	s.routes()
	return s, nil
}

// Close ends the live streams; pages still in flight finish.
func (s *Server) Close() { s.closeOnce.Do(func() { close(s.closed) }) }

func (s *Server) routes() {
	mux := http.NewServeMux()
	static, _ := fs.Sub(staticFiles, "static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/fleet", http.StatusSeeOther)
	})
	mux.HandleFunc("GET /fleet", s.fleetPage)
	mux.HandleFunc("GET /fleet/live", s.fleetLive)
	mux.HandleFunc("GET /tasks", s.tasksPage)
	mux.HandleFunc("GET /tasks/{id}", s.taskPage)
	mux.HandleFunc("GET /tasks/{id}/live", s.taskLive)
	mux.HandleFunc("POST /tasks/{id}/{action}", s.action(s.taskAction))
	mux.HandleFunc("GET /schedules", s.schedulesPage)
	mux.HandleFunc("POST /schedules/{name}/{action}", s.action(s.scheduleAction))
	mux.HandleFunc("GET /login", s.loginPage)
	mux.HandleFunc("POST /login", s.login)
	mux.HandleFunc("POST /logout", s.action(s.logout))
	s.mux = mux
}

// ServeHTTP sets the security headers and serves the page.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	// same-origin, not no-referrer: under no-referrer a browser sends
	// "Origin: null" with the page's own forms, which sameOrigin refuses.
	h.Set("Referrer-Policy", "same-origin")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cache-Control", "no-store")
	s.mux.ServeHTTP(w, r)
}

// query gives the store calls of one request their deadline.
func (s *Server) query(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), s.cfg.QueryTimeout)
}

// page is what every template gets.
type page struct {
	Title    string
	Nav      string
	Session  *session // nil when not signed in
	CSRF     string
	Writable bool // a token is configured
	Flash    string
	Data     any
}

func (s *Server) render(w http.ResponseWriter, r *http.Request, status int, name string, p page) {
	p.Writable = s.cfg.Token != ""
	if sess := s.session(r); sess != nil {
		p.Session, p.CSRF = sess, s.keys.csrf(sess)
	}
	var buf strings.Builder
	if err := s.pages[name].ExecuteTemplate(&buf, "layout", p); err != nil {
		s.cfg.Logger.Error("rendering a page failed", zap.String("page", name), zap.Error(err))
		http.Error(w, "rendering the page failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(buf.String()))
}

// fail renders an error page. Store errors are shown with any connection
// string's password taken out, though the store's own errors carry none.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, status int, err error) {
	if status >= 500 {
		s.cfg.Logger.Warn("dashboard request failed", zap.String("path", r.URL.Path), zap.Error(err))
	}
	s.render(w, r, status, "error", page{Title: http.StatusText(status), Data: redactSecrets(err.Error())})
}

// statusOf maps a store or command error to an HTTP status.
func statusOf(err error) int {
	switch {
	case errors.Is(err, store.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, store.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, store.ErrConflict), errors.Is(err, flotilla.ErrRefused),
		errors.Is(err, commands.ErrTooLate), errors.Is(err, commands.ErrWrongState):
		return http.StatusConflict
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

var passwordInURL = regexp.MustCompile(`(://[^:/@\s]*):[^@\s]*@`)
var passwordParam = regexp.MustCompile(`(?i)(password=)[^\s&]*`)

// redactSecrets takes passwords out of anything that looks like a
// connection string.
func redactSecrets(s string) string {
	s = passwordInURL.ReplaceAllString(s, "$1:[redacted]@")
	return passwordParam.ReplaceAllString(s, "${1}[redacted]")
}
