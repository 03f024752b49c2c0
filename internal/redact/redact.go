// Package redact hides the passwords that Postgres connection strings carry,
// in URL form (postgres://user:password@host/db?password=…) and in
// key=value form (host=h password='p w' …), before they reach a message.
//
// It reads the text only, never the environment, and never needs the
// connection string to be valid: a bad port, an unknown sslmode or a
// missing certificate file must not print the password either.
package redact

import "strings"

// Mask replaces each password.
const Mask = "***"

// Password returns text with every password that a Postgres URL or a
// key=value connection string in it carries replaced by Mask. Text that
// carries none is returned unchanged.
func Password(text string) string {
	return keyValues(urls(text))
}

// In returns text (an error message, say) with dsn replaced by its
// redacted form and every password left in it masked. An empty dsn
// replaces nothing.
func In(text, dsn string) string {
	if dsn != "" {
		text = strings.ReplaceAll(text, dsn, Password(dsn))
	}
	return Password(text)
}

// urls masks the user-info password of every postgres:// or
// postgresql:// URL in text.
func urls(text string) string {
	var b strings.Builder
	for {
		i := schemeIndex(text)
		if i < 0 {
			b.WriteString(text)
			return b.String()
		}
		b.WriteString(text[:i])
		text = text[i:]
		// The URL runs to the first white space (a URL carries none; a
		// password with one must be percent-encoded).
		end := 0
		for end < len(text) && !isSpace(text[end]) {
			end++
		}
		b.WriteString(maskUserInfo(text[:end]))
		text = text[end:]
	}
}

// schemeIndex finds the next "postgres://" or "postgresql://", any case.
func schemeIndex(text string) int {
	lower := asciiLower(text)
	a, b := strings.Index(lower, "postgres://"), strings.Index(lower, "postgresql://")
	switch {
	case a < 0:
		return b
	case b < 0:
		return a
	}
	return min(a, b)
}

// maskUserInfo masks the password between "scheme://user:" and the "@"
// that ends the user info. A password may hold unescaped "@", "/" or "?",
// so the user info is taken to end at the URL's last "@": when in doubt,
// mask more.
func maskUserInfo(u string) string {
	s := strings.Index(u, "://") + 3
	rest := u[s:]
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return u
	}
	colon := strings.IndexByte(rest[:at], ':')
	if colon < 0 {
		return u
	}
	return u[:s] + rest[:colon+1] + Mask + rest[at:]
}

// keyValues masks the value of every password=… (spaces around "=" allowed,
// value quoted with ' or bare): in a key=value string it runs to white space,
// in a URL's query (after "?" or "&") to the next "&".
func keyValues(text string) string {
	var b strings.Builder
	lower := asciiLower(text)
	from := 0
	for i := 0; ; {
		j := strings.Index(lower[i:], "password")
		if j < 0 {
			break
		}
		k := i + j
		i = k + len("password")
		// A key starts the string or follows white space, "?" or "&".
		var before byte = ' '
		if k > 0 {
			before = text[k-1]
		}
		if !(before == '?' || before == '&' || isSpace(before)) {
			continue
		}
		p := i
		for p < len(text) && text[p] == ' ' {
			p++
		}
		if p >= len(text) || text[p] != '=' {
			continue
		}
		p++
		for p < len(text) && text[p] == ' ' {
			p++
		}
		end := p
		switch {
		case end < len(text) && text[end] == '\'':
			end++
			for end < len(text) && text[end] != '\'' {
				if text[end] == '\\' {
					end++
				}
				end++
			}
			end = min(end+1, len(text))
		case before == '?' || before == '&':
			for end < len(text) && text[end] != '&' && !isSpace(text[end]) {
				end++
			}
		default: // a backslash escapes the next character, a space too
			for end < len(text) && !isSpace(text[end]) {
				if text[end] == '\\' {
					end++
				}
				end++
			}
			end = min(end, len(text))
		}
		if end == p {
			continue
		}
		b.WriteString(text[from:p])
		b.WriteString(Mask)
		from, i = end, end
	}
	b.WriteString(text[from:])
	return b.String()
}

// asciiLower lowers ASCII letters only, so byte offsets stay those of s
// (strings.ToLower rewrites invalid UTF-8 to longer runes).
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// isSpace is white space as libpq reads it (C isspace).
func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}

// Error wraps err so that its message goes through In(…, dsn); errors.Is
// and errors.As still see err. A nil err stays nil.
func Error(err error, dsn string) error {
	if err == nil {
		return nil
	}
	return &redacted{err: err, dsn: dsn}
}

type redacted struct {
	err error
	dsn string
}

func (r *redacted) Error() string { return In(r.err.Error(), r.dsn) }
func (r *redacted) Unwrap() error { return r.err }
