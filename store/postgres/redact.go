package postgres

import (
	"net/url"
	"strings"
)

// unparseableDSN replaces, in messages, a DSN whose password cannot be
// located, so that none can get through.
const unparseableDSN = "[unparseable DSN]"

// redact returns dsn without its password, for messages. It handles URL DSNs
// (postgres://user:password@host/db?password=...) and key=value DSNs
// (host=... password=...).
func redact(dsn string) string {
	if isURLDSN(dsn) {
		scheme, authority, rest := splitURLDSN(dsn)
		if at := strings.LastIndex(authority, "@"); at >= 0 {
			user, _, _ := strings.Cut(authority[:at], ":")
			authority = user + authority[at:]
		}
		path, query, hasQuery := strings.Cut(rest, "?")
		out := scheme + authority + path
		if hasQuery {
			fragment := ""
			if i := strings.IndexByte(query, '#'); i >= 0 {
				query, fragment = query[:i], query[i:]
			}
			if q := dropPasswordParam(query); q != "" {
				out += "?" + q
			}
			out += fragment
		}
		return out
	}
	pairs, ok := parseKeyValues(dsn)
	if !ok {
		return unparseableDSN
	}
	kept := make([]string, 0, len(pairs))
	for _, p := range pairs {
		if p.key != "password" {
			kept = append(kept, p.key+"="+p.value)
		}
	}
	return strings.Join(kept, " ")
}

// passwords returns the password texts a DSN holds, as written and unescaped,
// so that they can be scrubbed from a driver's message.
func passwords(dsn string) []string {
	var out []string
	add := func(raw string) {
		out = append(out, raw)
		if u, err := url.PathUnescape(raw); err == nil && u != raw {
			out = append(out, u)
		}
	}
	if isURLDSN(dsn) {
		_, authority, rest := splitURLDSN(dsn)
		if at := strings.LastIndex(authority, "@"); at >= 0 {
			if _, pw, ok := strings.Cut(authority[:at], ":"); ok {
				add(pw)
			}
		}
		if _, query, ok := strings.Cut(rest, "?"); ok {
			for _, param := range strings.Split(query, "&") {
				k, v, _ := strings.Cut(param, "=")
				if uk, err := url.QueryUnescape(k); err == nil && uk == "password" {
					add(v)
				}
			}
		}
		return out
	}
	pairs, _ := parseKeyValues(dsn)
	for _, p := range pairs {
		if p.key == "password" {
			add(strings.Trim(p.value, "'"))
		}
	}
	return out
}

func isURLDSN(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// splitURLDSN splits a URL DSN by hand (net/url rejects the multi-host form
// that PostgreSQL accepts) into the scheme with "://", the authority
// (user:password@hosts) and the rest (path, query, fragment). The authority
// ends at the last "@" before the query, so that a password holding an
// unescaped "/" stays inside it.
func splitURLDSN(dsn string) (scheme, authority, rest string) {
	i := strings.Index(dsn, "://") + len("://")
	scheme, dsn = dsn[:i], dsn[i:]
	end := strings.IndexAny(dsn, "?#")
	if end < 0 {
		end = len(dsn)
	}
	hostStart := 0
	if at := strings.LastIndex(dsn[:end], "@"); at >= 0 {
		hostStart = at + 1
	}
	slash := strings.IndexByte(dsn[hostStart:end], '/')
	if slash < 0 {
		return scheme, dsn[:end], dsn[end:]
	}
	return scheme, dsn[:hostStart+slash], dsn[hostStart+slash:]
}

// dropPasswordParam removes every password=... parameter from a raw query.
func dropPasswordParam(query string) string {
	var kept []string
	for _, param := range strings.Split(query, "&") {
		k, _, _ := strings.Cut(param, "=")
		if uk, err := url.QueryUnescape(k); err == nil {
			k = uk
		}
		if k != "password" && param != "" {
			kept = append(kept, param)
		}
	}
	return strings.Join(kept, "&")
}

type keyValue struct{ key, value string }

// parseKeyValues splits a key=value DSN following libpq's syntax: spaces
// may surround "=", and a value is single-quoted or runs to the next space,
// with backslash escapes in both. Values are kept as written.
func parseKeyValues(s string) ([]keyValue, bool) {
	const space = " \t\n\r\v\f"
	var pairs []keyValue
	for {
		s = strings.TrimLeft(s, space)
		if s == "" {
			return pairs, true
		}
		eq := strings.IndexByte(s, '=')
		if eq < 0 {
			return nil, false
		}
		key := strings.TrimRight(s[:eq], space)
		if key == "" || strings.ContainsAny(key, space) {
			return nil, false
		}
		s = strings.TrimLeft(s[eq+1:], space)
		quoted := strings.HasPrefix(s, "'")
		i, end := 0, -1
		if quoted {
			i = 1
		}
	scan:
		for ; i < len(s); i++ {
			switch c := s[i]; {
			case c == '\\':
				i++
			case quoted && c == '\'':
				end = i + 1
				break scan
			case !quoted && strings.IndexByte(space, c) >= 0:
				end = i
				break scan
			}
		}
		if end < 0 {
			if quoted {
				return nil, false
			}
			end = len(s)
		}
		pairs = append(pairs, keyValue{key: key, value: s[:end]})
		s = s[end:]
	}
}

// Redact returns dsn without its password, for messages and logs: a URL
// keeps its user, host, database and other parameters; a key=value string
// keeps every pair but the password.
func Redact(dsn string) string { return redact(dsn) }
