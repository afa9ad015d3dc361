package xio

import (
	"net"
	"testing"

	"golang.org/x/net/nettest"
)

// makePipe is a connected X-IO pair for nettest: a dialled end and the
// accepted one, over a listener on a port of its own.
func makePipe() (c1, c2 net.Conn, stop func(), err error) {
	l, err := Listen("127.0.0.1:0")
	if err != nil {
		return nil, nil, nil, err
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	failed := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			failed <- err
			return
		}
		accepted <- c
	}()
	c1, err = Dial(l.Addr().String())
	if err != nil {
		return nil, nil, nil, err
	}
	select {
	case c2 = <-accepted:
	case err = <-failed:
		c1.Close()
		return nil, nil, nil, err
	}
	return c1, c2, func() { c1.Close(); c2.Close() }, nil
}

// TestNettestConn runs golang.org/x/net/nettest's conformance suite for
// net.Conn implementations against X-IO connections.
func TestNettestConn(t *testing.T) {
	nettest.TestConn(t, makePipe)
}
