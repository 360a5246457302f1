package tests

import (
	"net"
	"net/url"
	"sync"
	"testing"
)

// freezeProxy forwards TCP connections to a database server and can freeze
// them: a frozen proxy keeps every connection open but passes no byte in
// either direction (and accepts new connections without forwarding them),
// as a server whose host hangs or a network that drops packets does.
// Nothing is refused and nothing is closed, so only deadlines notice.
type freezeProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	frozen bool
	thaw   chan struct{} // closed by unfreeze
	conns  []net.Conn
}

func newFreezeProxy(t *testing.T, target string) *freezeProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezeProxy{ln: ln, target: target, thaw: make(chan struct{})}
	close(p.thaw)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// addr is the proxy's address.
func (p *freezeProxy) addr() string { return p.ln.Addr().String() }

// via returns rawURL with its host replaced by the proxy's.
func (p *freezeProxy) via(t *testing.T, rawURL string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.addr()
	return u.String()
}

func (p *freezeProxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.frozen {
		p.frozen = true
		p.thaw = make(chan struct{})
	}
}

func (p *freezeProxy) unfreeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen {
		p.frozen = false
		close(p.thaw)
	}
}

// gate returns once the proxy is not frozen.
func (p *freezeProxy) gate() {
	p.mu.Lock()
	thaw := p.thaw
	p.mu.Unlock()
	<-thaw
}

func (p *freezeProxy) close() {
	p.unfreeze()
	_ = p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
}

func (p *freezeProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go func() {
			p.track(c)
			p.gate()
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				_ = c.Close()
				return
			}
			p.track(up)
			go p.pipe(up, c)
			p.pipe(c, up)
		}()
	}
}

func (p *freezeProxy) track(c net.Conn) {
	p.mu.Lock()
	p.conns = append(p.conns, c)
	p.mu.Unlock()
}

// pipe copies from src to dst, holding each chunk while the proxy is
// frozen.
func (p *freezeProxy) pipe(dst, src net.Conn) {
	defer func() { _ = dst.Close(); _ = src.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.gate()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
