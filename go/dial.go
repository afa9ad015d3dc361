package xio

// #include "xio_go.h"
import "C"

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"
	"unsafe"
)

// Dialer dials X-IO connections, with the options of a net.Dialer that
// make sense here. Its DialContext has net.Dialer's signature, so it
// plugs into http.Transport.DialContext and the like.
type Dialer struct {
	// Net is the net to dial from; nil is [Default].
	Net *Net
	// Timeout bounds the dial (resolving the name, the manager's answer
	// for an address not dialled before, the listener's answer), as
	// net.Dialer's; zero is none beyond the context's.
	Timeout time.Duration
	// FallbackTCP dials TCP (with TCP below) when no X-IO service binds
	// the address on this node: the manager refuses it, or no manager
	// runs. A listener here that refuses (its backlog full) or that does
	// not answer its control socket is on this node: that is the dial's
	// error, never a reason to dial TCP.
	FallbackTCP bool
	// TCP is the dialer of the fallback.
	TCP net.Dialer
}

// Dial connects to address ("ip:port" or "host:port") over X-IO on the
// process-wide net.
func Dial(address string) (*Conn, error) {
	c, err := (&Dialer{}).dialXio(context.Background(), address)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// DialContext is Dial with a context (net.Dialer's signature; network
// must be "tcp", "tcp4" or "tcp6"). With FallbackTCP the connection may
// be a *net.TCPConn.
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return nil, &net.OpError{Op: "dial", Net: network, Err: net.UnknownNetworkError(network)}
	}
	if d.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.Timeout)
		defer cancel()
	}
	c, err := d.dialXio(ctx, address)
	if err == nil {
		return c, nil
	}
	if d.FallbackTCP && noXioHere(err) {
		tc, terr := d.TCP.DialContext(ctx, network, address)
		if terr != nil {
			return nil, fmt.Errorf("xio: %v; then TCP: %w", err, terr)
		}
		return tc, nil
	}
	return nil, err
}

// Dial is DialContext with the background context.
func (d *Dialer) Dial(network, address string) (net.Conn, error) {
	return d.DialContext(context.Background(), network, address)
}

// noXioHere reports whether a dial's error means no X-IO service binds
// the address on this node (so TCP may reach it elsewhere).
func noXioHere(err error) bool {
	var xe *Error
	if !errors.As(err, &xe) {
		return false
	}
	return xe.Code == codeNoManager || (xe.Code == codeRefused && !listenerRefused(err))
}

// errListener marks a refusal by the listener itself (after the manager
// routed the request to it): the service is here.
var errListener = errors.New("refused by the listener")

func listenerRefused(err error) bool { return errors.Is(err, errListener) }

// listenerError is a refusal the listener made.
type listenerError struct{ err error }

func (e *listenerError) Error() string { return e.err.Error() + " (by the listener)" }
func (e *listenerError) Unwrap() []error {
	return []error{e.err, errListener}
}

func (d *Dialer) dialXio(ctx context.Context, address string) (*Conn, error) {
	n := d.Net
	if n == nil {
		var err error
		if n, err = Default(); err != nil {
			return nil, &net.OpError{Op: "dial", Net: "xio", Err: err}
		}
	}
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "xio", Err: err}
	}
	p, err := net.LookupPort("tcp", port)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "xio", Err: err}
	}
	if host == "" {
		host = "127.0.0.1"
	}
	ips, err := resolve(ctx, host)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "xio", Err: err}
	}
	var first error
	for _, ip := range ips {
		ap := netip.AddrPortFrom(ip, uint16(p))
		c, err := n.dialOne(ctx, ap)
		if err == nil {
			return c, nil
		}
		// A route learnt earlier may be stale (the address handed to
		// another process since): the refusal made the net forget it,
		// and a second dial asks the manager.
		if listenerRefused(err) {
			c, err = n.dialOne(ctx, ap)
			if err == nil {
				return c, nil
			}
		}
		opErr := &net.OpError{Op: "dial", Net: "xio", Addr: net.TCPAddrFromAddrPort(ap), Err: err}
		if first == nil {
			first = opErr
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, first
}

// resolve gives host's addresses: host itself when it is one.
func resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if ip, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{ip}, nil
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, err
	}
	if len(ips) == 0 {
		return nil, &net.DNSError{Err: "no addresses", Name: host}
	}
	return ips, nil
}

// dialOne dials ap and waits for the listener's answer. The dial itself
// may wait for the manager (the first dial of an address); it runs on a
// goroutine of its own so that ctx cancels the wait.
func (n *Net) dialOne(ctx context.Context, ap netip.AddrPort) (*Conn, error) {
	type dialled struct {
		s   *C.xio_stream
		err error
	}
	done := make(chan dialled, 1)
	go func() {
		cs := C.CString(ap.String())
		defer C.free(unsafe.Pointer(cs))
		var e errBuf
		var s *C.xio_stream
		err := e.err(C.xg_dial(n.c, cs, &s, &e[0]))
		done <- dialled{s, err}
	}()
	var r dialled
	select {
	case r = <-done:
	case <-ctx.Done():
		go func() {
			// The dial ends on its own: close what it made.
			if r := <-done; r.err == nil {
				var e errBuf
				C.xg_stream_close(r.s, &e[0])
			}
		}()
		return nil, ctx.Err()
	}
	if r.err != nil {
		return nil, r.err
	}
	c, err := newConn(n, r.s)
	if err != nil {
		return nil, err
	}
	if err := c.waitConnected(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// waitConnected waits for the listener's answer, asking the manager now
// and then (2 ms, doubling up to 100 ms, as a blocking connect does)
// whether the address still belongs to the process asked: one that
// stopped listening there and makes no X-IO call would never answer.
func (c *Conn) waitConnected(ctx context.Context) error {
	every := 2 * time.Millisecond
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		var e errBuf
		var done C.int32_t
		c.live.RLock()
		r := C.xg_stream_connected(c.s, &done, &e[0])
		c.live.RUnlock()
		if err := e.err(r); err != nil {
			if r == codeRefused {
				return &listenerError{err}
			}
			return err
		}
		if done != 0 {
			return nil
		}
		select {
		case <-c.pd.r:
		case <-c.pd.w:
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			c.live.RLock()
			r := C.xg_stream_check_connect(c.s, &e[0])
			c.live.RUnlock()
			if r != codeOK && r != codeRefused {
				return e.err(r)
			}
			every = min(2*every, 100*time.Millisecond)
			t.Reset(every)
		}
	}
}
