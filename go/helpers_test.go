package xio

import (
	"sync/atomic"
	"testing"
	"time"
)

// watchdog bounds a wait that would otherwise hang a broken test; it is
// no bound on speed.
const watchdog = 2 * time.Minute

var nextPort atomic.Int32

// addr is a fresh X-IO address for one test.
func addr() string {
	return "10.200.0.1:" + itoa(int(20000+nextPort.Add(1)))
}

func itoa(n int) string {
	b := []byte{}
	for {
		b = append([]byte{byte('0' + n%10)}, b...)
		n /= 10
		if n == 0 {
			return string(b)
		}
	}
}

// pair is a connected pair: the dialled end and the accepted one.
func pair(t testing.TB) (c, s *Conn) {
	t.Helper()
	l, err := Listen(addr())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := make(chan *Conn, 1)
	go func() {
		s, err := l.AcceptXio()
		if err != nil {
			t.Error(err)
		}
		got <- s
	}()
	c, err = Dial(l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s = <-got
	if s == nil {
		t.FailNow()
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

// waitFor polls cond until it holds (a watchdog, not a time bound).
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(watchdog)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("watchdog: %s never happened", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// poolWhole waits until every buffer of the tests' pool is free again
// (once every stack holding some has let go or been reclaimed).
func poolWhole(t testing.TB) {
	t.Helper()
	var st ManagerStats
	waitFor(t, "every buffer back in the pool", func() bool {
		var err error
		st, err = testManager.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return st.BuffersFree == st.BuffersTotal
	})
}
