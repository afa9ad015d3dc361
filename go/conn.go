package xio

/*
#include "xio_go.h"
#cgo noescape xg_read
#cgo nocallback xg_read
#cgo noescape xg_write
#cgo nocallback xg_write
#cgo noescape xg_writev
#cgo nocallback xg_writev
#cgo noescape xg_alloc
#cgo nocallback xg_alloc
#cgo noescape xg_send_buf
#cgo nocallback xg_send_buf
#cgo noescape xg_recv_buf
#cgo nocallback xg_recv_buf
*/
import "C"

import (
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Conn is a connection over X-IO: a [net.Conn] with TCP's semantics
// (byte stream, half-close, end of stream and reset), deadlines, and
// concurrent use by several goroutines, as *net.TCPConn.
//
// Reads and writes go through the C library without a system call;
// a goroutine that must wait parks on a channel the net's dispatcher
// signals, holding no OS thread.
type Conn struct {
	n   *Net
	s   *C.xio_stream
	pd  *pollDesc
	tok uint64

	// live guards s against Close while a call is in C: calls hold it
	// shared, Close exclusively.
	live   sync.RWMutex
	closed atomic.Bool

	// rmu and wmu serialise reads and writes, so that concurrent writes
	// are not interleaved (as a net.TCPConn's are not).
	rmu, wmu sync.Mutex
	rdl, wdl deadline

	laddr, raddr *net.TCPAddr
}

// addrCap is room for "[ipv6%zone]:port" and its NUL.
const addrCap = 96

// newConn wraps a stream the library made (dialled or accepted).
func newConn(n *Net, s *C.xio_stream) (*Conn, error) {
	if err := n.use(); err != nil {
		var e errBuf
		C.xg_stream_close(s, &e[0])
		return nil, err
	}
	pd, tok := n.register()
	c := &Conn{n: n, s: s, pd: pd, tok: tok}
	c.rdl.init(pd.r)
	c.wdl.init(pd.w)
	var e errBuf
	var local, peer [addrCap]C.char
	if err := e.err(C.xg_stream_setup(s, C.uint64_t(tok), &local[0], &peer[0], addrCap, &e[0])); err != nil {
		c.Close()
		return nil, err
	}
	c.laddr = tcpAddr(C.GoString(&local[0]))
	c.raddr = tcpAddr(C.GoString(&peer[0]))
	if err := n.start(); err != nil {
		c.Close()
		return nil, err
	}
	runtime.SetFinalizer(c, (*Conn).Close)
	return c, nil
}

func tcpAddr(s string) *net.TCPAddr {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return &net.TCPAddr{}
	}
	return net.TCPAddrFromAddrPort(ap)
}

// opErr wraps err as the net package does for a *net.TCPConn's calls.
func (c *Conn) opErr(op string, err error) error {
	return &net.OpError{Op: op, Net: "xio", Source: c.laddr, Addr: c.raddr, Err: err}
}

// wait parks until ch is signalled: by the dispatcher (readiness), by
// Close, or by the deadline (one channel, so the wait is a plain
// receive). The caller looks at why again (see ready).
func (c *Conn) wait(ch chan struct{}, d *deadline) error {
	<-ch
	if err := c.ready(d); err != nil {
		// Pass the wake-up on: another call may wait on ch too.
		signal(ch)
		return err
	}
	return nil
}

// ready is the check every call makes first: closed, or past its
// deadline (a deadline in the past fails a call even when data waits, as
// with a socket).
func (c *Conn) ready(d *deadline) error {
	if c.closed.Load() {
		return net.ErrClosed
	}
	if d.expired() {
		return os.ErrDeadlineExceeded
	}
	return nil
}

// Read reads what is there, waiting for something when nothing is: the
// connection's bytes, io.EOF at end of stream (after the peer's
// CloseWrite or Close), or an error (a reset: syscall.ECONNRESET,
// reported once, then io.EOF).
func (c *Conn) Read(b []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for {
		if err := c.ready(&c.rdl); err != nil {
			return 0, c.opErr("read", err)
		}
		if len(b) == 0 {
			return 0, nil
		}
		var e errBuf
		var k C.size_t
		c.live.RLock()
		if c.closed.Load() {
			c.live.RUnlock()
			continue
		}
		r := C.xg_read(c.s, unsafe.Pointer(&b[0]), C.size_t(len(b)), &k, &e[0])
		c.live.RUnlock()
		switch r {
		case codeOK:
			if k == 0 {
				return 0, io.EOF
			}
			return int(k), nil
		case codeWouldBlock:
			if err := c.wait(c.pd.r, &c.rdl); err != nil {
				return 0, c.opErr("read", err)
			}
		default:
			return 0, c.opErr("read", e.err(r))
		}
	}
}

// Write writes all of b, waiting while the peer's window, the ring to it
// or the pool is full (back-pressure: nothing is dropped). On an error it
// returns how much was written before it.
func (c *Conn) Write(b []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	done := 0
	for {
		if err := c.ready(&c.wdl); err != nil {
			return done, c.opErr("write", err)
		}
		if done == len(b) {
			return done, nil
		}
		var e errBuf
		var k C.size_t
		c.live.RLock()
		if c.closed.Load() {
			c.live.RUnlock()
			continue
		}
		r := C.xg_write(c.s, unsafe.Pointer(&b[done]), C.size_t(len(b)-done), &k, &e[0])
		c.live.RUnlock()
		done += int(k)
		switch r {
		case codeOK:
		case codeWouldBlock:
			if err := c.wait(c.pd.w, &c.wdl); err != nil {
				return done, c.opErr("write", err)
			}
		default:
			return done, c.opErr("write", e.err(r))
		}
	}
}

// WriteBuffers writes the buffers in order as one byte sequence, packing
// them into one pool buffer where they fit (a header and its body leave
// in one descriptor), and empties v as net.Buffers.WriteTo does.
// (net.Buffers.WriteTo itself reaches writev only for the net package's
// own connections; call this instead.)
func (c *Conn) WriteBuffers(v *net.Buffers) (int64, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	var total int64
	iov := (*[maxIov]C.xio_iovec)(C.malloc(C.size_t(unsafe.Sizeof(C.xio_iovec{})) * maxIov))
	defer C.free(unsafe.Pointer(iov))
	var pins runtime.Pinner
	defer pins.Unpin()
	for len(*v) > 0 {
		if err := c.ready(&c.wdl); err != nil {
			return total, c.opErr("write", err)
		}
		cnt := 0
		for _, b := range *v {
			if cnt == maxIov {
				break
			}
			if len(b) == 0 {
				continue
			}
			pins.Pin(&b[0])
			iov[cnt] = C.xio_iovec{base: unsafe.Pointer(&b[0]), len: C.size_t(len(b))}
			cnt++
		}
		if cnt == 0 {
			*v = (*v)[:0]
			break
		}
		var e errBuf
		var k C.size_t
		c.live.RLock()
		if c.closed.Load() {
			c.live.RUnlock()
			continue
		}
		r := C.xg_writev(c.s, &iov[0], C.size_t(cnt), &k, &e[0])
		c.live.RUnlock()
		total += int64(k)
		consume(v, int64(k))
		pins.Unpin()
		switch r {
		case codeOK:
		case codeWouldBlock:
			if err := c.wait(c.pd.w, &c.wdl); err != nil {
				return total, c.opErr("write", err)
			}
		default:
			return total, c.opErr("write", e.err(r))
		}
	}
	return total, nil
}

// consume drops the first n bytes of v, as net.Buffers' own WriteTo does.
func consume(v *net.Buffers, n int64) {
	for len(*v) > 0 {
		first := int64(len((*v)[0]))
		if first > n {
			(*v)[0] = (*v)[0][n:]
			return
		}
		n -= first
		(*v)[0] = nil
		*v = (*v)[1:]
	}
}

// maxIov is how many slices one writev takes.
const maxIov = 64

// zcChunk is the pool buffer size ReadFrom asks for.
const zcChunk = 64 << 10

// ReadFrom copies from r into pool buffers and sends them without a
// further copy (io.Copy's path to a Conn when r has no WriteTo).
func (c *Conn) ReadFrom(r io.Reader) (int64, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	var total int64
	for {
		if err := c.ready(&c.wdl); err != nil {
			return total, c.opErr("readfrom", err)
		}
		var e errBuf
		var buf *C.xio_buf
		var data *C.uint8_t
		c.live.RLock()
		if c.closed.Load() {
			c.live.RUnlock()
			continue
		}
		res := C.xg_alloc(c.s, zcChunk, &buf, &data, &e[0])
		c.live.RUnlock()
		switch res {
		case codeOK:
		case codeWouldBlock:
			if err := c.wait(c.pd.w, &c.wdl); err != nil {
				return total, c.opErr("readfrom", err)
			}
			continue
		default:
			return total, c.opErr("readfrom", e.err(res))
		}
		// The reader fills the pool buffer itself (io.Reader must not
		// keep p after Read returns).
		n, rerr := r.Read(unsafe.Slice((*byte)(unsafe.Pointer(data)), zcChunk))
		if n == 0 {
			C.xg_buf_free(buf)
		} else if err := c.sendBuf(buf, n); err != nil {
			return total, err
		}
		total += int64(n)
		if rerr == io.EOF {
			return total, nil
		}
		if rerr != nil {
			return total, rerr
		}
	}
}

// sendBuf sends n bytes of the pool buffer buf, waiting for room.
func (c *Conn) sendBuf(buf *C.xio_buf, n int) error {
	for {
		if err := c.ready(&c.wdl); err != nil {
			C.xg_buf_free(buf)
			return c.opErr("readfrom", err)
		}
		var e errBuf
		c.live.RLock()
		if c.closed.Load() {
			c.live.RUnlock()
			continue
		}
		r := C.xg_send_buf(c.s, buf, C.size_t(n), &e[0])
		c.live.RUnlock()
		switch r {
		case codeOK:
			return nil
		case codeWouldBlock:
			if err := c.wait(c.pd.w, &c.wdl); err != nil {
				C.xg_buf_free(buf)
				return c.opErr("readfrom", err)
			}
		default:
			C.xg_buf_free(buf)
			return c.opErr("readfrom", e.err(r))
		}
	}
}

// WriteTo hands each received pool buffer to w without copying it first
// (io.Copy's path from a Conn), until end of stream.
func (c *Conn) WriteTo(w io.Writer) (int64, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	var total int64
	for {
		if err := c.ready(&c.rdl); err != nil {
			return total, c.opErr("writeto", err)
		}
		var e errBuf
		var buf *C.xio_buf
		var data *C.uint8_t
		var k C.size_t
		c.live.RLock()
		if c.closed.Load() {
			c.live.RUnlock()
			continue
		}
		r := C.xg_recv_buf(c.s, &buf, &data, &k, &e[0])
		c.live.RUnlock()
		switch r {
		case codeOK:
		case codeWouldBlock:
			if err := c.wait(c.pd.r, &c.rdl); err != nil {
				return total, c.opErr("writeto", err)
			}
			continue
		default:
			return total, c.opErr("writeto", e.err(r))
		}
		if buf == nil {
			return total, nil // end of stream
		}
		// io.Writer must not keep p after Write returns.
		n, werr := w.Write(unsafe.Slice((*byte)(unsafe.Pointer(data)), int(k)))
		C.xg_buf_free(buf)
		total += int64(n)
		if werr != nil {
			return total, werr
		}
	}
}

// Close closes the connection: the peer reads end of stream after what
// was written (or a reset, if what it sent was left unread). Calls
// waiting in Read or Write return net.ErrClosed.
func (c *Conn) Close() error {
	if c.closed.Swap(true) {
		return c.opErr("close", net.ErrClosed)
	}
	runtime.SetFinalizer(c, nil)
	signal(c.pd.r)
	signal(c.pd.w)
	c.live.Lock()
	var e errBuf
	r := C.xg_stream_close(c.s, &e[0])
	c.s = nil
	c.live.Unlock()
	c.n.unregister(c.tok)
	c.n.release()
	if err := e.err(r); err != nil {
		return c.opErr("close", err)
	}
	return nil
}

// shutdown is CloseRead and CloseWrite.
func (c *Conn) shutdown(how C.int32_t, op string) error {
	c.live.RLock()
	defer c.live.RUnlock()
	if c.closed.Load() {
		return c.opErr(op, net.ErrClosed)
	}
	var e errBuf
	if err := e.err(C.xg_shutdown(c.s, how, &e[0])); err != nil {
		return c.opErr(op, err)
	}
	return nil
}

// CloseWrite shuts down writing (the peer reads end of stream), as
// *net.TCPConn's.
func (c *Conn) CloseWrite() error { return c.shutdown(C.XIO_SHUT_WR, "close") }

// CloseRead shuts down reading: what arrives is discarded.
func (c *Conn) CloseRead() error { return c.shutdown(C.XIO_SHUT_RD, "close") }

// LocalAddr is this end's address (a client's is made up by X-IO from
// its stack id: 127.88.x.y).
func (c *Conn) LocalAddr() net.Addr { return c.laddr }

// RemoteAddr is the peer's address.
func (c *Conn) RemoteAddr() net.Addr { return c.raddr }

// SetDeadline sets the read and write deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	if c.closed.Load() {
		return c.opErr("set", net.ErrClosed)
	}
	c.rdl.set(t)
	c.wdl.set(t)
	return nil
}

// SetReadDeadline sets the deadline of waiting and future reads; one
// that passes fails them with an error that is os.ErrDeadlineExceeded
// (errors.Is) and whose Timeout() is true. The zero time clears it.
func (c *Conn) SetReadDeadline(t time.Time) error {
	if c.closed.Load() {
		return c.opErr("set", net.ErrClosed)
	}
	c.rdl.set(t)
	return nil
}

// SetWriteDeadline sets the deadline of waiting and future writes.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	if c.closed.Load() {
		return c.opErr("set", net.ErrClosed)
	}
	c.wdl.set(t)
	return nil
}

// SetNoDelay is accepted for code written for *net.TCPConn: X-IO never
// delays a write.
func (c *Conn) SetNoDelay(bool) error { return nil }

// SetKeepAlive is accepted for code written for *net.TCPConn: a peer
// that dies is seen at once, with no probes.
func (c *Conn) SetKeepAlive(bool) error { return nil }
