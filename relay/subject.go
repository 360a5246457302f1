package relay

import (
	"fmt"
	"strings"
	"unicode"
)

// Placeholders a subject template may use, each as a whole token.
const (
	// PlaceholderPrefix is JetStreamConfig.SubjectPrefix (one or more tokens).
	PlaceholderPrefix = "{prefix}"
	// PlaceholderStream is the event's outbox stream.
	PlaceholderStream = "{stream}"
	// PlaceholderKind is the event's kind.
	PlaceholderKind = "{kind}"
	// PlaceholderKey is the event's idempotency key.
	PlaceholderKey = "{key}"
	// PlaceholderOrderingKey is the event's ordering key; for an event
	// without one it is UnorderedMark followed by the event's key, so an
	// unordered event is a key of its own and never shares a subject with
	// an ordering key.
	PlaceholderOrderingKey = "{ordering_key}"
)

// DefaultSubjectTemplate is the subject template when
// JetStreamConfig.SubjectTemplate is empty: "{prefix}.{stream}.{kind}".
const DefaultSubjectTemplate = PlaceholderPrefix + "." + PlaceholderStream + "." + PlaceholderKind

// OrderingKeySubjectTemplate is the template with the ordering key as the
// last token, used when JetStreamConfig.OrderingKeyInSubject or
// JetStreamConfig.Strict is set and no template is given:
// "{prefix}.{stream}.{kind}.{ordering_key}".
const OrderingKeySubjectTemplate = DefaultSubjectTemplate + "." + PlaceholderOrderingKey

// DefaultSubjectPrefix is the subject prefix when
// JetStreamConfig.SubjectPrefix is empty.
const DefaultSubjectPrefix = "millpond"

// DotReplacement replaces every '.' of a stream, kind, key or ordering key
// put in a subject, since '.' separates NATS subject tokens: "order.42"
// becomes the single token "order~42". Outbox names are
// [A-Za-z0-9._:-], so '~' never occurs in them and the encoding is
// reversible (see DecodeToken).
const DotReplacement = "~"

// UnorderedMark starts the {ordering_key} token of an event without an
// ordering key ("%" and the encoded event key); it never occurs in an
// encoded ordering key.
const UnorderedMark = "%"

// EncodeToken makes an outbox name ([A-Za-z0-9._:-]) one NATS subject token.
func EncodeToken(name string) string { return strings.ReplaceAll(name, ".", DotReplacement) }

// DecodeToken reverses EncodeToken.
func DecodeToken(token string) string { return strings.ReplaceAll(token, DotReplacement, ".") }

// MsgID is the Nats-Msg-Id of an event: "<stream>/<key>". Outbox streams
// and keys never contain '/', so two (stream, key) pairs never share an id,
// and the id does not change when the event is published again.
func MsgID(stream, key string) string { return stream + "/" + key }

// subjectTemplate is a parsed template: literal tokens and placeholders.
type subjectTemplate struct {
	parts []string // literal text (dots included) or a placeholder
	has   map[string]bool
	// perEvent: the template holds {key} or {ordering_key}, so events of
	// one stream and kind may have different subjects.
	perEvent bool
}

// parseTemplate checks a template against NATS subject rules and expands
// {prefix}.
func parseTemplate(tmpl, prefix string) (subjectTemplate, error) {
	if err := checkLiteral("subject prefix", prefix); err != nil {
		return subjectTemplate{}, err
	}
	t := subjectTemplate{has: map[string]bool{}}
	if tmpl == "" {
		return t, fmt.Errorf("%w: empty", ErrInvalidSubjectTemplate)
	}
	for tok := range strings.SplitSeq(tmpl, ".") {
		switch tok {
		case PlaceholderPrefix:
			t.parts = append(t.parts, prefix)
		case PlaceholderStream, PlaceholderKind, PlaceholderKey, PlaceholderOrderingKey:
			t.parts = append(t.parts, tok)
			t.has[tok] = true
		default:
			if strings.ContainsAny(tok, "{}") {
				return t, fmt.Errorf("%w: %q: unknown placeholder %q (want %s, %s, %s, %s or %s as a whole token)",
					ErrInvalidSubjectTemplate, tmpl, tok, PlaceholderPrefix, PlaceholderStream, PlaceholderKind, PlaceholderKey, PlaceholderOrderingKey)
			}
			if err := checkLiteral("subject template "+fmt.Sprintf("%q", tmpl), tok); err != nil {
				return t, err
			}
			t.parts = append(t.parts, tok)
		}
	}
	t.perEvent = t.has[PlaceholderKey] || t.has[PlaceholderOrderingKey]
	return t, nil
}

// checkLiteral checks literal subject text: tokens that are not empty, with
// no whitespace, control character or wildcard.
func checkLiteral(what, s string) error {
	if s == "" {
		return fmt.Errorf("%w: %s has an empty token", ErrInvalidSubjectTemplate, what)
	}
	for tok := range strings.SplitSeq(s, ".") {
		if tok == "" {
			return fmt.Errorf("%w: %s %q has an empty token (a leading, trailing or doubled '.')", ErrInvalidSubjectTemplate, what, s)
		}
		if tok == "*" || tok == ">" || strings.ContainsAny(tok, "*>") {
			return fmt.Errorf("%w: %s %q has a wildcard ('*' or '>'); a published subject cannot", ErrInvalidSubjectTemplate, what, s)
		}
		for _, r := range tok {
			if unicode.IsSpace(r) || unicode.IsControl(r) || r > unicode.MaxASCII {
				return fmt.Errorf("%w: %s %q has whitespace, a control or a non-ASCII character", ErrInvalidSubjectTemplate, what, s)
			}
		}
	}
	return nil
}

// subject fills the template for one event.
func (t subjectTemplate) subject(stream, kind, key, orderingKey string) string {
	var b strings.Builder
	n := len(t.parts) + len(UnorderedMark)
	for _, p := range t.parts {
		switch p {
		case PlaceholderStream:
			n += len(stream)
		case PlaceholderKind:
			n += len(kind)
		case PlaceholderKey:
			n += len(key)
		case PlaceholderOrderingKey:
			n += max(len(orderingKey), len(key))
		default:
			n += len(p)
		}
	}
	b.Grow(n)
	for i, p := range t.parts {
		if i > 0 {
			b.WriteByte('.')
		}
		switch p {
		case PlaceholderStream:
			b.WriteString(EncodeToken(stream))
		case PlaceholderKind:
			b.WriteString(EncodeToken(kind))
		case PlaceholderKey:
			b.WriteString(EncodeToken(key))
		case PlaceholderOrderingKey:
			if orderingKey == "" {
				b.WriteString(UnorderedMark + EncodeToken(key))
			} else {
				b.WriteString(EncodeToken(orderingKey))
			}
		default:
			b.WriteString(p)
		}
	}
	return b.String()
}
