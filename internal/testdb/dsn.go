package testdb

import (
	"errors"
	"net/url"
	"strings"
)

// Redact returns dsn without its password, for use in messages. It handles
// both URL DSNs (postgres://user:password@host/db?password=...) and
// key=value DSNs (host=... password=...). A DSN it cannot parse is replaced
// as a whole, so that no password can get through.
func Redact(dsn string) string {
	if isURL(dsn) {
		// The user info ends at the last "@" before the query, not at the
		// first "/": a password with an unescaped "/" must not get through.
		i := strings.Index(dsn, "://") + len("://")
		end := strings.IndexAny(dsn, "?#")
		if end < 0 {
			end = len(dsn)
		}
		if at := strings.LastIndex(dsn[i:end], "@"); at >= 0 {
			user, _, _ := strings.Cut(dsn[i:i+at], ":")
			dsn = dsn[:i] + user + dsn[i+at:]
		}
		u := splitURL(dsn)
		u.query = dropQueryParam(u.query, "password")
		return u.String()
	}
	pairs, err := parseKeyValues(dsn)
	if err != nil {
		return "[unparseable DSN]"
	}
	return formatKeyValues(dropKey(pairs, "password"))
}

// withDatabase returns dsn with its database name replaced by name, keeping
// every other part, query parameters included.
func withDatabase(dsn, name string) (string, error) {
	if isURL(dsn) {
		u := splitURL(dsn)
		u.path = "/" + url.PathEscape(name)
		return u.String(), nil
	}
	pairs, err := parseKeyValues(dsn)
	if err != nil {
		return "", err
	}
	pairs = append(dropKey(pairs, "dbname"), keyValue{key: "dbname", value: name})
	return formatKeyValues(pairs), nil
}

func isURL(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// urlParts is a URL DSN split into its parts, each kept as written. It is
// split by hand rather than with net/url, which rejects the multi-host form
// (postgres://h1:5432,h2:5432/db) that PostgreSQL accepts.
type urlParts struct {
	scheme    string // "postgres://"
	authority string // "user:password@host:port"
	path      string // "/db", or ""
	query     string // "sslmode=disable", without "?"
	fragment  string // "#...", with "#", or ""
}

func splitURL(dsn string) urlParts {
	var u urlParts
	i := strings.Index(dsn, "://") + len("://")
	u.scheme, dsn = dsn[:i], dsn[i:]
	if i := strings.IndexByte(dsn, '#'); i >= 0 {
		dsn, u.fragment = dsn[:i], dsn[i:]
	}
	if i := strings.IndexByte(dsn, '?'); i >= 0 {
		dsn, u.query = dsn[:i], dsn[i+1:]
	}
	if i := strings.IndexByte(dsn, '/'); i >= 0 {
		dsn, u.path = dsn[:i], dsn[i:]
	}
	u.authority = dsn
	return u
}

func (u urlParts) String() string {
	s := u.scheme + u.authority + u.path
	if u.query != "" {
		s += "?" + u.query
	}
	return s + u.fragment
}

// dropQueryParam removes every key=value with the given key from a raw
// query string, leaving the other parameters as written and in order.
func dropQueryParam(query, key string) string {
	if query == "" {
		return ""
	}
	var kept []string
	for _, param := range strings.Split(query, "&") {
		k, _, _ := strings.Cut(param, "=")
		if uk, err := url.QueryUnescape(k); err == nil {
			k = uk
		}
		if k != key {
			kept = append(kept, param)
		}
	}
	return strings.Join(kept, "&")
}

// keyValue is one setting of a key=value DSN; value is kept as written,
// quotes and escapes included.
type keyValue struct {
	key, value string
}

// parseKeyValues splits a key=value DSN ("host=h dbname='my db'") into its
// settings, following libpq's syntax: spaces may surround "=", and a value
// is either single-quoted or runs to the next space, with backslash escapes
// in both.
func parseKeyValues(s string) ([]keyValue, error) {
	var pairs []keyValue
	for {
		s = strings.TrimLeft(s, " \t\n\r\v\f")
		if s == "" {
			return pairs, nil
		}
		eq := strings.IndexByte(s, '=')
		if eq < 0 {
			return nil, errors.New("invalid DSN: setting without '='")
		}
		key := strings.TrimRight(s[:eq], " \t\n\r\v\f")
		if key == "" || strings.ContainsAny(key, " \t\n\r\v\f") {
			return nil, errors.New("invalid DSN: bad setting name")
		}
		s = strings.TrimLeft(s[eq+1:], " \t\n\r\v\f")

		end, err := valueEnd(s)
		if err != nil {
			return nil, err
		}
		pairs = append(pairs, keyValue{key: key, value: s[:end]})
		s = s[end:]
	}
}

// valueEnd returns the length of the value at the start of s.
func valueEnd(s string) (int, error) {
	quoted := strings.HasPrefix(s, "'")
	i := 0
	if quoted {
		i = 1
	}
	for ; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			i++ // skip the escaped byte
		case quoted && c == '\'':
			return i + 1, nil
		case !quoted && strings.IndexByte(" \t\n\r\v\f", c) >= 0:
			return i, nil
		}
	}
	if quoted {
		return 0, errors.New("invalid DSN: unterminated quoted value")
	}
	return len(s), nil
}

func dropKey(pairs []keyValue, key string) []keyValue {
	kept := pairs[:0:0]
	for _, p := range pairs {
		if p.key != key {
			kept = append(kept, p)
		}
	}
	return kept
}

func formatKeyValues(pairs []keyValue) string {
	parts := make([]string, len(pairs))
	for i, p := range pairs {
		parts[i] = p.key + "=" + p.value
	}
	return strings.Join(parts, " ")
}
