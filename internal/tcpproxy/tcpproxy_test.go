package tcpproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// ioTimeout bounds every read and write of the tests; nothing here should
// come near it.
const ioTimeout = 10 * time.Second

// testBundle is an echo server behind a proxy.
type testBundle struct {
	proxy *Proxy
}

// setup starts an echo server, which writes back every line it reads, and
// a proxy to it; both end with the test.
func setup(t *testing.T) *testBundle {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(c, c) })
		}
	})
	p, err := New(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return &testBundle{proxy: p}
}

// dial connects to the proxy.
func (b *testBundle) dial(t *testing.T) *client {
	t.Helper()
	c, err := net.DialTimeout("tcp", b.proxy.Addr(), ioTimeout)
	if err != nil {
		t.Fatalf("dial the proxy: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &client{Conn: c, r: bufio.NewReader(c)}
}

type client struct {
	net.Conn
	r *bufio.Reader
}

// roundTrip writes a line and reads the echo back within d.
func (c *client) roundTrip(line string, d time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(d))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	got, err := c.r.ReadString('\n')
	return strings.TrimSuffix(got, "\n"), err
}

func mustEcho(t *testing.T, c *client, line string) {
	t.Helper()
	got, err := c.roundTrip(line, ioTimeout)
	if err != nil || got != line {
		t.Fatalf("round trip of %q: got %q, %v", line, got, err)
	}
}

func TestForwardsBothWays(t *testing.T) {
	b := setup(t)
	c := b.dial(t)
	mustEcho(t, c, "hello")
	mustEcho(t, c, strings.Repeat("x", 3*bufferSize)) // more than one chunk
	if b.proxy.Mode() != Forward || b.proxy.Accepted() != 1 {
		t.Errorf("mode %v, accepted %d; want forward, 1", b.proxy.Mode(), b.proxy.Accepted())
	}
}

func TestCutClosesOpenConnectionsAndRefusesNewOnes(t *testing.T) {
	b := setup(t)
	c := b.dial(t)
	mustEcho(t, c, "before")

	b.proxy.Cut()
	if _, err := c.roundTrip("during", ioTimeout); err == nil {
		t.Fatal("a round trip over a cut connection succeeded")
	} else if isTimeout(err) {
		t.Fatalf("a cut connection hung instead of closing: %v", err)
	}
	// A new connection is reset: at once, or at its first round trip.
	if conn, err := net.DialTimeout("tcp", b.proxy.Addr(), ioTimeout); err == nil {
		fresh := &client{Conn: conn, r: bufio.NewReader(conn)}
		_, err := fresh.roundTrip("refused", ioTimeout)
		_ = conn.Close()
		if err == nil {
			t.Fatal("a connection made while cut carried traffic")
		}
	}

	b.proxy.Heal()
	mustEcho(t, b.dial(t), "after")
	if got := b.proxy.Accepted(); got != 2 {
		t.Errorf("accepted %d connections, want 2: the refused one does not count", got)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestBlackholeHoldsTrafficUntilHealed(t *testing.T) {
	b := setup(t)
	c := b.dial(t)
	mustEcho(t, c, "before")

	b.proxy.Blackhole()
	// An observation window: nothing may come back while black-holed.
	if _, err := c.roundTrip("held", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("a round trip while black-holed ended with %v, want a timeout", err)
	}
	// New connections are accepted, and hang too.
	fresh := b.dial(t)
	_ = fresh.SetDeadline(time.Now().Add(ioTimeout))
	if _, err := io.WriteString(fresh, "queued\n"); err != nil {
		t.Fatal(err)
	}

	b.proxy.Heal()
	// The held line arrives after the heal, as a retransmission would.
	_ = c.SetDeadline(time.Now().Add(ioTimeout))
	if got, err := c.r.ReadString('\n'); err != nil || got != "held\n" {
		t.Fatalf("after the heal read %q, %v; want the held line", got, err)
	}
	if got, err := fresh.r.ReadString('\n'); err != nil || got != "queued\n" {
		t.Fatalf("the connection made while black-holed read %q, %v; want its line", got, err)
	}
	mustEcho(t, c, "after")
}

func TestDelayHoldsEachChunk(t *testing.T) {
	b := setup(t)
	c := b.dial(t)
	mustEcho(t, c, "warm")

	const d = 100 * time.Millisecond
	b.proxy.Delay(d)
	start := time.Now()
	mustEcho(t, c, "slow")
	// Each direction holds the chunk for d.
	if took := time.Since(start); took < 2*d {
		t.Errorf("a delayed round trip took %v, want at least %v", took, 2*d)
	}

	b.proxy.Delay(0)
	mustEcho(t, c, "fast")
}

func TestCloseEndsEverything(t *testing.T) {
	b := setup(t)
	c := b.dial(t)
	mustEcho(t, c, "open")
	b.proxy.Blackhole() // a goroutine waits at the gate
	_ = c.SetDeadline(time.Now().Add(ioTimeout))
	if _, err := io.WriteString(c, "held\n"); err != nil {
		t.Fatal(err)
	}
	if err := b.proxy.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.proxy.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
	if _, err := c.r.ReadString('\n'); err == nil {
		t.Error("a connection survived Close")
	}
	if _, err := net.DialTimeout("tcp", b.proxy.Addr(), ioTimeout); err == nil {
		t.Error("a closed proxy accepted a connection")
	}
}

func TestSetTargetMovesNewConnections(t *testing.T) {
	b := setup(t)
	old := b.dial(t)
	mustEcho(t, old, "first server")

	// A second server that answers every line with "moved".
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		r := bufio.NewReader(c)
		for {
			if _, err := r.ReadString('\n'); err != nil {
				return
			}
			if _, err := io.WriteString(c, "moved\n"); err != nil {
				return
			}
		}
	})
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })

	b.proxy.SetTarget(ln.Addr().String())
	if got := b.proxy.Target(); got != ln.Addr().String() {
		t.Errorf("Target() = %q, want %q", got, ln.Addr())
	}
	moved := b.dial(t)
	if got, err := moved.roundTrip("hello", ioTimeout); err != nil || got != "moved" {
		t.Errorf("a new connection got %q, %v; want the second server's answer", got, err)
	}
	mustEcho(t, old, "still the first") // open connections keep their server
	_ = moved.Close()
}

func TestModeNames(t *testing.T) {
	for m, want := range map[Mode]string{Forward: "forward", Cut: "cut", Blackhole: "blackhole", Mode(7): "Mode(7)"} {
		if got := m.String(); got != want {
			t.Errorf("Mode(%d).String() = %q, want %q", int(m), got, want)
		}
	}
}
