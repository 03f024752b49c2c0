package redact_test

import (
	"net/url"
	"strings"
	"testing"

	"github.com/exactly-go/exactly/internal/redact"
)

func TestPassword(t *testing.T) {
	cases := []struct{ in, want string }{
		{"postgres://app:s3cr3t@db:5432/ledger", "postgres://app:***@db:5432/ledger"},
		{"postgres://app:s3cr3t@db:5432/ledger?sslmode=bogus", "postgres://app:***@db:5432/ledger?sslmode=bogus"},
		{"postgres://app:s3cr3t@db:notaport/ledger", "postgres://app:***@db:notaport/ledger"},
		{"postgresql://app:s3cr3t@db/ledger?sslmode=verify-full&sslrootcert=/missing.pem", "postgresql://app:***@db/ledger?sslmode=verify-full&sslrootcert=/missing.pem"},
		{"POSTGRES://app:p@ss/w?rd@db/x", "POSTGRES://app:***@db/x"},
		{"postgres://app@db/x?password=s3cr3t&sslmode=require", "postgres://app@db/x?password=***&sslmode=require"},
		{"postgres://db/x", "postgres://db/x"},
		{"host=db user=app password=s3cr3t sslmode=bogus", "host=db user=app password=*** sslmode=bogus"},
		{"host=db password = 's3 cr\\'3t' port=x", "host=db password = *** port=x"},
		{"password=s3\\ cr3t dbname=x", "password=*** dbname=x"},
		{"PASSWORD=s3cr3t", "PASSWORD=***"},
		{"cannot parse `postgres://app:s3cr3t@db:bad/x`: invalid port", "cannot parse `postgres://app:***@db:bad/x`: invalid port"},
		{"no secrets here: passwords=1 mypassword=2", "no secrets here: passwords=1 mypassword=2"},
		{"", ""},
	}
	for _, c := range cases {
		if got := redact.Password(c.in); got != c.want {
			t.Errorf("Password(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// In with an empty DSN replaces nothing (strings.ReplaceAll with "" would
// insert the replacement between every character).
func TestInEmptyDSN(t *testing.T) {
	const msg = "read ledger.commands/0: connection refused"
	if got := redact.In(msg, ""); got != msg {
		t.Fatalf("In(%q, \"\") = %q", msg, got)
	}
	dsn := "postgres://app:s3cr3t@db:bad/x"
	if got := redact.In("connect "+dsn+": refused", dsn); strings.Contains(got, "s3cr3t") {
		t.Fatalf("leaked: %q", got)
	}
}

// A password marked by a token that nothing else contains never survives,
// whatever the rest of the URL or key=value string holds.
func FuzzPassword(f *testing.F) {
	f.Add("app", "s3cr3t", "db:5432", "ledger", "sslmode=bogus")
	f.Add("u", "p@ss/w?rd", "db:notaport", "", "sslrootcert=/missing.pem")
	f.Add("", "'\\ x", "[::1]:5", "d b", "")
	f.Fuzz(func(t *testing.T, user, pw, host, db, query string) {
		secret := "ZQXJ" + pw + "KVWY"
		check := func(form, s string) {
			got := redact.Password(s)
			if strings.Contains(got, "ZQXJ") || strings.Contains(got, "KVWY") {
				t.Fatalf("%s form: Password(%q) = %q keeps the password", form, s, got)
			}
			if again := redact.Password(got); again != got {
				t.Fatalf("not idempotent: %q then %q", got, again)
			}
		}
		if !strings.ContainsAny(user+host+db+query, "ZQXJKVWY") {
			u := url.URL{Scheme: "postgres", User: url.UserPassword(user, secret), Host: host, Path: "/" + db, RawQuery: query}
			check("URL", u.String())
			v := url.Values{"password": {secret}}
			q := url.URL{Scheme: "postgres", User: url.User(user), Host: host, Path: "/" + db, RawQuery: v.Encode() + "&" + query}
			check("URL query", q.String())
			quoted := "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(secret) + "'"
			check("key=value", "host="+strings.ReplaceAll(host, " ", "")+" user=x password="+quoted+" dbname=y")
			check("key=value, bare", "user=x password="+bareEscape(secret)+" sslmode=bogus")
		}
	})
}

// bareEscape escapes a bare key=value value as libpq reads it: a backslash
// before each backslash and white space character.
func bareEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if strings.IndexByte("\\ \t\n\r\v\f", s[i]) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
