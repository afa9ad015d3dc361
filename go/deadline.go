package xio

import (
	"sync"
	"sync/atomic"
	"time"
)

// deadline is a read or write deadline. When it passes it raises its flag
// and signals its direction's channel, which is all a waiting call
// selects on: the call wakes, sees the flag and fails. A deadline moved
// or cleared while a call waits takes effect for that call. Setting one
// in the past or clearing one allocates nothing (net/http's server does
// both for every request, to end its background read).
type deadline struct {
	passed atomic.Bool
	ch     chan struct{} // the direction's signal
	mu     sync.Mutex    // serialises set and the timer's firing
	timer  *time.Timer
	gen    uint64 // which set the timer belongs to
}

func (d *deadline) init(ch chan struct{}) { d.ch = ch }

// expired reports whether the deadline has passed.
func (d *deadline) expired() bool { return d.passed.Load() }

// set moves the deadline to t (the zero time: none).
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.gen++
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
	if t.IsZero() {
		d.passed.Store(false)
		return
	}
	dur := time.Until(t)
	if dur <= 0 {
		d.passed.Store(true)
		signal(d.ch)
		return
	}
	d.passed.Store(false)
	gen := d.gen
	d.timer = time.AfterFunc(dur, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.gen == gen { // not moved since
			d.passed.Store(true)
			signal(d.ch)
		}
	})
}
