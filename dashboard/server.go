package dashboard

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/netip"
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
	// DefaultSessionIdle ends a session nobody used for this long.
	DefaultSessionIdle = time.Hour
	// DefaultSessionMaxAge ends every session this long after sign-in,
	// used or not.
	DefaultSessionMaxAge = 12 * time.Hour
	// DefaultBulkCap is the most tasks one bulk action changes.
	DefaultBulkCap = 1000
	// PageSize is the number of tasks on one page of the task list.
	PageSize = 50
)

// AuthMode says what a configured token guards.
type AuthMode string

// The modes of Config.Auth.
const (
	// AuthAll: every page and stream needs a signed-in operator. The
	// default with a token: payloads, results and errors are the fleet's
	// data, and exec payloads carry argv and environment values.
	AuthAll AuthMode = "all"
	// AuthActions: anyone who reaches the address reads every page; only
	// actions need a signed-in operator. The pages say so.
	AuthActions AuthMode = "actions"
)

// ParseAuthMode reads "all" or "actions".
func ParseAuthMode(s string) (AuthMode, error) {
	switch m := AuthMode(s); m {
	case AuthAll, AuthActions:
		return m, nil
	}
	return "", fmt.Errorf("auth mode %q is not known: use %q (reading needs sign-in too) or %q (only actions do)",
		s, AuthAll, AuthActions)
}

// contentSecurityPolicy allows this origin's script, style and forms, and
// nothing else: no inline script or style, no frames, no other origin.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// Config configures a Server.
type Config struct {
	// Store is read for every page, and written through package commands.
	Store store.Store
	// Token enables sign-in: an operator signs in with it and a name.
	// Empty means read-only: no page offers an action, every POST is
	// refused, and every page is open to read.
	Token string
	// Auth says what the token guards (AuthAll when empty). It must be
	// empty without a Token.
	Auth AuthMode
	// QueryTimeout bounds the store calls of one request
	// (DefaultQueryTimeout).
	QueryTimeout time.Duration
	// LiveInterval and LiveFor shape the live streams (DefaultLiveInterval,
	// DefaultLiveFor).
	LiveInterval time.Duration
	LiveFor      time.Duration
	// SessionIdle and SessionMaxAge end sessions (DefaultSessionIdle,
	// DefaultSessionMaxAge).
	SessionIdle   time.Duration
	SessionMaxAge time.Duration
	// TrustedProxies are the addresses of the TLS proxies in front of the
	// dashboard. From them alone, X-Forwarded-Proto: https marks the
	// session cookie Secure, and X-Forwarded-For names the client whom the
	// sign-in limit counts. Other peers' headers are ignored.
	TrustedProxies []netip.Prefix
	// SecretFields are extra names of payload and result fields whose
	// values are masked (beside DefaultSecretFields): a field is masked
	// when its name, in lower case without '-', '_' or spaces, contains
	// one of them.
	SecretFields []string
	// BulkCap is the most tasks one bulk action changes (DefaultBulkCap).
	BulkCap int
	// Logger receives one line per action, per sign-in and per failed
	// page (default: none).
	Logger *zap.Logger
}

// Server is the dashboard's HTTP handler.
type Server struct {
	cfg      Config
	client   *flotilla.Client
	pages    map[string]*template.Template
	mux      *http.ServeMux
	sessions *sessions
	limiter  *signInLimiter
	feeds    *hub
	secrets  *masker
	// now is the clock of sessions and the sign-in limit.
	now func() time.Time

	// cache shares the fleet's view and the backlog among the pages and
	// streams of one LiveInterval, and the slower readings (counts by kind,
	// the throughput) among those of countsEvery.
	cache struct {
		mu        sync.Mutex
		fleet     fleetView
		fleetAt   time.Time
		backlog   []store.Backlog
		backlogAt time.Time
		counts    countsView
		countsAt  time.Time
		dayAt     time.Time
	}

	closeOnce sync.Once
	closed    chan struct{}
}

// New checks cfg and reads the fleet's metadata (the bucket count).
func New(ctx context.Context, cfg Config) (*Server, error) {
	switch {
	case cfg.Store == nil:
		return nil, errors.New("dashboard config: Store is nil")
	case cfg.QueryTimeout < 0, cfg.LiveInterval < 0, cfg.LiveFor < 0, cfg.SessionIdle < 0, cfg.SessionMaxAge < 0:
		return nil, fmt.Errorf("dashboard config: QueryTimeout %v, LiveInterval %v, LiveFor %v, SessionIdle %v and "+
			"SessionMaxAge %v must be positive (or zero for the defaults)", cfg.QueryTimeout, cfg.LiveInterval, cfg.LiveFor,
			cfg.SessionIdle, cfg.SessionMaxAge)
	case cfg.BulkCap < 0:
		return nil, fmt.Errorf("dashboard config: BulkCap %d is negative: give a positive cap, or 0 for %d", cfg.BulkCap, DefaultBulkCap)
	case cfg.Token != "" && len(cfg.Token) < MinTokenLength:
		return nil, fmt.Errorf("dashboard config: the token has %d characters; give at least %d", len(cfg.Token), MinTokenLength)
	case cfg.Token == "" && cfg.Auth != "":
		return nil, fmt.Errorf("dashboard config: Auth %q needs a Token: without one the dashboard is read-only and open to read", cfg.Auth)
	}
	if cfg.Token != "" {
		if cfg.Auth == "" {
			cfg.Auth = AuthAll
		}
		if _, err := ParseAuthMode(string(cfg.Auth)); err != nil {
			return nil, fmt.Errorf("dashboard config: Auth: %w", err)
		}
	}
	secrets, err := newMasker(cfg.SecretFields)
	if err != nil {
		return nil, fmt.Errorf("dashboard config: SecretFields: %w", err)
	}
	defaults(&cfg)
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
	s := &Server{cfg: cfg, client: client, pages: pages, secrets: secrets, now: time.Now, closed: make(chan struct{})}
	s.sessions = newSessions(cfg.SessionIdle, cfg.SessionMaxAge)
	s.limiter = newSignInLimiter()
	s.feeds = newHub(cfg.LiveInterval, cfg.QueryTimeout, cfg.Logger)
	s.routes()
	return s, nil
}

func defaults(cfg *Config) {
	if cfg.QueryTimeout == 0 {
		cfg.QueryTimeout = DefaultQueryTimeout
	}
	if cfg.LiveInterval == 0 {
		cfg.LiveInterval = DefaultLiveInterval
	}
	if cfg.LiveFor == 0 {
		cfg.LiveFor = DefaultLiveFor
	}
	if cfg.SessionIdle == 0 {
		cfg.SessionIdle = DefaultSessionIdle
	}
	if cfg.SessionMaxAge == 0 {
		cfg.SessionMaxAge = DefaultSessionMaxAge
	}
	if cfg.BulkCap == 0 {
		cfg.BulkCap = DefaultBulkCap
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
}

// Auth is what the token guards: AuthAll or AuthActions; "" without a
// token, when the dashboard is read-only and open to read.
func (s *Server) Auth() AuthMode { return s.cfg.Auth }

// Close ends the live streams and their readers; pages still in flight
// finish.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.closed)
		s.feeds.close()
	})
}

func (s *Server) routes() {
	mux := http.NewServeMux()
	static, _ := fs.Sub(staticFiles, "static")
	// The script and the style hold no data: they are served to anyone.
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /{$}", s.read(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/fleet", http.StatusSeeOther)
	}))
	mux.HandleFunc("GET /fleet", s.read(s.fleetPage))
	mux.HandleFunc("GET /fleet/live", s.read(s.fleetLive))
	mux.HandleFunc("GET /tasks", s.read(s.tasksPage))
	mux.HandleFunc("GET /tasks/bulk", s.read(s.bulkPage))
	mux.HandleFunc("POST /tasks/bulk", s.action(s.bulkAction))
	mux.HandleFunc("GET /tasks/{id}", s.read(s.taskPage))
	mux.HandleFunc("GET /tasks/{id}/live", s.read(s.taskLive))
	mux.HandleFunc("POST /tasks/{id}/reveal", s.action(s.revealTask))
	mux.HandleFunc("POST /tasks/{id}/{action}", s.action(s.taskAction))
	mux.HandleFunc("GET /pipelines", s.read(s.pipelinesPage))
	mux.HandleFunc("GET /pipelines/{id}", s.read(s.pipelinePage))
	mux.HandleFunc("GET /pipelines/{id}/live", s.read(s.pipelineLive))
	mux.HandleFunc("POST /pipelines/{id}/{action}", s.action(s.pipelineAction))
	mux.HandleFunc("GET /schedules", s.read(s.schedulesPage))
	// A schedule's name is any text, "../tasks/1/stop?" or "..": it goes
	// in the form's body, never in the path, where a browser would
	// resolve dot segments however they are escaped.
	mux.HandleFunc("POST /schedules/{action}", s.action(s.scheduleAction))
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
	OpenRead bool // a token guards actions only: the banner says reading is open
	Flash    string
	Now      time.Time // what relative times count from
	Data     any
}

func (s *Server) render(w http.ResponseWriter, r *http.Request, status int, name string, p page) {
	p.Writable = s.cfg.Token != ""
	p.OpenRead = s.cfg.Auth == AuthActions
	if p.Now.IsZero() {
		p.Now = s.now()
	}
	if sess := s.session(r); sess != nil {
		p.Session, p.CSRF = sess, sess.csrf
		// A notice is the server's own, kept in the session by the action
		// that wrote it and shown once: no address can put text here.
		if p.Flash == "" {
			p.Flash = s.sessions.takeFlash(sess.id)
		}
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
