// Package dsn parses and redacts the database addresses millpond accepts,
// so that a password never reaches an error, a log line or a file name.
//
// Accepted forms (Parse):
//
//	postgres://user:pass@host:5432/db?sslmode=disable   (or postgresql://)
//	host=127.0.0.1 user=app password=secret dbname=app  (PostgreSQL key=value)
//	mysql://user:pass@host:3306/db                       (or mariadb://)
//	sqlite:path/to/file.db  sqlite:///abs/path.db  file:path.db
//
// Anything else is refused with ErrUnsupported, whose message names the
// accepted forms and never repeats the address beyond its scheme.
//
// Redact hides the password of any of these forms and of go-sql-driver's
// own DSN form (user:pass@tcp(host:3306)/db), and Scrub removes an
// address's password from text a driver produced.
package dsn

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// Dialect names the database an address points at.
type Dialect string

// The dialects an address can name.
const (
	// Postgres is PostgreSQL.
	Postgres Dialect = "postgres"
	// MySQL is MySQL or MariaDB.
	MySQL Dialect = "mysql"
	// SQLite is SQLite.
	SQLite Dialect = "sqlite"
)

// Mask replaces every secret Redact and Scrub hide.
const Mask = "xxxxx"

// Accepted lists the accepted address forms, for messages.
const Accepted = "postgres://user:pass@host:5432/db, postgresql://…, " +
	"a PostgreSQL key=value string (host=… user=… dbname=…), " +
	"mysql://user:pass@host:3306/db (or mariadb://…), sqlite:path/to/file.db or file:path/to/file.db"

// ErrUnsupported is returned by Parse for an empty address, an unknown
// scheme, or an address of a known scheme that does not parse.
var ErrUnsupported = errors.New("unsupported database address")

// Address is a parsed database address. Its String is redacted; Raw
// returns the address as given, for the driver only.
type Address struct {
	// Dialect is the database the address names.
	Dialect Dialect
	// Path is the SQLite database file (empty for other dialects).
	Path string

	raw string
}

// Raw returns the address exactly as given, password included. Hand it to
// a driver; never print it.
func (a Address) Raw() string { return a.raw }

// String returns the address with its password hidden.
func (a Address) String() string { return Redact(a.raw) }

// GoString is String, so %#v hides the password too.
func (a Address) GoString() string { return a.String() }

// Scrub removes the address's password from text (a driver's error, say).
func (a Address) Scrub(text string) string { return Scrub(text, a.raw) }

// keywordStart recognises a PostgreSQL key=value string.
var keywordStart = regexp.MustCompile(`^\s*[A-Za-z_][A-Za-z0-9_]*\s*=`)

// driverDSN recognises go-sql-driver/mysql's own form: user:pass@proto(addr)/db.
var driverDSN = regexp.MustCompile(`@[a-z0-9]*\(`)

// Parse checks an address and tells its dialect. The error wraps
// ErrUnsupported and shows at most the address's scheme. A URL with an '@'
// in its path, fragment or a query parameter's name is refused: a user
// name or password with an unencoded '/', '?' or '#' ends the host part
// early, and a driver would cut the password there.
func Parse(s string) (Address, error) {
	trimmed := strings.TrimSpace(s)
	if trimmed == "" {
		return Address{}, fmt.Errorf("%w: the address is empty; use %s", ErrUnsupported, Accepted)
	}
	if !strings.Contains(trimmed, "://") && keywordStart.MatchString(trimmed) {
		if _, err := parseKeywords(trimmed); err != nil {
			return Address{}, fmt.Errorf("%w: the PostgreSQL key=value string does not parse (%v)", ErrUnsupported, err)
		}
		return Address{Dialect: Postgres, raw: s}, nil
	}
	scheme, rest, ok := strings.Cut(trimmed, ":")
	if !ok || !validScheme(scheme) {
		hint := ""
		if driverDSN.MatchString(trimmed) {
			hint = " (it looks like a go-sql-driver DSN: write it as mysql://user:pass@host:3306/db)"
		}
		return Address{}, fmt.Errorf("%w: no scheme%s; use %s", ErrUnsupported, hint, Accepted)
	}
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql":
		if err := checkURL(trimmed); err != nil {
			return Address{}, fmt.Errorf("%w: the %s URL %v", ErrUnsupported, scheme, err)
		}
		return Address{Dialect: Postgres, raw: s}, nil
	case "mysql", "mariadb":
		if err := checkURL(trimmed); err != nil {
			return Address{}, fmt.Errorf("%w: the %s URL %v", ErrUnsupported, scheme, err)
		}
		return Address{Dialect: MySQL, raw: s}, nil
	case "sqlite", "file":
		path := strings.TrimPrefix(rest, "//")
		if path == "" || strings.HasPrefix(path, "?") {
			return Address{}, fmt.Errorf("%w: %s: names no database file; use sqlite:path/to/file.db", ErrUnsupported, scheme)
		}
		return Address{Dialect: SQLite, Path: path, raw: s}, nil
	default:
		return Address{}, fmt.Errorf("%w: unknown scheme %q; use %s", ErrUnsupported, scheme, Accepted)
	}
}

// validScheme reports whether s has the shape of a URL scheme, so an error
// may show it without showing anything else of the address.
func validScheme(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for i, c := range s {
		letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		if !letter && (i == 0 || !(c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.')) {
			return false
		}
	}
	return true
}

// cutUserinfo reports an '@' after the authority of a URL (rest is what
// follows "scheme://") where it can only be part of a user name or password
// holding an unencoded '/', '?' or '#', which ended the authority early: in
// the path or fragment, or in a query parameter's name. With anyQuery, an
// '@' anywhere in the query counts too when the authority holds none (no
// user): Redact then hides all before it, while Parse accepts such a
// query value (a managed service's user@server name).
func cutUserinfo(rest string, anyQuery bool) bool {
	end := strings.IndexAny(rest, "/?#")
	if end < 0 || !strings.Contains(rest[end:], "@") {
		return false
	}
	authority, after := rest[:end], rest[end:]
	after, fragment, _ := strings.Cut(after, "#")
	path, query, _ := strings.Cut(after, "?")
	if strings.Contains(path, "@") || strings.Contains(fragment, "@") {
		return true
	}
	for param := range strings.SplitSeq(query, "&") {
		if name, _, _ := strings.Cut(param, "="); strings.Contains(name, "@") {
			return true
		}
	}
	return anyQuery && !strings.Contains(authority, "@") && strings.Contains(query, "@")
}

// checkURL reports why a postgres or mysql URL cannot be used, without
// quoting it.
func checkURL(s string) error {
	if i := strings.Index(s, "://"); i >= 0 && cutUserinfo(s[i+3:], false) {
		return errors.New("has an '@' after its host: percent-encode '/', '?', '#' and '@' in the user name and password")
	}
	u, err := url.Parse(s)
	if err != nil {
		return errors.New("does not parse (check that special characters in the user and password are percent-encoded)")
	}
	if u.Opaque != "" || !strings.Contains(s, "://") {
		return errors.New("needs // after the scheme")
	}
	if u.Host == "" && u.Query().Get("host") == "" {
		return errors.New("names no host")
	}
	return nil
}

// secretParam reports whether a query or key=value parameter holds a secret.
func secretParam(key string) bool {
	k := strings.ToLower(key)
	return strings.Contains(k, "pass") || strings.Contains(k, "secret") || strings.Contains(k, "token") || k == "pwd"
}

// Redact returns s with every password hidden: a URL's user password and
// secret query parameters, secret values of a PostgreSQL key=value string,
// and the password of a go-sql-driver DSN. What cannot be parsed is
// reduced to its scheme.
func Redact(s string) string {
	trimmed := strings.TrimSpace(s)
	if trimmed == "" {
		return ""
	}
	if !strings.Contains(trimmed, "://") && keywordStart.MatchString(trimmed) {
		kvs, err := parseKeywords(trimmed)
		if err != nil {
			return "[unparseable key=value string]"
		}
		parts := make([]string, len(kvs))
		for i, kv := range kvs {
			v := kv.value
			if secretParam(kv.key) {
				v = Mask
			}
			parts[i] = kv.key + "=" + quoteKeyword(v)
		}
		return strings.Join(parts, " ")
	}
	if !strings.Contains(trimmed, "://") && driverDSN.MatchString(trimmed) {
		return redactDriverDSN(trimmed)
	}
	scheme, rest, ok := strings.Cut(trimmed, ":")
	if !ok || !validScheme(scheme) {
		return "[unrecognised database address]"
	}
	sqlite := strings.EqualFold(scheme, "sqlite") || strings.EqualFold(scheme, "file")
	if sqlite && !strings.HasPrefix(rest, "//") {
		return scheme + ":" + redactQuery(rest)
	}
	// A SQLite address names a file, whose path may hold an '@': it has no
	// user or password to end early.
	if i := strings.Index(trimmed, "://"); i >= 0 && !sqlite && cutUserinfo(trimmed[i+3:], true) {
		// An '@' in a secret parameter's value is not the end of a user's
		// password: hide the value first, or its rest would follow the
		// last '@' below.
		trimmed = trimmed[:i+3] + maskSecretValues(trimmed[i+3:])
	}
	if i := strings.Index(trimmed, "://"); i >= 0 && !sqlite && cutUserinfo(trimmed[i+3:], true) {
		// A user or password with an unencoded '/', '?' or '#': the
		// authority ends inside it. Hide everything before the last '@'.
		rest := trimmed[i+3:]
		at := strings.LastIndexByte(rest, '@')
		userinfo := Mask
		if user, _, ok := strings.Cut(rest[:at], ":"); ok && !strings.ContainsAny(user, "/?#") {
			userinfo = user + ":" + Mask
		}
		tail := Redact(scheme + "://" + rest[at+1:])
		return scheme + "://" + userinfo + "@" + strings.TrimPrefix(tail, scheme+"://")
	}
	u, err := url.Parse(trimmed)
	if err != nil {
		return scheme + ":[unparseable]"
	}
	if q := u.Query(); len(q) > 0 {
		changed := false
		for k := range q {
			if secretParam(k) {
				q.Set(k, Mask)
				changed = true
			}
		}
		if changed {
			u.RawQuery = q.Encode()
		}
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), Mask)
	}
	return u.String()
}

// maskSecretValues replaces, as written, the value of every secret
// parameter in the query of rest (what follows "scheme://"), up to the next
// '&': a '#' there is taken for part of the value, not a fragment.
func maskSecretValues(rest string) string {
	head, query, ok := strings.Cut(rest, "?")
	if !ok {
		return rest
	}
	params := strings.Split(query, "&")
	for i, p := range params {
		if name, _, ok := strings.Cut(p, "="); ok && secretParam(name) {
			params[i] = name + "=" + Mask
		}
	}
	return head + "?" + strings.Join(params, "&")
}

// redactQuery hides secret parameters of a path?query string.
func redactQuery(pathAndQuery string) string {
	path, query, ok := strings.Cut(pathAndQuery, "?")
	if !ok {
		return path
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return path + "?[unparseable]"
	}
	for k := range q {
		if secretParam(k) {
			q.Set(k, Mask)
		}
	}
	return path + "?" + q.Encode()
}

// redactDriverDSN hides the password of user:pass@proto(addr)/db?params,
// where the password ends at the last '@' before the address.
func redactDriverDSN(s string) string {
	at := driverDSN.FindAllStringIndex(s, -1)
	i := at[len(at)-1][0]
	userinfo, tail := s[:i], s[i:]
	if user, _, ok := strings.Cut(userinfo, ":"); ok {
		userinfo = user + ":" + Mask
	}
	head, query, ok := strings.Cut(tail, "?")
	if ok {
		return userinfo + head + "?" + redactQuery("?" + query)[1:]
	}
	return userinfo + tail
}

// Scrub replaces in text every form of the password that address s holds
// (as written, percent-decoded, and query-escaped), and s itself, in case a
// driver echoed its connection string.
func Scrub(text, s string) string {
	if s != "" && strings.Contains(text, s) {
		text = strings.ReplaceAll(text, s, Redact(s))
	}
	for _, secret := range secrets(s) {
		text = strings.ReplaceAll(text, secret, Mask)
	}
	return text
}

// secrets lists the passwords address s holds, in the forms they may
// appear in a driver's text.
func secrets(s string) []string {
	var raw []string
	trimmed := strings.TrimSpace(s)
	switch {
	case !strings.Contains(trimmed, "://") && keywordStart.MatchString(trimmed):
		if kvs, err := parseKeywords(trimmed); err == nil {
			for _, kv := range kvs {
				if secretParam(kv.key) {
					raw = append(raw, kv.value)
				}
			}
		}
	case !strings.Contains(trimmed, "://") && driverDSN.MatchString(trimmed):
		at := driverDSN.FindAllStringIndex(trimmed, -1)
		if _, pass, ok := strings.Cut(trimmed[:at[len(at)-1][0]], ":"); ok {
			raw = append(raw, pass)
		}
	default:
		if u, err := url.Parse(trimmed); err == nil {
			if pass, ok := u.User.Password(); ok {
				raw = append(raw, pass)
			}
			for k, vs := range u.Query() {
				if secretParam(k) {
					raw = append(raw, vs...)
				}
			}
		} else if i := strings.LastIndex(trimmed, "@"); i > 0 {
			// Unparseable: hide whatever sits between the scheme's user
			// and the host, the only place a password can be.
			userinfo := trimmed[:i]
			if j := strings.Index(userinfo, "://"); j >= 0 {
				userinfo = userinfo[j+3:]
			}
			if _, pass, ok := strings.Cut(userinfo, ":"); ok {
				raw = append(raw, pass)
			}
		}
	}
	var out []string
	seen := map[string]bool{}
	add := func(v string) {
		if v != "" && !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	for _, p := range raw {
		add(p)
		add(url.QueryEscape(p))
		add(url.PathEscape(p))
		add(strings.TrimPrefix(url.UserPassword("u", p).String(), "u:")) // as a URL's userinfo writes it
	}
	return out
}

// keyword is one key=value pair of a PostgreSQL connection string.
type keyword struct{ key, value string }

// parseKeywords splits a libpq key=value string: values may be single-quoted
// with backslash escapes.
func parseKeywords(s string) ([]keyword, error) {
	var out []keyword
	i := 0
	skip := func() {
		for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
			i++
		}
	}
	for {
		skip()
		if i >= len(s) {
			return out, nil
		}
		start := i
		for i < len(s) && s[i] != '=' && s[i] != ' ' && s[i] != '\t' {
			i++
		}
		key := s[start:i]
		skip()
		if key == "" || i >= len(s) || s[i] != '=' {
			return nil, fmt.Errorf("parameter %d has no '='", len(out)+1)
		}
		i++
		skip()
		var v strings.Builder
		if i < len(s) && s[i] == '\'' {
			i++
			closed := false
			for i < len(s) {
				c := s[i]
				if c == '\\' && i+1 < len(s) {
					v.WriteByte(s[i+1])
					i += 2
					continue
				}
				if c == '\'' {
					closed = true
					i++
					break
				}
				v.WriteByte(c)
				i++
			}
			if !closed {
				return nil, fmt.Errorf("the value of %q has no closing quote", key)
			}
		} else {
			for i < len(s) && s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r' {
				if s[i] == '\\' && i+1 < len(s) {
					i++
				}
				v.WriteByte(s[i])
				i++
			}
		}
		out = append(out, keyword{key: key, value: v.String()})
	}
}

// quoteKeyword quotes a key=value value when it needs it.
func quoteKeyword(v string) string {
	if v != "" && !strings.ContainsAny(v, " \t\n\r'\\") {
		return v
	}
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}
