package dsn

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
)

func TestParseAcceptsKnownForms(t *testing.T) {
	for _, c := range []struct {
		in      string
		dialect Dialect
		path    string
	}{
		{"postgres://u:p@h:5432/db?sslmode=disable", Postgres, ""},
		{"PostgreSQL://u@h/db", Postgres, ""},
		{"postgres:///db?host=/var/run/postgresql", Postgres, ""},
		{"host=127.0.0.1 user=postgres password=s3cret dbname=test", Postgres, ""},
		{"  dbname = test host='a b'", Postgres, ""},
		{"mysql://root@127.0.0.1:3306/test", MySQL, ""},
		{"mariadb://u:p@h/db", MySQL, ""},
		{"sqlite:orders.db", SQLite, "orders.db"},
		{"sqlite:///var/lib/o.db", SQLite, "/var/lib/o.db"},
		{"file:o.db?mode=rw", SQLite, "o.db?mode=rw"},
	} {
		a, err := Parse(c.in)
		if err != nil {
			t.Errorf("%s: %v", Redact(c.in), err)
			continue
		}
		if a.Dialect != c.dialect || a.Path != c.path || a.Raw() != c.in {
			t.Errorf("%s: got %+v (path %q)", Redact(c.in), a, a.Path)
		}
	}
}

func TestParseRefusesEverythingElse(t *testing.T) {
	const pw = "Sup3rSecretPW"
	for _, in := range []string{
		"",
		"   ",
		"nonsense://",
		"orders.db",
		"/var/lib/orders.db",
		"postgress://u:" + pw + "@h/db",
		"root:" + pw + "@tcp(127.0.0.1:3306)/test",
		"sqlite:",
		"sqlite://",
		"file:?mode=memory",
		"postgres:db",
		"postgres://u:" + pw + "@h:99999999999999999999/db%zz",
		"mysql://u:" + pw + "@/db",
		"host='unterminated password=" + pw,
		pw,
	} {
		_, err := Parse(in)
		if err == nil {
			t.Errorf("%q: want an error", Redact(in))
			continue
		}
		if !errors.Is(err, ErrUnsupported) {
			t.Errorf("%q: %v does not wrap ErrUnsupported", Redact(in), err)
		}
		if strings.Contains(err.Error(), pw) {
			t.Errorf("the error shows the password: %v", err)
		}
	}
	_, err := Parse("nonsense://x")
	for _, form := range []string{"postgres://", "mysql://", "sqlite:", "key=value"} {
		if !strings.Contains(err.Error(), form) {
			t.Errorf("the error does not list %s: %v", form, err)
		}
	}
	_, err = Parse("root:pw@tcp(127.0.0.1:3306)/test")
	if !strings.Contains(err.Error(), "mysql://user:pass@host:3306/db") {
		t.Errorf("a go-sql-driver DSN gets no hint: %v", err)
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:p%40ss@h:5432/db?sslmode=disable":        "postgres://u:xxxxx@h:5432/db?sslmode=disable",
		"postgres://u@h/db?password=p&sslmode=disable":         "postgres://u@h/db?password=xxxxx&sslmode=disable",
		"host=h user=u password=s3cret dbname=d":               "host=h user=u password=xxxxx dbname=d",
		"host=h password='with space' sslpassword=k dbname=d":  "host=h password=xxxxx sslpassword=xxxxx dbname=d",
		"root:pw@tcp(127.0.0.1:3306)/test?parseTime=true":      "root:xxxxx@tcp(127.0.0.1:3306)/test?parseTime=true",
		"root:p@w@tcp(h)/db":                                   "root:xxxxx@tcp(h)/db",
		"mysql://root:pw@127.0.0.1:3306/test":                  "mysql://root:xxxxx@127.0.0.1:3306/test",
		"sqlite:orders.db":                                     "sqlite:orders.db",
		"sqlite:o.db?_pragma=key(1)&password=x":                "sqlite:o.db?_pragma=key%281%29&password=xxxxx",
		"postgres://u:p@h/db%zz":                               "postgres:[unparseable]",
		"just some words with a secret":                        "[unrecognised database address]",
		"host='unterminated password=s3cret":                   "[unparseable key=value string]",
		"":                                                     "",
		"nonsense://u:pw@h":                                    "nonsense://u:xxxxx@h",
		"postgres://u:p@h/db?sslmode=require&sslpassword=k%20": "postgres://u:xxxxx@h/db?sslmode=require&sslpassword=xxxxx",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestAddressPrintsRedacted(t *testing.T) {
	a, err := Parse("postgres://u:s3cretPW@h/db")
	if err != nil {
		t.Fatal(err)
	}
	for _, out := range []string{a.String(), fmt.Sprint(a), fmt.Sprintf("%v %+v %#v %s", a, a, a, a)} {
		if strings.Contains(out, "s3cretPW") {
			t.Errorf("printed the password: %s", out)
		}
	}
}

func TestScrub(t *testing.T) {
	raw := "postgres://u:p%40ss%20w@h/db"
	text := "dial " + raw + " failed for p@ss w (p%40ss%20w, p%40ss+w)"
	got := Scrub(text, raw)
	for _, leak := range []string{"p@ss w", "p%40ss%20w", "p%40ss+w"} {
		if strings.Contains(got, leak) {
			t.Errorf("Scrub left %q in %q", leak, got)
		}
	}
	kv := "host=h password='a b\\'c' dbname=d"
	if got := Scrub("auth failed: a b'c", kv); strings.Contains(got, "a b'c") {
		t.Errorf("Scrub of a key=value password: %q", got)
	}
}

// forms puts a password in every address form Redact and Scrub know.
func forms(pw string) []string {
	esc := url.QueryEscape(pw)
	user := url.UserPassword("u", pw).String()
	return []string{
		"postgres://" + user + "@h:5432/db",
		"postgresql://u@h/db?password=" + esc,
		"mysql://" + user + "@h:3306/db",
		"host=h user=u password=" + quoteKeyword(pw) + " dbname=d",
		"user=u sslpassword=" + quoteKeyword(pw),
		"u:" + pw + "@tcp(h:3306)/db",
		"sqlite:f.db?password=" + esc,
	}
}

func FuzzRedactHidesThePassword(f *testing.F) {
	for _, seed := range []string{"s3cret", "p@ss word", "a'b\\c", "ü/?#%", "x:y@z"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		// A marker makes the password unique in the address, so finding
		// it in the output can only mean a leak.
		pw := "Qz7" + body + "Qz7"
		if strings.ContainsAny(pw, "\x00") {
			return
		}
		for _, in := range forms(pw) {
			if out := Redact(in); strings.Contains(out, pw) {
				t.Fatalf("Redact(%q) = %q shows the password", in, out)
			}
			if out := Scrub("error: "+in+" "+pw, in); strings.Contains(out, pw) {
				t.Fatalf("Scrub kept the password of %q: %q", in, out)
			}
			if _, err := Parse(in); err != nil && strings.Contains(err.Error(), pw) {
				t.Fatalf("Parse(%q) error shows the password: %v", in, err)
			}
		}
	})
}

// TestUnencodedSeparatorInPassword: a password holding '#', '/' or '?'
// that is not percent-encoded ends the URL's authority early, so the rest
// of the password parses as a fragment, path or query (a port of its first
// digits, if any): such addresses were printed whole. Redact hides
// everything before the last '@', and Parse refuses those it can tell,
// naming nothing of them, before a driver sees a password it would cut.
func TestUnencodedSeparatorInPassword(t *testing.T) {
	const secret = "Hunter2secret"
	for _, c := range []struct {
		in, want string
		refused  bool
	}{
		{"postgres://u:12#" + secret + "@h:5432/db", "postgres://u:xxxxx@h:5432/db", true},
		{"postgres://u:#" + secret + "@h/db?sslmode=disable", "postgres://u:xxxxx@h/db?sslmode=disable", true},
		{"postgres://u:12/" + secret + "@h/db", "postgres://u:xxxxx@h/db", true},
		{"postgres://u:12?" + secret + "@h/db", "postgres://u:xxxxx@h/db", true},
		{"mysql://u:a@b#" + secret + "@h:3306/db", "mysql://u:xxxxx@h:3306/db", true},
		{"mysql://u:a@b?" + secret + "@h:3306/db", "mysql://u:xxxxx@h:3306/db", true},
		{"postgres://12#" + secret + "@h/db?password=" + secret, "postgres://xxxxx@h/db?password=xxxxx", true},
		// A query value may hold an '@' (a user name of a managed
		// service): accepted, and shown hidden when no user precedes it.
		{"postgres://u:12?a=" + secret + "@h/db", "postgres://u:xxxxx@h/db", false},
		{"postgres://h:5432/db?user=app@corp", "postgres://h:xxxxx@corp", false},
		{"postgres://u:p@h/db?application_name=a@b", "postgres://u:xxxxx@h/db?application_name=a@b", false},
	} {
		got := Redact(c.in)
		if got != c.want {
			t.Errorf("Redact(%q) = %q, want %q", c.in, got, c.want)
		}
		a, err := Parse(c.in)
		if c.refused != errors.Is(err, ErrUnsupported) {
			t.Errorf("Parse(%s) = %v, %v; want refused %v", c.want, a, err, c.refused)
		}
		for _, out := range []string{fmt.Sprint(err), a.String(), fmt.Sprintf("%v %+v %#v", a, a, a)} {
			if strings.Contains(out, "Hunter") {
				t.Errorf("%s: printed the password: %s", c.want, out)
			}
		}
	}
}

// TestRedactSecretQueryValueWithAt: with no user before the host, an '@'
// in a query value makes Redact hide everything before the last '@'; when
// that '@' is inside a password parameter, the password's rest followed it.
func TestRedactSecretQueryValueWithAt(t *testing.T) {
	for _, in := range []string{
		"postgres://h/db?password=p@Hunter2&sslmode=disable",
		"postgres://h:5432/db?user=app@corp&password=s3cr@Hunter2",
		"postgresql:///db?host=/var/run/postgresql&password=a@Hunter2",
		"mysql://h:3306/db?password=p@Hunter2",
		"postgres://u:12/x@h/db?password=p@Hunter2",
	} {
		a, _ := Parse(in)
		for _, out := range []string{Redact(in), a.String()} {
			if strings.Contains(out, "Hunter") {
				t.Errorf("Redact(%q) = %q shows the password", in, out)
			}
		}
	}
}

// TestRedactSQLitePathWithAt: a SQLite file's path may hold an '@' (a
// directory named after an instance or an account); it has no user or
// password, and Parse takes it whole as the path, so Redact shows it.
func TestRedactSQLitePathWithAt(t *testing.T) {
	for in, want := range map[string]string{
		"sqlite:///var/lib/app@1/events.db":               "sqlite:///var/lib/app@1/events.db",
		"file:///home/me@corp/app.db":                     "file:///home/me@corp/app.db",
		"sqlite:///var/lib/app@1/e.db?password=p@Hunter2": "sqlite:///var/lib/app@1/e.db?password=xxxxx",
		"sqlite:app@1/events.db":                          "sqlite:app@1/events.db",
	} {
		a, err := Parse(in)
		if err != nil {
			t.Errorf("Parse(%q): %v", in, err)
		}
		if got := a.String(); got != want {
			t.Errorf("Parse(%q).String() = %q, want %q", in, got, want)
		}
	}
}
