package xio

/*
#include "xio_go.h"
#cgo noescape xg_net_poll
#cgo nocallback xg_net_poll
#cgo noescape xg_net_watch_begin
#cgo nocallback xg_net_watch_begin
#cgo nocallback xg_net_watch_look
#cgo noescape xg_net_watch_end
#cgo nocallback xg_net_watch_end
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// Net is a process's attachment to an X-IO pool for the socket interface:
// listeners and connections made from it share one stack. A process
// usually needs one, [Default]; [Attach] makes another (a pool of another
// prefix, or a second event loop).
//
// Each Net runs one dispatcher goroutine while it has listeners or
// connections: it drains the shared-memory rings and wakes the goroutines
// whose connections became ready. Goroutines blocked in Read, Write or
// Accept wait on channels, not in C, so they hold no OS thread; the
// dispatcher itself parks in Go's network poller on the net's pollable
// descriptor when nothing arrives, after watching the rings for the
// library's adaptive budget while a peer is awake on another core (a
// wake-up through the kernel costs tens of microseconds on a VM).
type Net struct {
	c *C.xio_net

	mu sync.Mutex
	// pds holds the streams' poll descriptors by token-1 (a stream's
	// token is its index plus one, set with xio_stream_set_token).
	pds  []*pollDesc
	free []uint64
	// lpds holds the listeners' poll descriptors by their tokens (which
	// the library derives from their addresses).
	lpds map[uint64]*pollDesc
	// users counts listeners and connections, plus one for the handle
	// until Close (the dispatcher runs while it is above zero).
	users   int
	running bool
	closed  bool
	// stopped is closed when the dispatcher has returned.
	stopped chan struct{}
	wake    *os.File // the dispatcher's epoll (see park)
	global  bool
}

var (
	defaultMu  sync.Mutex
	defaultNet *Net
)

// Default is the process-wide net: the pool named by $XIO_PREFIX (default
// "xio"), attached on first use. It is never closed.
func Default() (*Net, error) {
	defaultMu.Lock()
	defer defaultMu.Unlock()
	if defaultNet != nil {
		return defaultNet, nil
	}
	n, err := attach(nil)
	if err != nil {
		return nil, err
	}
	n.global = true
	defaultNet = n
	return n, nil
}

// Attach attaches to the pool prefix (a manager must run for it). Close it
// when done: the attachment ends once its listeners and connections are
// closed too.
func Attach(prefix string) (*Net, error) {
	cp := C.CString(prefix)
	defer C.free(unsafe.Pointer(cp))
	return attach(cp)
}

func attach(prefix *C.char) (*Net, error) {
	var e errBuf
	n := &Net{lpds: map[uint64]*pollDesc{}, users: 1}
	if err := e.err(C.xg_net_attach(prefix, &n.c, &e[0])); err != nil {
		return nil, fmt.Errorf("xio: attach: %w", err)
	}
	return n, nil
}

// Close releases the handle. Listeners and connections made from it keep
// working until they are closed; the dispatcher stops after the last.
// The net of [Default] cannot be closed.
func (n *Net) Close() error {
	if n.global {
		return errors.New("xio: the process-wide net is not closed")
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	n.mu.Unlock()
	n.release()
	return nil
}

// use counts a new listener or connection; false once the net is closed
// and idle.
func (n *Net) use() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.users == 0 {
		return errors.New("xio: the net is closed")
	}
	n.users++
	return nil
}

// release ends one use; the last stops the dispatcher and frees the net.
func (n *Net) release() {
	n.mu.Lock()
	n.users--
	last := n.users == 0
	running := n.running
	n.mu.Unlock()
	if !last {
		return
	}
	if running {
		// Ends the dispatcher's park (it sees users == 0 and returns).
		n.wake.SetReadDeadline(time.Unix(1, 0))
		<-n.stopped
		n.wake.Close()
	}
	var e errBuf
	C.xg_net_close(n.c, &e[0])
}

// start runs the dispatcher if it does not run yet.
func (n *Net) start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.running {
		return nil
	}
	f, err := n.pollFile()
	if err != nil {
		return err
	}
	n.wake = f
	n.running = true
	n.stopped = make(chan struct{})
	go n.dispatch()
	return nil
}

// pollFile makes the epoll instance the dispatcher parks on: it holds the
// net's pollable fd (readable when a peer rang, or the library's retry
// timer fired) and its manager fd (readable when the manager has news or
// died), and Go's poller watches it.
func (n *Net) pollFile() (*os.File, error) {
	var e errBuf
	var fd, mfd C.int32_t
	if err := e.err(C.xg_net_fd(n.c, &fd, &e[0])); err != nil {
		return nil, fmt.Errorf("xio: net fd: %w", err)
	}
	if err := e.err(C.xg_net_manager_fd(n.c, &mfd, &e[0])); err != nil {
		return nil, fmt.Errorf("xio: manager fd: %w", err)
	}
	ep, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("xio: epoll_create1: %w", err)
	}
	for _, x := range []C.int32_t{fd, mfd} {
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(x)}
		if err := syscall.EpollCtl(ep, syscall.EPOLL_CTL_ADD, int(x), &ev); err != nil {
			syscall.Close(ep)
			return nil, fmt.Errorf("xio: epoll_ctl: %w", err)
		}
	}
	if err := syscall.SetNonblock(ep, true); err != nil {
		syscall.Close(ep)
		return nil, err
	}
	// Non-blocking: os.NewFile hands it to Go's poller.
	return os.NewFile(uintptr(ep), "xio-net"), nil
}

// register gives a stream a poll descriptor and its token.
func (n *Net) register() (*pollDesc, uint64) {
	pd := newPollDesc()
	n.mu.Lock()
	defer n.mu.Unlock()
	var tok uint64
	if k := len(n.free); k > 0 {
		tok = n.free[k-1]
		n.free = n.free[:k-1]
		n.pds[tok-1] = pd
	} else {
		n.pds = append(n.pds, pd)
		tok = uint64(len(n.pds))
	}
	return pd, tok
}

func (n *Net) unregister(tok uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.pds[tok-1] = nil
	n.free = append(n.free, tok)
}

func (n *Net) registerListener(tok uint64) *pollDesc {
	pd := newPollDesc()
	n.mu.Lock()
	n.lpds[tok] = pd
	n.mu.Unlock()
	return pd
}

func (n *Net) unregisterListener(tok uint64) {
	n.mu.Lock()
	delete(n.lpds, tok)
	n.mu.Unlock()
}

// pollDesc is what a waiting goroutine selects on: a signal per
// direction, kept (capacity one) when nobody waits yet, so a readiness
// that comes between a call's WouldBlock and its wait is not lost.
type pollDesc struct {
	r, w chan struct{}
}

func newPollDesc() *pollDesc {
	return &pollDesc{r: make(chan struct{}, 1), w: make(chan struct{}, 1)}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// evCap is how many events one poll collects.
const evCap = 256

// liveness is how often a net whose manager is gone polls anyway: with
// no manager to announce a peer's death, each poll looks at the peers.
const liveness = time.Second

// dispatch drains the rings and wakes the goroutines whose connections
// became ready, until the net's last user is gone. (What xio-tokio's
// driver does for tokio, and the loop xio.h's xio_net_watch_begin
// describes.)
func (n *Net) dispatch() {
	defer close(n.stopped)
	evs := (*[evCap]C.xio_event)(C.malloc(C.size_t(unsafe.Sizeof(C.xio_event{})) * evCap))
	defer C.free(unsafe.Pointer(evs))
	rc, err := n.wake.SyscallConn()
	if err != nil {
		panic(fmt.Sprintf("xio: dispatcher: %v", err))
	}
	// A watch that saw nothing: sleep at the next idle moment rather
	// than watch again (two idle peers would keep each other looking).
	watchedIdle := false
	for {
		k := n.poll(evs)
		if k > 0 {
			n.deliver(evs[:k])
			watchedIdle = false
			// Let the woken goroutines run before choosing how to wait:
			// what they send decides whether a peer is about to answer.
			runtime.Gosched()
			continue
		}
		if n.idle() {
			return
		}
		if !watchedIdle {
			if hit, watched := n.watch(evs); watched {
				watchedIdle = !hit
				// Poll again: collects what came as the watch ended, and
				// arms the doorbell before any sleep.
				continue
			}
		}
		watchedIdle = false
		n.park(rc)
	}
}

// poll collects readiness (timeout 0: it never waits). Outside a watch it
// arms the net's fd for the next park.
func (n *Net) poll(evs *[evCap]C.xio_event) int {
	var e errBuf
	var k C.size_t
	if err := e.err(C.xg_net_poll(n.c, &evs[0], evCap, &k, &e[0])); err != nil {
		// Events are never lost to an error (the library keeps them for
		// the next call); a failed drain is tried again after a pause.
		time.Sleep(time.Millisecond)
		return 0
	}
	return int(k)
}

func (n *Net) deliver(evs []C.xio_event) {
	n.mu.Lock()
	for i := range evs {
		tok, ev := uint64(evs[i].token), uint32(evs[i].events)
		var pd *pollDesc
		if tok>>63 == 1 {
			pd = n.lpds[tok]
		} else if tok > 0 && tok <= uint64(len(n.pds)) {
			pd = n.pds[tok-1]
		}
		if pd == nil {
			continue
		}
		if ev&(C.XIO_EVENT_READABLE|C.XIO_EVENT_ACCEPT) != 0 {
			signal(pd.r)
		}
		if ev&C.XIO_EVENT_WRITABLE != 0 {
			signal(pd.w)
		}
	}
	n.mu.Unlock()
}

// watch looks at the rings for the adaptive budget, collecting and
// delivering what arrives, from arrival to arrival. watched is false when
// the budget was 0 (no peer awake on another core); hit says something
// arrived.
func (n *Net) watch(evs *[evCap]C.xio_event) (hit, watched bool) {
	var e errBuf
	var budget C.uint64_t
	if C.xg_net_watch_begin(n.c, &budget, &e[0]) != codeOK {
		return false, false
	}
	if budget == 0 {
		return false, false // no watch begun: sleep
	}
	start := time.Now()
	for looks := 1; ; looks++ {
		if C.xg_net_watch_look(n.c) != 0 {
			hit = true
			if k := n.poll(evs); k > 0 {
				n.deliver(evs[:k])
			}
			runtime.Gosched()
			start, looks = time.Now(), 0
			continue
		}
		// Now and then: the clock (slow to read on VMs), the other
		// goroutines' turn (a yield takes the scheduler's lock; a look
		// is a few loads), and the other processes' turn on this CPU.
		// The budget says the peer runs on another core, but a third
		// process may want this one (three services on two cores: the
		// free5GC example's AMF, AUSF and UDM). Without sched_yield a
		// watch kept a process woken here waiting for its whole length,
		// and the example's authentications took 2.6 times as long.
		if looks%8 == 0 {
			if time.Since(start) >= time.Duration(budget) {
				break
			}
			runtime.Gosched()
			syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
		}
	}
	C.xg_net_watch_end(n.c, boolInt(hit), C.uint64_t(time.Since(start)), &e[0])
	return hit, true
}

func boolInt(b bool) C.int32_t {
	if b {
		return 1
	}
	return 0
}

// park waits in Go's poller until the net's fd or its manager's is
// readable (or, once the manager is gone, for [liveness] at most).
func (n *Net) park(rc syscall.RawConn) {
	var e errBuf
	var gone C.int32_t
	C.xg_net_manager_gone(n.c, &gone, &e[0])
	if gone != 0 {
		n.wake.SetReadDeadline(time.Now().Add(liveness))
	} else {
		n.wake.SetReadDeadline(time.Time{})
	}
	n.mu.Lock()
	idle := n.users == 0
	n.mu.Unlock()
	if idle {
		return
	}
	// Go's poller registers the fd edge-triggered, and forgets an edge
	// that came before this call (RawRead resets it first): look at the
	// fd's level first, as a socket read would, and wait only when
	// nothing is there. (epoll_wait with timeout 0 consumes nothing: the
	// poll that follows does.)
	var ev [2]syscall.EpollEvent
	rc.Read(func(fd uintptr) bool {
		k, err := syscall.EpollWait(int(fd), ev[:], 0)
		return k > 0 || (err != nil && err != syscall.EINTR)
	})
}

func (n *Net) idle() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.users == 0
}
