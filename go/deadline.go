package xio

import (
	"sync"
	"sync/atomic"
	"time"
)

// deadline is a read or write deadline that a waiting call can select on:
// its channel is closed when the deadline passes, and a deadline moved or
// cleared while a call waits takes effect for that call (a new channel
// replaces a closed one; an open one stays, its timer moved).
type deadline struct {
	mu    sync.Mutex // serialises set
	timer *time.Timer
	// passed is closed once the deadline passes; never nil after init.
	passed atomic.Pointer[chan struct{}]
}

func (d *deadline) init() {
	ch := make(chan struct{})
	d.passed.Store(&ch)
}

// wait is the channel a waiting call selects on.
func (d *deadline) wait() <-chan struct{} {
	return *d.passed.Load()
}

// expired reports whether the deadline has passed (a non-blocking look).
func (d *deadline) expired() bool {
	select {
	case <-d.wait():
		return true
	default:
		return false
	}
}

// set moves the deadline to t (the zero time: none).
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ch := *d.passed.Load()
	if d.timer != nil && !d.timer.Stop() {
		// The timer fired: its function closes (or closed) ch. Wait for
		// that, so a new channel below is not closed by a stale timer.
		<-ch
	}
	d.timer = nil
	closed := false
	select {
	case <-ch:
		closed = true
	default:
	}
	if t.IsZero() {
		if closed {
			fresh := make(chan struct{})
			d.passed.Store(&fresh)
		}
		return
	}
	if dur := time.Until(t); dur > 0 {
		if closed {
			fresh := make(chan struct{})
			d.passed.Store(&fresh)
			ch = fresh
		}
		d.timer = time.AfterFunc(dur, func() { close(ch) })
		return
	}
	if !closed {
		close(ch)
	}
}
