package xio

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"
)

// fill writes into c until a write would wait (the peer does not read):
// what a Write then blocks on.
func fill(t *testing.T, c *Conn) int {
	t.Helper()
	c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	n, err := c.Write(make([]byte, 64<<20))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("filling the window: %d, %v", n, err)
	}
	c.SetWriteDeadline(time.Time{})
	return n
}

// A Read and a Write in flight at once, from two goroutines; Close from a
// third unblocks both with net.ErrClosed.
func TestCloseUnblocksReadAndWrite(t *testing.T) {
	c, _ := pair(t)
	fill(t, c)
	errs := make(chan error, 2)
	go func() {
		_, err := c.Read(make([]byte, 8))
		errs <- err
	}()
	go func() {
		_, err := c.Write(make([]byte, 1<<20))
		errs <- err
	}()
	time.Sleep(20 * time.Millisecond) // both are waiting by now (or soon)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		select {
		case err := <-errs:
			if !errors.Is(err, net.ErrClosed) {
				t.Fatalf("got %v, want net.ErrClosed", err)
			}
		case <-time.After(watchdog):
			t.Fatal("watchdog: a call was not unblocked by Close")
		}
	}
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read after close: %v", err)
	}
	if err := c.Close(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("second close: %v", err)
	}
}

// Deadlines: a passed one fails with os.ErrDeadlineExceeded and a
// Timeout() error; one moved or cleared while a call waits takes effect.
func TestDeadlinesMovedWhileWaiting(t *testing.T) {
	c, s := pair(t)
	c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read past its deadline: %v", err)
	}
	// Extended while the read waits: it waits on past the first deadline,
	// then gets the data. (The first deadline is 2 s away, so that a
	// slow machine extends it in time; a read that had not started
	// waiting yet when it was extended passes too.)
	first := time.Now().Add(2 * time.Second)
	c.SetReadDeadline(first)
	got := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 1))
		got <- err
	}()
	time.Sleep(10 * time.Millisecond)
	c.SetReadDeadline(time.Now().Add(watchdog))
	time.Sleep(time.Until(first) + 100*time.Millisecond)
	s.Write([]byte("x"))
	if err := <-got; err != nil {
		t.Fatalf("read after the deadline was extended: %v", err)
	}
	// Cleared while waiting, then moved into the past: the read fails.
	first = time.Now().Add(2 * time.Second)
	c.SetReadDeadline(first)
	go func() {
		_, err := c.Read(make([]byte, 1))
		got <- err
	}()
	c.SetReadDeadline(time.Time{})
	time.Sleep(time.Until(first) + 100*time.Millisecond)
	select {
	case err := <-got:
		t.Fatalf("a cleared deadline still fired: %v", err)
	default:
	}
	c.SetReadDeadline(time.Unix(1, 0))
	if err := <-got; !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read with its deadline moved to the past: %v", err)
	}
	// Writes: a full window, then a deadline.
	fill(t, c)
	c.SetWriteDeadline(time.Now().Add(10 * time.Millisecond))
	if _, err := c.Write([]byte("x")); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write past its deadline: %v", err)
	}
}

// CloseWrite half-closes: the peer reads the data, then io.EOF, and can
// still write back.
func TestCloseWriteAndAddresses(t *testing.T) {
	c, s := pair(t)
	if _, ok := c.LocalAddr().(*net.TCPAddr); !ok {
		t.Fatalf("LocalAddr is %T", c.LocalAddr())
	}
	if s.LocalAddr().String() != c.RemoteAddr().String() || c.LocalAddr().String() != s.RemoteAddr().String() {
		t.Fatalf("addresses: %v %v / %v %v", c.LocalAddr(), c.RemoteAddr(), s.LocalAddr(), s.RemoteAddr())
	}
	c.Write([]byte("request"))
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	all, err := io.ReadAll(s)
	if err != nil || string(all) != "request" {
		t.Fatalf("peer read %q, %v", all, err)
	}
	if _, err := c.Write([]byte("x")); !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("write after CloseWrite: %v", err)
	}
	s.Write([]byte("reply"))
	s.Close()
	all, err = io.ReadAll(c)
	if err != nil || string(all) != "reply" {
		t.Fatalf("read back %q, %v", all, err)
	}
}

// A peer that closes with unread data resets the connection: the reset
// is reported once (syscall.ECONNRESET), then io.EOF.
func TestResetIsECONNRESET(t *testing.T) {
	c, s := pair(t)
	c.Write([]byte("never read"))
	// Unread by s when it closes: a reset, once the bytes are there.
	time.Sleep(20 * time.Millisecond)
	s.Close()
	var err error
	for err == nil {
		_, err = c.Read(make([]byte, 64))
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("got %v, want ECONNRESET", err)
	}
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("after the reset: %v, want io.EOF", err)
	}
}

// Dialling an address nobody binds is refused at once.
func TestDialRefused(t *testing.T) {
	_, err := Dial(addr())
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("got %v, want ECONNREFUSED", err)
	}
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "dial" {
		t.Fatalf("not a dial *net.OpError: %#v", err)
	}
}

// recorder remembers the size of each Write it gets.
type recorder struct {
	mu    sync.Mutex
	sizes []int
	buf   bytes.Buffer
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sizes = append(r.sizes, len(p))
	return r.buf.Write(p)
}

// io.Copy's paths: a Conn's WriteTo hands over each received pool buffer
// whole (so a header and body written with WriteBuffers arrive as one
// write of both), and ReadFrom fills pool buffers from a reader.
func TestCopyPathsAndBuffers(t *testing.T) {
	c, s := pair(t)
	header := []byte("HEADER\r\n")
	body := bytes.Repeat([]byte{7}, 1000)
	v := net.Buffers{header, body}
	n, err := c.WriteBuffers(&v)
	if err != nil || n != 1008 || len(v) != 0 {
		t.Fatalf("WriteBuffers: %d %v, %d left", n, err, len(v))
	}
	// 300 KiB through ReadFrom (a reader without WriteTo, so io.Copy
	// takes the Conn's ReadFrom).
	big := bytes.Repeat([]byte("0123456789abcdef"), 300<<10/16)
	go func() {
		io.Copy(c, struct{ io.Reader }{bytes.NewReader(big)})
		c.CloseWrite()
	}()
	var rec recorder
	got, err := io.Copy(&rec, s) // s.WriteTo
	if err != nil || got != int64(1008+len(big)) {
		t.Fatalf("copied %d, %v", got, err)
	}
	if rec.sizes[0] != 1008 {
		t.Fatalf("header and body came in writes of %v, not one of 1008", rec.sizes[:2])
	}
	if !bytes.Equal(rec.buf.Bytes()[1008:], big) {
		t.Fatal("the copied bytes differ")
	}
}

// Many goroutines accepting on one listener: each connection goes to one
// of them, and every connection is accepted.
func TestListener(t *testing.T) {
	l, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := l.Addr().(*net.TCPAddr)
	if a.Port == 0 || !a.IP.Equal(net.IPv4(127, 0, 0, 1)) {
		t.Fatalf("listening on %v", a)
	}
	const acceptors, conns = 8, 64
	accepted := make(chan *Conn, conns)
	var wg sync.WaitGroup
	for i := 0; i < acceptors; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := l.AcceptXio()
				if err != nil {
					if !errors.Is(err, net.ErrClosed) {
						t.Error(err)
					}
					return
				}
				accepted <- c
			}
		}()
	}
	var dialled []*Conn
	for i := 0; i < conns; i++ {
		c, err := Dial(a.String())
		if err != nil {
			t.Fatal(err)
		}
		dialled = append(dialled, c)
	}
	for i := 0; i < conns; i++ {
		select {
		case c := <-accepted:
			c.Close()
		case <-time.After(watchdog):
			t.Fatalf("watchdog: %d of %d accepted", i, conns)
		}
	}
	// Close ends every Accept waiting.
	l.Close()
	wg.Wait()
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("accept after close: %v", err)
	}
	for _, c := range dialled {
		c.Close()
	}
	// An Accept deadline.
	l2, err := Listen(addr())
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	l2.SetDeadline(time.Now().Add(10 * time.Millisecond))
	if _, err := l2.Accept(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("accept past its deadline: %v", err)
	}
	// The address is taken while listened on.
	if _, err := Listen(l2.Addr().String()); !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("second listen: %v", err)
	}
}

// A context cancels a dial: one cancelled before is not made, with the
// context's error; the Dialer's Timeout bounds it too.
func TestDialContext(t *testing.T) {
	l, err := Listen(addr())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = (&Dialer{}).DialContext(ctx, "tcp", l.Addr().String())
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("dial with a cancelled context: %v", err)
	}
	if _, err := (&Dialer{}).DialContext(context.Background(), "udp", l.Addr().String()); err == nil {
		t.Fatal("dialled udp")
	}
	c, err := (&Dialer{Timeout: watchdog}).DialContext(context.Background(), "tcp4", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}
