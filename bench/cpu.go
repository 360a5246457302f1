package main

import (
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuSample is CPU time spent so far by this process and by the server
// backends connected to the bench database (PostgreSQL on this machine,
// read from /proc; autovacuum is left out). Backends that exit between two samples are lost; the
// delivery phase keeps its connections, so little is.
type cpuSample struct {
	self     time.Duration
	backends map[int]time.Duration // pid -> user+system time
}

// sampleCPU reads the CPU times; the backends are those of the bench
// database, found through pg_stat_activity (PostgreSQL only).
func sampleCPU(ctx context.Context, db *database) cpuSample {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	s := cpuSample{
		self:     time.Duration(ru.Utime.Nano() + ru.Stime.Nano()),
		backends: map[int]time.Duration{},
	}
	if db.pool == nil {
		return s
	}
	rows, err := db.pool.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()")
	if err != nil {
		return s
	}
	defer rows.Close()
	for rows.Next() {
		var pid int
		if rows.Scan(&pid) == nil {
			if t, ok := procCPU(pid); ok {
				s.backends[pid] = t
			}
		}
	}
	return s
}

// procCPU returns a process's user+system CPU time from /proc/pid/stat.
func procCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, false
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	k, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+k) * 10 * time.Millisecond, true // USER_HZ is 100 on Linux
}

// cpuSince returns the CPU time this process and the database spent
// between two samples (a backend missing from the first counts from 0).
func cpuSince(a, b cpuSample) (self, dbCPU time.Duration) {
	for pid, t := range b.backends {
		dbCPU += t - a.backends[pid]
	}
	return b.self - a.self, dbCPU
}
