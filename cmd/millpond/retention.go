package main

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"time"
)

// retention is a flag.Value for a retention horizon: a Go duration
// ("168h", "90m") or whole days, alone or before one ("7d", "1d12h"), the
// unit people think of retention in. time.ParseDuration has no day unit
// and answers "7d" with a bare parse error.
type retention time.Duration

func (r *retention) String() string { return time.Duration(*r).String() }

func (r *retention) Set(s string) error {
	d, err := parseRetention(s)
	if err != nil {
		return err
	}
	*r = retention(d)
	return nil
}

// errRetention is what a horizon that is neither a duration nor days gets.
var errRetention = errors.New("want a duration such as 168h, 7d, 1d12h or 30m")

func parseRetention(s string) (time.Duration, error) {
	rest := s
	var days time.Duration
	if i := strings.IndexByte(rest, 'd'); i >= 0 {
		n, err := strconv.ParseUint(rest[:i], 10, 31)
		if err != nil || i == 0 || n > math.MaxInt64/uint64(24*time.Hour) {
			return 0, errRetention
		}
		days, rest = time.Duration(n)*24*time.Hour, rest[i+1:]
		if rest == "" {
			return days, nil
		}
		if rest[0] == '-' || rest[0] == '+' {
			return 0, errRetention
		}
	}
	d, err := time.ParseDuration(rest)
	if err != nil {
		return 0, errRetention
	}
	if d < 0 && days > 0 || d > math.MaxInt64-days {
		return 0, errRetention
	}
	return days + d, nil
}
