package main

import (
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuTimes is CPU time consumed so far by the bench process, by the
// database's server processes serving the bench's database (PostgreSQL on
// this machine; autovacuum is left out, the sampling connection counted),
// or MariaDB's connection threads serving it (on this machine),
// and by the NATS server (on this machine; it may serve others too). A part
// that cannot be read is negative.
type cpuTimes struct {
	client, db, nats time.Duration
	// sleeps is how often the bench process's threads waited (voluntary
	// context switches: a parked Go runtime thread, a sync of the database
	// file), -1 when unknown.
	sleeps int64
	// backends is each database backend's CPU time, by process (pid and
	// start time, so a reused pid is another process). A difference of two
	// samples counts, for a backend present in both, the time between
	// them, and for a backend that started after the first sample, all of
	// its time; a backend that exited before the second sample is left
	// out (pool connections live through a measured phase).
	backends map[backend]time.Duration
	// ours, when not nil, names the backends of backends that serve the
	// bench's database (MariaDB, whose backends are the threads of every
	// connection); the others only tell how much time a thread that
	// switched to the bench's database had used before.
	ours map[backend]bool
	// natsThreads is each nats-server thread's CPU time, keyed like
	// backends and differenced the same way (a thread that exits between
	// two samples is left out; summing all threads and differencing the
	// sums would subtract its whole life).
	natsThreads map[backend]time.Duration
}

// backend identifies a server process: its pid and its start time (in
// clock ticks since boot).
type backend struct {
	pid   int
	start int64
}

// sampleCPU reads cpuTimes. The server processes are read from /proc
// (Linux, same machine): PostgreSQL backends and the NATS server's threads
// from schedstat, in nanoseconds (a tick, 10 ms, is 1 µs per event of a
// 10,000-event run).
func sampleCPU(ctx context.Context, db *database) cpuTimes {
	var t cpuTimes
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		t.client = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		t.sleeps = ru.Nvcsw
	} else {
		t.client, t.sleeps = -1, -1
	}
	t.db = -1
	if db.pool != nil {
		rows, err := db.pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend'`)
		if err == nil {
			var sum time.Duration
			t.backends = map[backend]time.Duration{}
			for rows.Next() {
				var pid int
				if rows.Scan(&pid) == nil {
					// A backend that exited since the query is skipped.
					if d, start, ok := threadCPU(strconv.Itoa(pid)); ok {
						t.backends[backend{pid, start}] = d
						sum += d
					}
				}
			}
			rows.Close()
			if rows.Err() == nil {
				t.db = sum
			}
		}
	}
	if db.db != nil && db.dialect == dialectMySQL {
		// MariaDB runs a thread per connection and names it in
		// PROCESSLIST.TID (MySQL has no such column: the query fails and
		// the database's time stays unknown). InnoDB's background threads
		// (purge, page cleaner, log writer) are left out.
		// Every connection thread is sampled, those serving other
		// databases too: the server reuses a thread of its cache for a
		// new connection, and only the time since the first sample counts.
		rows, err := db.db.QueryContext(ctx, `SELECT TID, COALESCE(DB = DATABASE(), 0) FROM information_schema.PROCESSLIST`)
		if err == nil {
			var sum time.Duration
			t.backends = map[backend]time.Duration{}
			t.ours = map[backend]bool{}
			for rows.Next() {
				var tid int
				var ours bool
				if rows.Scan(&tid, &ours) == nil {
					if d, start, ok := threadCPU(strconv.Itoa(tid)); ok {
						t.backends[backend{tid, start}] = d
						if ours {
							t.ours[backend{tid, start}] = true
							sum += d
						}
					}
				}
			}
			rows.Close()
			// Threads in the server's cache are in no PROCESSLIST row:
			// sample every thread of the server process as well.
			if tgid := serverProcess(t.backends); tgid != "" {
				if tasks, err := os.ReadDir("/proc/" + tgid + "/task"); err == nil {
					for _, task := range tasks {
						if d, start, ok := threadCPU(task.Name()); ok {
							if tid, err := strconv.Atoi(task.Name()); err == nil {
								t.backends[backend{tid, start}] = d
							}
						}
					}
				}
			}
			if rows.Err() == nil {
				t.db = sum
			} else {
				t.backends = nil
			}
		}
	}
	t.nats = -1
	if entries, err := os.ReadDir("/proc"); err == nil {
		for _, e := range entries {
			comm, err := os.ReadFile("/proc/" + e.Name() + "/comm")
			if err == nil && strings.TrimSpace(string(comm)) == "nats-server" {
				// Every thread's time, in nanoseconds (schedstat).
				tasks, err := os.ReadDir("/proc/" + e.Name() + "/task")
				if err != nil {
					continue
				}
				for _, task := range tasks {
					d, start, ok := threadCPU(task.Name())
					tid, err := strconv.Atoi(task.Name())
					if !ok || err != nil {
						continue
					}
					if t.natsThreads == nil {
						t.natsThreads = map[backend]time.Duration{}
					}
					t.natsThreads[backend{tid, start}] = d
					t.nats = max(t.nats, 0) + d
				}
			}
		}
	}
	return t
}

// procStat is the user and system CPU time of a process and its start
// time (clock ticks since boot), from /proc/<pid>/stat.
func procStat(pid string) (cpu time.Duration, start int64, ok bool) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, false
	}
	// Fields after the command: state is field 3 of proc(5), so field n
	// is f[n-3]: utime 14, stime 15, starttime 22.
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, 0, false
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	start, err3 := strconv.ParseInt(f[19], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return 0, 0, false
	}
	const ticks = 100 // USER_HZ on Linux
	return time.Duration(u+st) * time.Second / ticks, start, true
}

// serverProcess is the process id (Tgid) of the first of the threads that
// can be read, or "".
func serverProcess(threads map[backend]time.Duration) string {
	for b := range threads {
		status, err := os.ReadFile("/proc/" + strconv.Itoa(b.pid) + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "Tgid:"); ok {
				return strings.TrimSpace(v)
			}
		}
	}
	return ""
}

// threadCPU is the CPU time of a thread (any thread's id is a /proc
// entry) in nanoseconds, from /proc/<tid>/schedstat (a connection thread
// runs for well under a clock tick per statement), and its start time.
func threadCPU(tid string) (cpu time.Duration, start int64, ok bool) {
	if _, start, ok = procStat(tid); !ok {
		return 0, 0, false
	}
	b, err := os.ReadFile("/proc/" + tid + "/schedstat")
	if err != nil {
		return 0, 0, false
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, 0, false
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return 0, 0, false
	}
	return time.Duration(ns), start, true
}

// sub is the CPU time spent between two samples (negative when unknown).
func (t cpuTimes) sub(from cpuTimes) cpuTimes {
	d := func(a, b time.Duration) time.Duration {
		if a < 0 || b < 0 {
			return -1
		}
		return a - b
	}
	db := threadsSub(t.backends, from.backends, t.ours)
	nats := threadsSub(t.natsThreads, from.natsThreads, nil)
	if t.nats < 0 || from.nats < 0 {
		nats = -1
	}
	sleeps := int64(-1)
	if t.sleeps >= 0 && from.sleeps >= 0 {
		sleeps = t.sleeps - from.sleeps
	}
	return cpuTimes{client: d(t.client, from.client), db: db, nats: nats, sleeps: sleeps}
}

// threadsSub is the CPU time threads spent between two samples (-1 when
// either is unknown): for a thread in both, the difference; for one that
// started after the first sample, all of its time; one that exited before
// the second is left out. With ours not nil, only the threads it names.
func threadsSub(now, from map[backend]time.Duration, ours map[backend]bool) time.Duration {
	if now == nil || from == nil {
		return -1
	}
	var sum time.Duration
	for b, v := range now {
		if ours != nil && !ours[b] {
			continue
		}
		v0, ok := from[b]
		switch {
		case !ok:
			sum += v // started after the first sample
		case v >= v0:
			sum += v - v0
		}
	}
	return sum
}
