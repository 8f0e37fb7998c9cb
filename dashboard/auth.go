package dashboard

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// MinTokenLength is the shortest token accepted: a token is a password
// that a browser form carries, and a short one can be guessed.
const MinTokenLength = 16

const sessionCookie = "flotilla_session"

// maxSessions bounds the sessions kept at once. Only a holder of the token
// can make one, but a script that signs in in a loop must not fill the
// memory: past the bound, the session used longest ago ends.
const maxSessions = 10_000

// validName is what an operator may call themselves: it ends up in the
// audit trail as "ui:<name>".
var validName = regexp.MustCompile(`^[A-Za-z0-9._@-]{1,64}$`)

// session is a signed-in operator. It lives in the server's memory only:
// the cookie carries a random id and nothing else, so that signing out,
// expiry and a restart end it everywhere, and a copied cookie dies with it.
type session struct {
	Name    string
	id      string
	csrf    string
	created time.Time
	seen    time.Time
	flash   string
}

// Actor is the name the audit trail records for the session's actions.
func (s *session) Actor() string { return "ui:" + s.Name }

// sessions is the table of live sessions.
type sessions struct {
	idle, maxAge time.Duration
	mu           sync.Mutex
	byID         map[string]*session
}

func newSessions(idle, maxAge time.Duration) *sessions {
	return &sessions{idle: idle, maxAge: maxAge, byID: map[string]*session{}}
}

func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return base64.RawURLEncoding.EncodeToString(b)
}

func (ss *sessions) create(name string, now time.Time) *session {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if len(ss.byID) >= maxSessions {
		var oldest *session
		for _, s := range ss.byID {
			if oldest == nil || s.seen.Before(oldest.seen) {
				oldest = s
			}
		}
		delete(ss.byID, oldest.id)
	}
	s := &session{Name: name, id: randomToken(), csrf: randomToken(), created: now, seen: now}
	ss.byID[s.id] = s
	return s
}

// get returns a copy of the live session of id, marking it used; nil when
// there is none, or it expired (which ends it).
func (ss *sessions) get(id string, now time.Time) *session {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s := ss.byID[id]
	if s == nil {
		return nil
	}
	if now.Sub(s.seen) >= ss.idle || now.Sub(s.created) >= ss.maxAge {
		delete(ss.byID, id)
		return nil
	}
	s.seen = now
	cp := *s
	cp.flash = ""
	return &cp
}

// alive reports whether session id is live, without counting this as a use:
// a page left open does not keep its session from ending.
func (ss *sessions) alive(id string, now time.Time) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s := ss.byID[id]
	return s != nil && now.Sub(s.seen) < ss.idle && now.Sub(s.created) < ss.maxAge
}

func (ss *sessions) end(id string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	delete(ss.byID, id)
}

func (ss *sessions) setFlash(id, text string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if s := ss.byID[id]; s != nil {
		s.flash = text
	}
}

func (ss *sessions) takeFlash(id string) string {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s := ss.byID[id]
	if s == nil {
		return ""
	}
	f := s.flash
	s.flash = ""
	return f
}

// session returns the request's live session, or nil.
func (s *Server) session(r *http.Request) *session {
	if s.cfg.Token == "" {
		return nil
	}
	c, err := r.Cookie(sessionCookie)
	if err != nil || c.Value == "" {
		return nil
	}
	return s.sessions.get(c.Value, s.now())
}

// notice keeps a notice for the session's next page.
func (s *Server) notice(sess *session, format string, args ...any) {
	s.sessions.setFlash(sess.id, fmt.Sprintf(format, args...))
}

// errReadOnly refuses every action of a dashboard without a token.
var errReadOnly = errors.New("this dashboard is read-only: actions need the token its operator gives it, and it was given none")

// sameOrigin refuses a request that a browser says comes from another
// origin. Browsers send Origin with every POST; its absence (a script
// without one) leaves the CSRF token as the check.
func sameOrigin(r *http.Request) error {
	o := r.Header.Get("Origin")
	if o == "" {
		return nil
	}
	u, err := url.Parse(o)
	if err != nil || u.Host != r.Host {
		return fmt.Errorf("refused: a request from origin %q to %s", o, r.Host)
	}
	return nil
}

// read wraps a page or a stream: under AuthAll it needs a session; a page
// without one is sent to the sign-in, a stream is refused.
func (s *Server) read(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.Auth == AuthAll && s.session(r) == nil {
			if strings.HasSuffix(r.URL.Path, "/live") {
				http.Error(w, "sign in first", http.StatusUnauthorized)
				return
			}
			http.Redirect(w, r, "/login", http.StatusSeeOther)
			return
		}
		h(w, r)
	}
}

// action wraps a handler that changes something: it needs a token
// configured, a session, the session's CSRF token, and the same origin.
func (s *Server) action(h func(http.ResponseWriter, *http.Request, *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.Token == "" {
			s.fail(w, r, http.StatusForbidden, errReadOnly)
			return
		}
		if err := sameOrigin(r); err != nil {
			s.fail(w, r, http.StatusForbidden, err)
			return
		}
		sess := s.session(r)
		if sess == nil {
			s.fail(w, r, http.StatusUnauthorized, errors.New("sign in with the dashboard's token first (/login)"))
			return
		}
		got := r.PostFormValue("csrf")
		if got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(sess.csrf)) != 1 {
			s.cfg.Logger.Warn("dashboard action refused: bad CSRF token", zap.String("path", r.URL.Path),
				zap.String("actor", sess.Actor()))
			s.fail(w, r, http.StatusForbidden, errors.New("refused: the form's CSRF token is missing or wrong; reload the page and try again"))
			return
		}
		h(w, r, sess)
	}
}

func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Token == "" {
		s.fail(w, r, http.StatusNotFound, errReadOnly)
		return
	}
	s.render(w, r, http.StatusOK, "login", page{Title: "Sign in", Nav: "login"})
}

// login checks the token, within the sign-in limit, and starts a session.
func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Token == "" {
		s.fail(w, r, http.StatusForbidden, errReadOnly)
		return
	}
	if err := sameOrigin(r); err != nil {
		s.fail(w, r, http.StatusForbidden, err)
		return
	}
	client, now := s.clientAddr(r), s.now()
	if wait := s.limiter.admit(client, now); wait > 0 {
		secs := int((wait + time.Second - 1) / time.Second)
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		s.render(w, r, http.StatusTooManyRequests, "login", page{Title: "Sign in", Nav: "login",
			Flash: fmt.Sprintf("too many sign-in attempts: try again in %d s", secs)})
		return
	}
	name, token := r.PostFormValue("name"), r.PostFormValue("token")
	if !validName.MatchString(name) {
		s.render(w, r, http.StatusBadRequest, "login", page{Title: "Sign in", Nav: "login",
			Flash: fmt.Sprintf("name %q is not valid: use 1 to 64 letters, digits, '.', '_', '@' or '-'", name)})
		return
	}
	if subtle.ConstantTimeCompare([]byte(token), []byte(s.cfg.Token)) != 1 {
		if log, suppressed := s.limiter.failed(client, now); log {
			s.cfg.Logger.Warn("dashboard sign-in refused: wrong token", zap.String("name", name),
				zap.String("client", client), zap.Int("refusals_not_logged", suppressed))
		}
		s.render(w, r, http.StatusUnauthorized, "login", page{Title: "Sign in", Nav: "login", Flash: "wrong token"})
		return
	}
	s.limiter.succeeded(client)
	sess := s.sessions.create(name, now)
	http.SetCookie(w, &http.Cookie{
		Name: sessionCookie, Value: sess.id, Path: "/",
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: s.secure(r),
	})
	s.cfg.Logger.Info("dashboard sign-in", zap.String("actor", sess.Actor()), zap.String("client", client))
	http.Redirect(w, r, "/fleet", http.StatusSeeOther)
}

// logout ends the session on the server: a copy of its cookie signs in
// nobody afterwards.
func (s *Server) logout(w http.ResponseWriter, r *http.Request, sess *session) {
	s.sessions.end(sess.id)
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: s.secure(r)})
	s.cfg.Logger.Info("dashboard sign-out", zap.String("actor", sess.Actor()))
	target := "/fleet"
	if s.cfg.Auth == AuthAll {
		target = "/login"
	}
	http.Redirect(w, r, target, http.StatusSeeOther)
}

// fromTrustedProxy reports whether the request's peer is one of the
// configured proxies.
func (s *Server) fromTrustedProxy(r *http.Request) bool {
	if len(s.cfg.TrustedProxies) == 0 {
		return false
	}
	peer, ok := peerAddr(r)
	return ok && s.trusted(peer)
}

func (s *Server) trusted(a netip.Addr) bool {
	return slices.ContainsFunc(s.cfg.TrustedProxies, func(p netip.Prefix) bool { return p.Contains(a.Unmap()) })
}

func peerAddr(r *http.Request) (netip.Addr, bool) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	a, err := netip.ParseAddr(host)
	return a.Unmap(), err == nil
}

// secure reports whether the browser reached the dashboard over HTTPS: it
// serves TLS itself, or a trusted proxy says it terminated TLS.
func (s *Server) secure(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	return s.fromTrustedProxy(r) && strings.EqualFold(strings.TrimSpace(r.Header.Get("X-Forwarded-Proto")), "https")
}

// clientAddr is the address the sign-in limit counts: the peer's, or,
// behind trusted proxies, the last address of X-Forwarded-For that is not
// one of them (the ones before it are the client's to write).
func (s *Server) clientAddr(r *http.Request) string {
	peer, ok := peerAddr(r)
	if !ok {
		return r.RemoteAddr
	}
	if !s.trusted(peer) {
		return peer.String()
	}
	hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
	for i := len(hops) - 1; i >= 0; i-- {
		a, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
		if err != nil {
			break
		}
		if !s.trusted(a.Unmap()) {
			return a.Unmap().String()
		}
	}
	return peer.String()
}
