// Package tcpproxy is a TCP proxy for fault tests: it stands between a
// process and a server (a node and PostgreSQL) and, on the test's word,
// cuts the connections, black-holes them, or delays what they carry.
//
//   - Cut closes every open connection and refuses new ones (accepted and
//     closed at once with a reset), as a crashed link or a restarted peer
//     looks to the client.
//   - Blackhole keeps every connection, and accepts new ones, but forwards
//     nothing: bytes wait in the proxy as in a network that drops packets,
//     and flow again after Heal, as TCP retransmission would deliver them.
//   - Delay holds each chunk for a while before forwarding it.
//   - Heal forwards again, and accepts new connections.
//
// The proxy listens on 127.0.0.1 on a port of its own choosing; Addr names
// it. Close ends everything and waits for every goroutine.
package tcpproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Mode is what the proxy does with the traffic.
type Mode int

// The modes.
const (
	Forward   Mode = iota // pass traffic on
	Cut                   // close connections, refuse new ones
	Blackhole             // hold traffic, forward nothing
)

func (m Mode) String() string {
	switch m {
	case Forward:
		return "forward"
	case Cut:
		return "cut"
	case Blackhole:
		return "blackhole"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// bufferSize is the largest chunk read and forwarded at once.
const bufferSize = 32 << 10

// dialTimeout bounds the connection to the target for each accepted client.
const dialTimeout = 10 * time.Second

// Proxy forwards TCP connections from its address to a target.
type Proxy struct {
	ln net.Listener
	wg sync.WaitGroup

	mu      sync.Mutex
	target  string
	mode    Mode
	delay   time.Duration
	closed  bool
	changed chan struct{} // closed and replaced at every change of mode or delay
	conns   map[*link]struct{}
	// accepted counts connections accepted in Forward or Blackhole mode:
	// what a test reads to know that a client has connected again.
	accepted int
}

// link is one client connection and its connection to the target.
type link struct {
	client, server net.Conn
	once           sync.Once
}

func (l *link) close() {
	l.once.Do(func() {
		_ = l.client.Close()
		if l.server != nil {
			_ = l.server.Close()
		}
	})
}

// New starts a proxy to target (host:port) on a free port of 127.0.0.1.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("tcpproxy: listen: %w", err)
	}
	p := &Proxy{target: target, ln: ln, changed: make(chan struct{}), conns: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr is the proxy's address, host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target is the address the proxy forwards to.
func (p *Proxy) Target() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.target
}

// SetTarget makes new connections go to target; open ones keep theirs.
// It serves a server that comes back on another address, as a restarted
// container may.
func (p *Proxy) SetTarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
}

// Mode returns the current mode.
func (p *Proxy) Mode() Mode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

// Accepted returns how many connections the proxy has accepted for
// forwarding (in Forward or Blackhole mode) so far.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// Cut closes every open connection and refuses new ones until Heal.
func (p *Proxy) Cut() {
	p.mu.Lock()
	links := p.setModeLocked(Cut)
	p.mu.Unlock()
	for _, l := range links {
		l.close()
	}
}

// Blackhole stops forwarding on every connection, open or new, until Heal.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	p.setModeLocked(Blackhole)
	p.mu.Unlock()
}

// Heal forwards traffic again, and accepts new connections.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.setModeLocked(Forward)
	p.mu.Unlock()
}

// Delay holds every chunk for d before forwarding it; zero ends the delay.
func (p *Proxy) Delay(d time.Duration) {
	p.mu.Lock()
	p.delay = max(d, 0)
	p.signalLocked()
	p.mu.Unlock()
}

// setModeLocked sets the mode and, for Cut, returns the links to close.
func (p *Proxy) setModeLocked(m Mode) []*link {
	p.mode = m
	p.signalLocked()
	if m != Cut {
		return nil
	}
	links := make([]*link, 0, len(p.conns))
	for l := range p.conns {
		links = append(links, l)
	}
	return links
}

func (p *Proxy) signalLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// Close stops listening, closes every connection and waits until every
// goroutine of the proxy has ended.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.signalLocked()
	links := make([]*link, 0, len(p.conns))
	for l := range p.conns {
		links = append(links, l)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	for _, l := range links {
		l.close()
	}
	p.wg.Wait()
	return err
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue // a client that gave up before the accept
		}
		p.mu.Lock()
		mode, closed := p.mode, p.closed
		if !closed && mode != Cut {
			p.accepted++
		}
		p.mu.Unlock()
		if closed || mode == Cut {
			refuse(c)
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// refuse closes c with a reset, as a refused connection looks.
func refuse(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// serve connects a client to the target and forwards both ways until
// either side closes or the proxy cuts the link.
func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	l := &link{client: client}
	p.mu.Lock()
	if p.closed || p.mode == Cut {
		p.mu.Unlock()
		refuse(client)
		return
	}
	p.conns[l] = struct{}{}
	target := p.target
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.conns, l)
		p.mu.Unlock()
		l.close()
	}()

	server, err := net.DialTimeout("tcp", target, dialTimeout)
	if err != nil {
		return
	}
	p.mu.Lock()
	l.server = server
	_, kept := p.conns[l]
	p.mu.Unlock()
	if !kept {
		// Cut or closed while dialling; the link's close did not see the
		// server side yet.
		_ = server.Close()
		return
	}

	var wg sync.WaitGroup
	wg.Go(func() { p.pipe(l, server, client) })
	wg.Go(func() { p.pipe(l, client, server) })
	wg.Wait()
}

// pipe copies src to dst, chunk by chunk, through the proxy's mode and
// delay. Whichever direction ends first closes the link, which ends the
// other.
func (p *Proxy) pipe(l *link, dst io.Writer, src io.Reader) {
	defer l.close()
	buf := make([]byte, bufferSize)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.gate() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// gate waits until a chunk may be forwarded: not while black-holed, and
// after the delay. It returns false when the link must end instead (the
// proxy cut or closed).
func (p *Proxy) gate() bool {
	var waited bool
	for {
		p.mu.Lock()
		mode, delay, closed, changed := p.mode, p.delay, p.closed, p.changed
		p.mu.Unlock()
		switch {
		case closed || mode == Cut:
			return false
		case mode == Blackhole:
			<-changed
			continue
		case delay > 0 && !waited:
			t := time.NewTimer(delay)
			select {
			case <-t.C:
				waited = true
			case <-changed:
				t.Stop()
			}
			continue
		}
		return true
	}
}
