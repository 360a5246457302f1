package main

import (
	"strings"
	"testing"
	"time"
)

func TestParseRetention(t *testing.T) {
	const day = 24 * time.Hour
	good := map[string]time.Duration{
		"0":      0,
		"0s":     0,
		"168h":   168 * time.Hour,
		"90m":    90 * time.Minute,
		"7d":     7 * day,
		"0d":     0,
		"1d12h":  day + 12*time.Hour,
		"30d1m":  30*day + time.Minute,
		"-1h":    -time.Hour, // refused by purge itself, with its own message
		"1.5h":   90 * time.Minute,
		"365d":   365 * day,
		"2d0.5h": 2*day + 30*time.Minute,
	}
	for in, want := range good {
		got, err := parseRetention(in)
		if err != nil || got != want {
			t.Errorf("parseRetention(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "d", "7x", "7 d", "-7d", "+7d", "1d-1h", "1d+1h", "7dd", "1.5d", "soon", "99999999999d"} {
		if got, err := parseRetention(in); err == nil {
			t.Errorf("parseRetention(%q) = %v, want an error", in, got)
		}
	}
}

func TestPurgeTakesDays(t *testing.T) {
	code, _, stderr := cli(t, nil, "-db", "sqlite:"+t.TempDir()+"/x.db", "purge", "-older-than", "7x")
	if code != exitUsage || !strings.Contains(stderr, "7d") || strings.Contains(stderr, "parse error") {
		t.Errorf("purge -older-than 7x: code %d, stderr %q; want a usage error naming the accepted forms", code, stderr)
	}
}

// TestParseRetentionOverflow: a number of days beyond time.Duration's range
// (about 292 years) wrapped around, into a negative horizon or a short
// positive one that would purge recent events.
func TestParseRetentionOverflow(t *testing.T) {
	for _, in := range []string{"106752d", "213504d", "250000d", "106751d24h", "106751d2562047h"} {
		if got, err := parseRetention(in); err == nil {
			t.Errorf("parseRetention(%q) = %v, want an error", in, got)
		}
	}
	if got, err := parseRetention("106751d"); err != nil || got != 106751*24*time.Hour {
		t.Errorf("parseRetention(106751d) = %v, %v", got, err)
	}
}
