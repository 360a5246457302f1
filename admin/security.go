package admin

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"strings"
)

// contentSecurityPolicy allows only the embedded script and style sheet:
// no inline script or style, no frames, forms post back here only.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

func setSecurityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("Permissions-Policy", "camera=(), microphone=(), geolocation=()")
	// Pages show payloads: keep them out of shared and browser caches.
	h.Set("Cache-Control", "no-store")
}

// csrfCookie names the cookie holding the browser's random CSRF secret.
const csrfCookie = "millpond_admin_csrf"

// csrfField names the form field carrying the token.
const csrfField = "csrf_token"

// csrfGuard implements signed double-submit CSRF tokens: the browser holds
// a random value in an HttpOnly, SameSite=Lax cookie and every form
// carries HMAC(key, value). A forged form from another site can neither
// read the cookie nor compute the HMAC, and its POST comes without the
// cookie. Lax, not Strict: a link followed from another site (a chat, a
// dashboard) would come without a Strict cookie, get a new one, and so
// void the tokens of every page already open.
type csrfGuard struct {
	key        []byte
	cookiePath string
	secure     bool // Options.SecureCookie
}

func (g csrfGuard) sign(value string) string {
	m := hmac.New(sha256.New, g.key)
	m.Write([]byte("millpond-admin-csrf\x00"))
	m.Write([]byte(value))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// token returns the token for forms of this page, setting the cookie when
// the browser has none yet.
func (g csrfGuard) token(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(csrfCookie); err == nil && len(c.Value) >= 32 {
		return g.sign(c.Value)
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	value := base64.RawURLEncoding.EncodeToString(b)
	http.SetCookie(w, &http.Cookie{
		Name: csrfCookie, Value: value, Path: g.cookiePath,
		HttpOnly: true, Secure: g.secure || overHTTPS(r), SameSite: http.SameSiteLaxMode,
	})
	return g.sign(value)
}

// overHTTPS reports whether the browser reached the UI over HTTPS: the
// request came over TLS, or the proxy in front of it says so in the first
// entry of X-Forwarded-Proto or of Forwarded (RFC 7239). A client that
// forges either changes only its own cookie (another site cannot set these
// headers on a browser's request).
func overHTTPS(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	if v := r.Header.Get("X-Forwarded-Proto"); v != "" {
		first, _, _ := strings.Cut(v, ",")
		return strings.EqualFold(strings.TrimSpace(first), "https")
	}
	first, _, _ := strings.Cut(r.Header.Get("Forwarded"), ",")
	for pair := range strings.SplitSeq(first, ";") {
		name, value, _ := strings.Cut(strings.TrimSpace(pair), "=")
		if strings.EqualFold(name, "proto") {
			return strings.EqualFold(strings.Trim(value, `"`), "https")
		}
	}
	return false
}

// valid reports whether the parsed form's token matches the cookie.
func (g csrfGuard) valid(r *http.Request) bool {
	c, err := r.Cookie(csrfCookie)
	if err != nil || len(c.Value) < 32 {
		return false
	}
	got := r.PostForm.Get(csrfField)
	return got != "" && hmac.Equal([]byte(got), []byte(g.sign(c.Value)))
}
