package xio

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// threads is the process's OS thread count (/proc/self/status).
func threads(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	t.Fatal("no Threads: line")
	return 0
}

// cpu is the CPU time the process used so far.
func cpu(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// 10,000 idle connections, a goroutine blocked in Read on each end: they
// hold no OS thread each (the process keeps a handful) and use no CPU
// while nothing arrives; then every one still works.
func TestTenThousandIdleConnections(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	conns := 10000
	if v, err := strconv.Atoi(os.Getenv("XIO_GO_IDLE_CONNS")); err == nil {
		conns = v
	}
	other, err := Attach(os.Getenv("XIO_PREFIX"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	l, err := Listen(addr())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	before := threads(t)
	done := make(chan struct{})
	echoed := make(chan error, 2*conns)
	// Each end's goroutine waits in Read, then echoes one byte.
	serve := func(c *Conn) {
		b := make([]byte, 1)
		_, err := c.Read(b)
		if err == nil {
			_, err = c.Write(b)
		}
		echoed <- err
		<-done
		c.Close()
	}
	var accepted atomic.Int64
	go func() {
		for i := 0; i < conns; i++ {
			c, err := l.AcceptXio()
			if err != nil {
				t.Error(err)
				return
			}
			go serve(c)
			accepted.Add(1)
		}
	}()
	d := &Dialer{Net: other}
	var clients []*Conn
	for i := 0; i < conns; i++ {
		c, err := d.dialXio(t.Context(), l.Addr().String())
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		clients = append(clients, c)
	}
	t.Logf("%d connections made", conns)
	// Everything is set up and quiet (every connection accepted, the
	// garbage of setting up collected): count threads and CPU.
	waitFor(t, "every connection accepted", func() bool { return accepted.Load() == int64(conns) })
	runtime.GC()
	time.Sleep(200 * time.Millisecond)
	after := threads(t)
	used := cpu(t)
	time.Sleep(time.Second)
	idle := cpu(t) - used
	t.Logf("threads %d before, %d with %d idle connections (and %d goroutines waiting); %v of CPU in an idle second",
		before, after, conns, conns, idle)
	if after-before > 8 {
		t.Errorf("%d more threads for %d idle connections", after-before, conns)
	}
	if idle > 50*time.Millisecond {
		t.Errorf("%v of CPU in an idle second", idle)
	}
	// Still working: each client sends a byte, its server echoes it.
	start := time.Now()
	defer func() { t.Logf("echoes and close in %v", time.Since(start)) }()
	// (A round trip at a time: the pool is shared, and 10,000 bytes
	// sent and 10,000 echoed, all unread, would hold more buffers than
	// the default pool has, as TCP's socket buffers never would.)
	b := make([]byte, 1)
	for _, c := range clients {
		if _, err := c.Write([]byte{1}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Read(b); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < conns; i++ {
		if err := <-echoed; err != nil {
			t.Fatal(err)
		}
	}
	close(done)
	for _, c := range clients {
		c.Close()
	}
}
