package testenv

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy is a TCP forwarder in front of a server, for outage tests: Stop
// cuts every connection and refuses new ones (connection refused), Start
// listens again on the same address; Stall holds back the server's
// answers until Resume, as a network that stops delivering would.
type Proxy struct {
	tb     testing.TB
	target string
	addr   string

	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]struct{}
	resume chan struct{} // non-nil while stalled; closed by Resume
	cut    bool          // Cut: accepted connections are closed at once
	wg     sync.WaitGroup
}

// NewProxy starts a Proxy to target (host:port) on a free loopback port;
// it is stopped at cleanup.
func NewProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	p := &Proxy{tb: tb, target: target, addr: "127.0.0.1:0", conns: map[net.Conn]struct{}{}}
	p.Start()
	tb.Cleanup(p.Stop)
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addr
}

// Start listens again after Stop; it does nothing if the proxy runs.
func (p *Proxy) Start() {
	p.tb.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		return
	}
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.tb.Fatalf("testenv: proxy listen on %s: %v", p.addr, err)
	}
	p.ln, p.addr = ln, ln.Addr().String()
	p.wg.Add(1)
	go p.accept(ln)
}

// Stop closes the listener and every open connection, and waits until
// the forwarding goroutines ended.
func (p *Proxy) Stop() {
	p.mu.Lock()
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.Resume()
	p.wg.Wait()
}

// Cut closes every open connection and, until Restore, every new one as
// soon as it is accepted, as a server or pooler that died would; unlike
// Stop it keeps the listening port, so another process cannot take it
// meanwhile and Restore always works.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		_ = c.Close()
	}
}

// Restore forwards new connections again after Cut.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}

// Stall holds back everything the server sends from now on, on every
// connection, new ones included, until Resume: requests still reach the
// server and run, but their answers wait in the proxy, as behind a network
// that stopped delivering. The server notices nothing.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resume == nil {
		p.resume = make(chan struct{})
	}
}

// Resume delivers what Stall held back, in order, and forwards again.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resume != nil {
		close(p.resume)
		p.resume = nil
	}
}

// wait blocks while the proxy is stalled.
func (p *Proxy) wait() {
	p.mu.Lock()
	resume := p.resume
	p.mu.Unlock()
	if resume != nil {
		<-resume
	}
}

func (p *Proxy) accept(ln net.Listener) {
	defer p.wg.Done()
	for {
		client, err := ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue
		}
		p.mu.Lock()
		cut := p.cut
		p.mu.Unlock()
		if cut {
			_ = client.Close()
			continue
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		if !p.track(client, server) {
			return
		}
		p.wg.Add(2)
		go p.pipe(client, server, true)
		go p.pipe(server, client, false)
	}
}

// track registers a connection pair unless the proxy stopped meanwhile.
func (p *Proxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		for _, c := range conns {
			_ = c.Close()
		}
		return false
	}
	for _, c := range conns {
		if p.cut {
			_ = c.Close() // cut meanwhile: the pipes end at once
			continue
		}
		p.conns[c] = struct{}{}
	}
	return true
}

// pipe copies src to dst; stallable is the server-to-client direction.
func (p *Proxy) pipe(dst, src net.Conn, stallable bool) {
	defer p.wg.Done()
	if stallable {
		_, _ = io.Copy(dst, stallReader{src, p})
	} else {
		_, _ = io.Copy(dst, src)
	}
	_ = dst.Close()
	_ = src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// stallReader hands on what it read once the proxy is not stalled.
type stallReader struct {
	r io.Reader
	p *Proxy
}

func (s stallReader) Read(b []byte) (int, error) {
	n, err := s.r.Read(b)
	s.p.wait()
	return n, err
}
