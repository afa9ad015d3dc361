package xio

// #include "xio_go.h"
import "C"

import (
	"context"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Listener is an X-IO listener: a [net.Listener] whose Accept returns
// [*Conn]s. Several goroutines may accept on it at once.
type Listener struct {
	n   *Net
	l   *C.xio_listener
	pd  *pollDesc
	tok uint64

	live   sync.RWMutex
	closed atomic.Bool
	dl     deadline
	addr   *net.TCPAddr
}

// Backlog is how many connections a listener holds before they are
// accepted (beyond it, connects are refused), as listen(2)'s backlog.
const Backlog = 4096

// Listen listens on address ("ip:port", "host:port", or ":port" for every
// address of this node) on the process-wide net ([Default]).
func Listen(address string) (*Listener, error) {
	n, err := Default()
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: "xio", Err: err}
	}
	return n.Listen(address)
}

// Listen listens on address on this net (see the package-level Listen).
// Port 0 picks a free port. X-IO addresses are service names: any
// address can be listened on, and only X-IO clients of this node reach
// it (serve TCP too for others).
func (n *Net) Listen(address string) (*Listener, error) {
	ap, err := listenAddr(address)
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: "xio", Err: err}
	}
	if err := n.use(); err != nil {
		return nil, &net.OpError{Op: "listen", Net: "xio", Err: err}
	}
	cs := C.CString(ap.String())
	defer C.free(unsafe.Pointer(cs))
	var e errBuf
	l := &Listener{n: n}
	if err := e.err(C.xg_listen(n.c, cs, Backlog, &l.l, &e[0])); err != nil {
		n.release()
		return nil, &net.OpError{Op: "listen", Net: "xio", Addr: net.TCPAddrFromAddrPort(ap), Err: err}
	}
	var tok C.uint64_t
	var local [addrCap]C.char
	if err := e.err(C.xg_listener_setup(l.l, &tok, &local[0], addrCap, &e[0])); err != nil {
		C.xg_listener_close(l.l, &e[0])
		n.release()
		return nil, &net.OpError{Op: "listen", Net: "xio", Err: err}
	}
	l.tok = uint64(tok)
	l.pd = n.registerListener(l.tok)
	l.dl.init(l.pd.r)
	l.addr = tcpAddr(C.GoString(&local[0]))
	if err := n.start(); err != nil {
		l.Close()
		return nil, &net.OpError{Op: "listen", Net: "xio", Err: err}
	}
	return l, nil
}

// listenAddr turns a Go listen address into X-IO's "ip:port": ":port"
// listens on every address of this node ("[::]:port", which takes IPv4
// clients too), a host name is resolved.
func listenAddr(address string) (netip.AddrPort, error) {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return netip.AddrPort{}, err
	}
	p, err := net.LookupPort("tcp", port)
	if err != nil {
		return netip.AddrPort{}, err
	}
	if host == "" {
		return netip.AddrPortFrom(netip.IPv6Unspecified(), uint16(p)), nil
	}
	ips, err := resolve(context.Background(), host)
	if err != nil {
		return netip.AddrPort{}, err
	}
	return netip.AddrPortFrom(ips[0], uint16(p)), nil
}

// Accept waits for the next connection (net.Listener).
func (l *Listener) Accept() (net.Conn, error) {
	c, err := l.AcceptXio()
	if err != nil {
		return nil, err
	}
	return c, nil
}

// AcceptXio is Accept returning the *Conn.
func (l *Listener) AcceptXio() (*Conn, error) {
	for {
		if l.closed.Load() {
			return nil, l.opErr(net.ErrClosed)
		}
		if l.dl.expired() {
			return nil, l.opErr(os.ErrDeadlineExceeded)
		}
		var e errBuf
		var s *C.xio_stream
		l.live.RLock()
		if l.closed.Load() {
			l.live.RUnlock()
			continue
		}
		r := C.xg_accept(l.l, &s, &e[0])
		l.live.RUnlock()
		switch r {
		case codeOK:
			// More may wait: let another accepting goroutine look (the
			// dispatcher signals an accept event once).
			signal(l.pd.r)
			c, err := newConn(l.n, s)
			if err != nil {
				return nil, l.opErr(err)
			}
			return c, nil
		case codeWouldBlock:
			// Signalled by the dispatcher, by Close or by the deadline;
			// the loop looks at which.
			<-l.pd.r
			if l.closed.Load() || l.dl.expired() {
				signal(l.pd.r) // wake the next goroutine accepting too
			}
		case codeRefused, codeReset:
			// A connection gone before it was taken: the next one.
		default:
			return nil, l.opErr(e.err(r))
		}
	}
}

func (l *Listener) opErr(err error) error {
	return &net.OpError{Op: "accept", Net: "xio", Addr: l.addr, Err: err}
}

// SetDeadline sets the deadline of waiting and future Accepts, as
// *net.TCPListener's.
func (l *Listener) SetDeadline(t time.Time) error {
	if l.closed.Load() {
		return l.opErr(net.ErrClosed)
	}
	l.dl.set(t)
	return nil
}

// Close stops listening: Accepts waiting return net.ErrClosed, and
// connections not yet accepted are reset. Accepted ones go on.
func (l *Listener) Close() error {
	if l.closed.Swap(true) {
		return &net.OpError{Op: "close", Net: "xio", Addr: l.addr, Err: net.ErrClosed}
	}
	signal(l.pd.r)
	l.live.Lock()
	var e errBuf
	r := C.xg_listener_close(l.l, &e[0])
	l.l = nil
	l.live.Unlock()
	l.n.unregisterListener(l.tok)
	l.n.release()
	return e.err(r)
}

// Addr is the listened address.
func (l *Listener) Addr() net.Addr { return l.addr }
