// Package relaye2e tests the JetStream relay as operators run it: the
// millpond command's relay subcommand, built by the test, killed with
// SIGKILL while it publishes, against a private embedded NATS server that
// the test restarts, and a real PostgreSQL outbox.
package relaye2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/millpond/millpond/internal/testdb"
	"github.com/millpond/millpond/internal/testnats"
	"github.com/millpond/millpond/outbox"
	"github.com/millpond/millpond/relay"
)

const (
	outboxStream = "orders.eu"
	producers    = 4
	perProducer  = 5000 // 20,000 events
	keysPerProd  = 100
	perTx        = 50
)

// buildCLI builds the millpond command once per test binary.
var buildCLI = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "millpond-relay-e2e")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "millpond")
	goTool := filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	if _, err := os.Stat(goTool); err != nil {
		goTool = "go"
	}
	out, err := exec.Command(goTool, "build", "-o", bin, "github.com/millpond/millpond/cmd/millpond").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
})

// relayProc is one relay process.
type relayProc struct {
	cmd    *exec.Cmd
	stdout bytes.Buffer
	stderr bytes.Buffer
	done   chan error
}

func startRelay(t *testing.T, bin string, args ...string) *relayProc {
	t.Helper()
	p := &relayProc{done: make(chan error, 1)}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

func (p *relayProc) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("kill: %v", err)
	}
	<-p.done
}

// pause sets the stream's subjects.
func pause(t *testing.T, js jetstream.JetStream, name string, subjects []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.Subjects = subjects
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatalf("update stream: %v", err)
	}
}

type sent struct {
	key, orderingKey string
	payload          []byte
}

// TestRelayExactlyOnceUnderKills relays 20,000 events (ordered on 400 keys,
// every tenth one unordered) while the relay process is killed with SIGKILL
// five times and its NATS server is restarted once. The JetStream stream
// must end with every event exactly once (count, distinct Nats-Msg-Id, the
// same ids and payloads as the outbox) and each ordering key's events in
// sequence order on its subject. Once, the stream also stops taking the
// relay's subjects for a while, so publishes fail without a PubAck.
func TestRelayExactlyOnceUnderKills(t *testing.T) {
	if testing.Short() {
		t.Skip("long fault test")
	}
	bin, err := buildCLI()
	if err != nil {
		t.Fatal(err)
	}
	db := testdb.New(t, "postgres")
	store := db.Store(t)
	srv := testnats.Embedded(t)
	_, js := srv.Connect(t)
	stream := testnats.Stream(t, js, "RELAYKILL", 2*time.Minute, "rk.>")
	ctx := context.Background()
	if err := store.RegisterGroup(ctx, outboxStream, relay.DefaultGroup); err != nil {
		t.Fatal(err)
	}

	// Producers run while the relay runs, each on keys of its own.
	var mu sync.Mutex
	all := map[string]sent{}
	var prodWG sync.WaitGroup
	prodErr := make(chan error, producers)
	for p := range producers {
		prodWG.Add(1)
		go func() {
			defer prodWG.Done()
			for n := 0; n < perProducer; n += perTx {
				tx, commit, rollback, err := db.TryBegin()
				if err != nil {
					prodErr <- err
					return
				}
				var batch []sent
				for i := n; i < n+perTx; i++ {
					ev := sent{key: fmt.Sprintf("ev.%d.%d", p, i), payload: fmt.Appendf(nil, `{"p":%d,"i":%d}`, p, i)}
					if i%10 != 9 {
						ev.orderingKey = fmt.Sprintf("order.%d-%03d", p, i%keysPerProd)
					}
					if _, err := store.Enqueue(ctx, tx, outbox.Event{Stream: outboxStream, Key: ev.key, Kind: "Order.Placed",
						Payload: ev.payload, OrderingKey: ev.orderingKey, Metadata: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}); err != nil {
						rollback()
						prodErr <- err
						return
					}
					batch = append(batch, ev)
				}
				if err := commit(); err != nil {
					prodErr <- err
					return
				}
				mu.Lock()
				for _, ev := range batch {
					all[ev.key] = ev
				}
				mu.Unlock()
			}
		}()
	}

	args := []string{"relay", "-db", db.URL, "-nats", srv.URL(), "-stream", outboxStream, "-subject-prefix", "rk",
		"-ordering-key-subject", "-js-stream", "RELAYKILL", "-lease", "2s", "-max-backoff", "500ms",
		"-publish-timeout", "2s", "-close-timeout", "5s", "-poll", "20ms"}
	count := func() uint64 {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		info, err := stream.Info(ctx)
		if err != nil {
			return 0 // the server is restarting
		}
		return info.State.Msgs
	}
	// progress waits until the stream grew by n messages or d passed.
	progress := func(n uint64, d time.Duration) {
		start, deadline := count(), time.Now().Add(d)
		for count() < start+n && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
	}
	begin := time.Now()
	for k := 1; k <= 5; k++ {
		p := startRelay(t, bin, args...)
		progress(1200, 8*time.Second)
		switch k {
		case 3:
			srv.Restart()
			t.Logf("NATS server restarted while relay %d ran", k)
			progress(600, 8*time.Second)
		case 4:
			// The stream stops taking the subjects for a while (an
			// operator's edit, a full stream): publishes get no PubAck
			// and must be retried, not acknowledged.
			pause(t, js, "RELAYKILL", []string{"rk-paused.>"})
			time.Sleep(700 * time.Millisecond)
			pause(t, js, "RELAYKILL", []string{"rk.>"})
			t.Logf("stream refused the relay's subjects for 700 ms while relay %d ran", k)
			progress(600, 8*time.Second)
		}
		p.kill(t)
		t.Logf("relay %d killed with SIGKILL at %d messages in the stream", k, count())
	}
	prodWG.Wait()
	close(prodErr)
	for err := range prodErr {
		t.Fatalf("producer: %v", err)
	}
	total := producers * perProducer

	// The last relay runs until every event is acknowledged, then stops on
	// SIGTERM.
	last := startRelay(t, bin, args...)
	delivered := func() int64 {
		return db.Count(t, "SELECT count(*) FROM millpond_outbox WHERE consumer_group = $1 AND status = 'delivered'", relay.DefaultGroup)
	}
	deadline := time.Now().Add(60 * time.Second)
	for delivered() < int64(total) {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d events acknowledged after a minute; stream holds %d\nrelay stderr:\n%s", delivered(), total, count(), last.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := last.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := <-last.done; err != nil {
		t.Fatalf("relay did not stop cleanly on SIGTERM: %v\n%s", err, last.stderr.String())
	}
	t.Logf("%d events relayed in %s; last relay: %s", total, time.Since(begin).Round(time.Millisecond), strings.TrimSpace(last.stdout.String()))
	// Proof that the kills hit events in flight: under leases an event
	// claimed again counts a second attempt; a held claim counts none (a
	// killed relay's events are due again unchanged), so there the proof
	// is the last relay publishing again what a killed one had published
	// and JetStream dropping the copies.
	retried := db.Count(t, "SELECT count(*) FROM millpond_outbox WHERE consumer_group = $1 AND attempts > 1", relay.DefaultGroup)
	var republished int
	if m := regexp.MustCompile(`(\d+) duplicates dropped by JetStream`).FindStringSubmatch(last.stdout.String()); m != nil {
		republished, _ = strconv.Atoi(m[1])
	}
	t.Logf("%d events were claimed more than once (after a kill or a broker restart); the last relay published %d events again that JetStream dropped as duplicates", retried, republished)
	if retried == 0 && republished == 0 {
		t.Errorf("no event was claimed twice nor published twice: the kills did not hit events in flight, so the test proved nothing")
	}

	msgs := testnats.Messages(t, stream)
	if len(msgs) != total {
		t.Errorf("stream holds %d messages, want %d", len(msgs), total)
	}
	ids := map[string]int{}
	lastSeq := map[string]int64{} // per subject
	for _, m := range msgs {
		id := m.Header.Get(jetstream.MsgIDHeader)
		ids[id]++
		key := m.Header.Get(relay.HeaderKey)
		ev, ok := all[key]
		if !ok || id != relay.MsgID(outboxStream, key) {
			t.Fatalf("message %d: id %q, key %q not enqueued", m.Seq, id, key)
		}
		if !bytes.Equal(m.Data, ev.payload) || m.Header.Get("traceparent") == "" || m.Header.Get(relay.HeaderKind) != "Order.Placed" {
			t.Fatalf("message %d: payload or headers changed: %q %v", m.Seq, m.Data, m.Header)
		}
		wantSubject := "rk." + relay.EncodeToken(outboxStream) + ".Order~Placed."
		if ev.orderingKey == "" {
			wantSubject += relay.UnorderedMark + relay.EncodeToken(key)
		} else {
			wantSubject += relay.EncodeToken(ev.orderingKey)
		}
		if m.Subject != wantSubject {
			t.Fatalf("message %d: subject %q, want %q", m.Seq, m.Subject, wantSubject)
		}
		if ev.orderingKey == "" {
			continue
		}
		seq, err := strconv.ParseInt(m.Header.Get(relay.HeaderOrderingSeq), 10, 64)
		if err != nil || seq != lastSeq[m.Subject]+1 {
			t.Errorf("subject %s: ordering seq %q after %d (message %d): per-key order broken", m.Subject, m.Header.Get(relay.HeaderOrderingSeq), lastSeq[m.Subject], m.Seq)
		}
		lastSeq[m.Subject] = seq
	}
	dups := 0
	for _, n := range ids {
		if n > 1 {
			dups += n - 1
		}
	}
	if len(ids) != total || dups != 0 {
		t.Errorf("%d distinct Nats-Msg-Id, %d duplicate copies; want %d and 0", len(ids), dups, total)
	}
	for key := range all {
		if ids[relay.MsgID(outboxStream, key)] != 1 {
			t.Fatalf("event %s is in the stream %d times", key, ids[relay.MsgID(outboxStream, key)])
		}
	}
	if dead := db.Count(t, "SELECT count(*) FROM millpond_outbox WHERE status = 'dead_letter'"); dead != 0 {
		t.Errorf("%d events dead-lettered", dead)
	}
	// Keys i%100 with i%10 == 9 never get an ordered event; the others
	// get perProducer/keysPerProd each.
	if len(lastSeq) != producers*keysPerProd*9/10 {
		t.Errorf("%d ordered subjects, want %d", len(lastSeq), producers*keysPerProd*9/10)
	}
	for subject, n := range lastSeq {
		if n != int64(perProducer/keysPerProd) {
			t.Errorf("subject %s ends at ordering seq %d, want %d", subject, n, perProducer/keysPerProd)
		}
	}
}
