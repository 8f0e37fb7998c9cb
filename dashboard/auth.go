package dashboard

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"

	"go.uber.org/zap"
)

// MinTokenLength is the shortest token accepted: a token is a password
// that a browser form carries, and a short one can be guessed.
const MinTokenLength = 16

const sessionCookie = "flotilla_session"

// validName is what an operator may call themselves: it ends up in the
// audit trail as "ui:<name>".
var validName = regexp.MustCompile(`^[A-Za-z0-9._@-]{1,64}$`)

// sessionKeys sign sessions and CSRF tokens. The key mixes the token with a
// secret drawn at start, so that sessions end when the process restarts or
// the token changes, and a token leaked from a form cannot forge either.
type sessionKeys struct {
	token []byte
	key   []byte
}

func newSessionKeys(token string) sessionKeys {
	secret := make([]byte, 32)
	_, _ = rand.Read(secret) // crypto/rand.Read never fails
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(token))
	return sessionKeys{token: []byte(token), key: mac.Sum(nil)}
}

func (k sessionKeys) sign(parts ...string) string {
	mac := hmac.New(sha256.New, k.key)
	mac.Write([]byte(strings.Join(parts, "\x00")))
	return hex.EncodeToString(mac.Sum(nil))
}

// session is a signed-in operator.
type session struct {
	Name  string
	nonce string
}

// Actor is the name the audit trail records for the session's actions.
func (s *session) Actor() string { return "ui:" + s.Name }

func (k sessionKeys) cookie(s session) string {
	name := base64.RawURLEncoding.EncodeToString([]byte(s.Name))
	return s.nonce + "." + name + "." + k.sign("session", s.nonce, name)
}

func (k sessionKeys) csrf(s *session) string { return k.sign("csrf", s.nonce) }

// session returns the request's valid session, or nil.
func (s *Server) session(r *http.Request) *session {
	if s.cfg.Token == "" {
		return nil
	}
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return nil
	}
	parts := strings.Split(c.Value, ".")
	if len(parts) != 3 {
		return nil
	}
	if !hmac.Equal([]byte(parts[2]), []byte(s.keys.sign("session", parts[0], parts[1]))) {
		return nil
	}
	name, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil || !validName.Match(name) {
		return nil
	}
	return &session{Name: string(name), nonce: parts[0]}
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
		if got == "" || !hmac.Equal([]byte(got), []byte(s.keys.csrf(sess))) {
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

// login checks the token and sets the session cookie.
func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Token == "" {
		s.fail(w, r, http.StatusForbidden, errReadOnly)
		return
	}
	if err := sameOrigin(r); err != nil {
		s.fail(w, r, http.StatusForbidden, err)
		return
	}
	name, token := r.PostFormValue("name"), r.PostFormValue("token")
	if !validName.MatchString(name) {
		s.render(w, r, http.StatusBadRequest, "login", page{Title: "Sign in", Nav: "login",
			Flash: fmt.Sprintf("name %q is not valid: use 1 to 64 letters, digits, '.', '_', '@' or '-'", name)})
		return
	}
	if subtle.ConstantTimeCompare([]byte(token), s.keys.token) != 1 {
		s.cfg.Logger.Warn("dashboard sign-in refused: wrong token", zap.String("name", name))
		s.render(w, r, http.StatusUnauthorized, "login", page{Title: "Sign in", Nav: "login", Flash: "wrong token"})
		return
	}
	nonce := make([]byte, 16)
	_, _ = rand.Read(nonce)
	sess := session{Name: name, nonce: hex.EncodeToString(nonce)}
	http.SetCookie(w, &http.Cookie{
		Name: sessionCookie, Value: s.keys.cookie(sess), Path: "/",
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	})
	s.cfg.Logger.Info("dashboard sign-in", zap.String("actor", sess.Actor()))
	http.Redirect(w, r, "/fleet", http.StatusSeeOther)
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request, _ *session) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true,
		SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/fleet", http.StatusSeeOther)
}
