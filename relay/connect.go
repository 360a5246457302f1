package relay

import (
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// RedactURL hides the credentials of NATS server URLs (a comma-separated
// list is accepted): "nats://user:pass@host:4222" and "nats://token@host"
// both become "nats://[REDACTED]@host…". Text that does not parse as a URL
// is redacted whole.
func RedactURL(servers string) string {
	parts := strings.Split(servers, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if !strings.Contains(p, "://") {
			if strings.Contains(p, "@") {
				p = "[REDACTED]" + p[strings.LastIndex(p, "@"):]
			}
			parts[i] = p
			continue
		}
		if cutUserinfo(p) {
			scheme, rest, _ := strings.Cut(p, "://")
			parts[i] = scheme + "://[REDACTED]" + rest[strings.LastIndex(rest, "@"):]
			continue
		}
		u, err := url.Parse(p)
		if err != nil {
			parts[i] = "[REDACTED]"
			continue
		}
		if u.User != nil {
			parts[i] = u.Scheme + "://[REDACTED]@" + u.Host + u.EscapedPath()
		} else {
			parts[i] = u.Scheme + "://" + u.Host + u.EscapedPath()
		}
	}
	return strings.Join(parts, ",")
}

// cutUserinfo reports a server URL with an '@' after its host: a user name
// or password holding an unencoded '/', '?' or '#' ended the host part
// early, and the rest of it parses as a path, query or fragment (a NATS
// URL has no use for an '@' there).
func cutUserinfo(server string) bool {
	_, rest, ok := strings.Cut(server, "://")
	end := strings.IndexAny(rest, "/?#")
	return ok && end >= 0 && strings.Contains(rest[end:], "@")
}

// serverURLs splits a comma-separated list of NATS server URLs as nats.go
// reads it: an entry without a scheme is a nats:// URL.
func serverURLs(servers string) []string {
	var out []string
	for p := range strings.SplitSeq(servers, ",") {
		p = strings.TrimSpace(p)
		if !strings.Contains(p, "://") {
			p = "nats://" + p
		}
		out = append(out, p)
	}
	return out
}

// scrubURL removes every credential of servers from text.
func scrubURL(text, servers string) string {
	for _, p := range serverURLs(servers) {
		if u, err := url.Parse(p); err == nil && u.User != nil {
			if pw, ok := u.User.Password(); ok && pw != "" {
				text = strings.ReplaceAll(text, pw, "[REDACTED]")
			}
			if name := u.User.Username(); name != "" {
				text = strings.ReplaceAll(text, name, "[REDACTED]")
			}
		}
	}
	return text
}

// Connect opens a NATS connection for a relay: it fails at once with
// ErrInvalidConfig when a server URL does not parse (a user name or
// password with reserved characters must be percent-encoded) and with
// ErrUnreachable (the URL redacted) when no server answers; once connected
// it reconnects forever, so a relay rides out broker restarts. opts come
// after the relay's own and override them. No error shows a credential.
func Connect(servers string, opts ...nats.Option) (*nats.Conn, error) {
	if err := checkServerURLs(servers); err != nil {
		return nil, err
	}
	base := []nats.Option{
		nats.Name("millpond-relay"),
		nats.Timeout(5 * time.Second),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
	}
	nc, err := nats.Connect(servers, append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %s", ErrUnreachable, RedactURL(servers), scrubURL(err.Error(), servers))
	}
	return nc, nil
}

// checkServerURLs refuses, with ErrInvalidConfig and naming only which URL
// of the list, a server URL that does not parse or has an '@' after its
// host. Checked before nats.go sees the URLs because its own parse error
// quotes the URL, which cannot be scrubbed of a credential it cannot parse.
func checkServerURLs(servers string) error {
	urls := serverURLs(servers)
	for i, p := range urls {
		if cutUserinfo(p) {
			return fmt.Errorf("%w: NATS server URL %d of %d has an '@' after its host (percent-encode '/', '?', '#' and '@' in its user name and password)",
				ErrInvalidConfig, i+1, len(urls))
		}
		if _, err := url.Parse(p); err != nil {
			return fmt.Errorf("%w: NATS server URL %d of %d does not parse (percent-encode reserved characters in its user name and password)",
				ErrInvalidConfig, i+1, len(urls))
		}
	}
	return nil
}
