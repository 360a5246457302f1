package sqlcore

import (
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/millpond/millpond/internal/panicstack"
)

// Bounds on every input, from the seed outbox and kept exactly.
const (
	// MaxKeyLen is the longest stream, event key, kind, group or worker id.
	MaxKeyLen = 128
	// MaxPayloadBytes is the largest payload accepted by Enqueue.
	MaxPayloadBytes = 1 << 20
	// MaxMetadataBytes is the largest metadata accepted by Enqueue, measured
	// as the JSON object stored.
	MaxMetadataBytes = 64 << 10
	// MaxErrorBytes is the longest failure text stored with a failed event.
	MaxErrorBytes = 512
	// MinLease and MaxLease bound a claim's lease.
	MinLease = time.Second
	// MaxLease is the longest lease a claim may take.
	MaxLease = time.Hour
	// MaxAttemptsLimit is the highest attempt limit.
	MaxAttemptsLimit = 100
	// MaxDelay is the longest retry or enqueue delay.
	MaxDelay = 24 * time.Hour
	// MaxBatch is the largest number of events claimed, acknowledged,
	// extended, released, listed or requeued by one call.
	MaxBatch = 1000
	// MaxPurgeBatch is the largest number of rows removed by one Purge call.
	MaxPurgeBatch = 100_000
	// ClaimKeyLen is the length of a claim key: 128 random bits in hex.
	ClaimKeyLen = 32
)

// ValidateKey checks a stream, event key, event kind, group or worker id.
func ValidateKey(field, value string) error {
	if value == "" || len(value) > MaxKeyLen {
		return fmt.Errorf("%s must be 1-%d characters, got %d: %w", field, MaxKeyLen, len(value), ErrInvalidKey)
	}
	for i := 0; i < len(value); i++ {
		if !keyByte(value[i]) {
			return fmt.Errorf("%s must contain only ASCII letters, digits, '.', '-', '_' or ':' (byte %d is not allowed): %w",
				field, i, ErrInvalidKey)
		}
	}
	return nil
}

// ValidateOrderingKey checks an event's ordering key: empty (unordered) or
// 1-MaxKeyLen characters of [A-Za-z0-9._:-].
func ValidateOrderingKey(key string) error {
	if key == "" {
		return nil
	}
	return ValidateKey("ordering key", key)
}

// ValidateGroup checks a consumer group; the empty string is the default group.
func ValidateGroup(group string) error {
	if group == "" {
		return nil
	}
	return ValidateKey("consumer group", group)
}

func keyByte(b byte) bool {
	return b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' ||
		b == '.' || b == '-' || b == '_' || b == ':'
}

// ValidateLease checks a claim lease.
func ValidateLease(lease time.Duration) error {
	if lease < MinLease || lease > MaxLease {
		return fmt.Errorf("lease %s is outside %s-%s: %w", lease, MinLease, MaxLease, ErrInvalidLease)
	}
	return nil
}

// ValidateAttempts checks an attempt limit.
func ValidateAttempts(maxAttempts int) error {
	if maxAttempts < 1 || maxAttempts > MaxAttemptsLimit {
		return fmt.Errorf("attempt limit %d is outside 1-%d: %w", maxAttempts, MaxAttemptsLimit, ErrInvalidAttempts)
	}
	return nil
}

// ValidateDelay checks a retry or enqueue delay.
func ValidateDelay(delay time.Duration) error {
	if delay < 0 || delay > MaxDelay {
		return fmt.Errorf("delay %s is outside 0-%s: %w", delay, MaxDelay, ErrInvalidDelay)
	}
	return nil
}

// ValidateBatch checks a batch size.
func ValidateBatch(n int) error {
	if n < 1 || n > MaxBatch {
		return fmt.Errorf("batch of %d is outside 1-%d: %w", n, MaxBatch, ErrInvalidBatch)
	}
	return nil
}

// ValidateErrorText checks failure text stored with a failed event.
func ValidateErrorText(text string) error {
	switch {
	case text == "":
		return fmt.Errorf("failure text is empty: %w", ErrInvalidErrorText)
	case len(text) > MaxErrorBytes:
		return fmt.Errorf("failure text is %d bytes, more than %d: %w", len(text), MaxErrorBytes, ErrInvalidErrorText)
	case !utf8.ValidString(text):
		return fmt.Errorf("failure text is not valid UTF-8: %w", ErrInvalidErrorText)
	case strings.IndexFunc(text, unicode.IsControl) >= 0:
		return fmt.Errorf("failure text contains a control character: %w", ErrInvalidErrorText)
	}
	return nil
}

// SanitizeErrorText turns any handler error text into text that
// ValidateErrorText accepts: control characters become spaces, invalid UTF-8
// is replaced, and the result is cut at a rune boundary to MaxErrorBytes.
// Empty input becomes "handler failed". A goroutine traceback in the text
// (Watermill's Recoverer middleware puts one in its error) loses its
// frames' argument values, which can hold fields of the event.
func SanitizeErrorText(text string) string {
	text = panicstack.StripTraceback(text)
	text = strings.ToValidUTF8(text, "\uFFFD")
	text = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, text)
	text = strings.TrimSpace(text)
	if len(text) > MaxErrorBytes {
		cut := MaxErrorBytes
		for cut > 0 && !utf8.RuneStart(text[cut]) {
			cut--
		}
		text = text[:cut]
	}
	if text == "" {
		return "handler failed"
	}
	return text
}

// ValidateReceipt checks an event id and claim key.
func ValidateReceipt(r Receipt) error {
	if r.ID <= 0 {
		return fmt.Errorf("event id %d must be positive: %w", r.ID, ErrInvalidID)
	}
	if len(r.ClaimKey) != ClaimKeyLen {
		return fmt.Errorf("claim key must be %d hex characters: %w", ClaimKeyLen, ErrInvalidClaimKey)
	}
	for i := 0; i < len(r.ClaimKey); i++ {
		c := r.ClaimKey[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return fmt.Errorf("claim key must be lowercase hex: %w", ErrInvalidClaimKey)
		}
	}
	return nil
}

func validateReceipts(rs []Receipt) error {
	if err := ValidateBatch(len(rs)); err != nil {
		return err
	}
	for _, r := range rs {
		if err := ValidateReceipt(r); err != nil {
			return err
		}
	}
	return nil
}

func validateIDs(ids []int64) error {
	if err := ValidateBatch(len(ids)); err != nil {
		return err
	}
	for _, id := range ids {
		if id <= 0 {
			return fmt.Errorf("event id %d must be positive: %w", id, ErrInvalidID)
		}
	}
	return nil
}
