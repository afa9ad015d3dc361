// Package xiohttp makes Go's net/http (HTTP/1.1) and golang.org/x/net's
// HTTP/2 cleartext (h2c) run over X-IO, each in one line, with an
// automatic fallback to TCP for services not on this node.
//
//	// Server: any http.Handler, HTTP/1.1 and h2c on one X-IO listener.
//	go xiohttp.ListenAndServe(":8080", mux)
//
//	// Clients: X-IO when a service of this node binds the address, TCP
//	// otherwise.
//	c := xiohttp.NewClient()    // HTTP/1.1
//	c2 := xiohttp.NewH2CClient() // HTTP/2 without TLS (free5GC's SBI)
//
// Listeners bind X-IO only: programs that are not X-IO clients (curl, a
// browser, another node) reach a service through a TCP listener of its
// own; [ServeBoth] serves one handler on both.
package xiohttp

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c"
	"xio.dev/xio"
)

// Dialer is what the transports dial with: X-IO, falling back to TCP when
// no X-IO service binds the address on this node.
func Dialer() *xio.Dialer {
	return &xio.Dialer{
		FallbackTCP: true,
		TCP:         net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second},
	}
}

// NewTransport is an HTTP/1.1 transport over X-IO (a clone of
// http.DefaultTransport with X-IO's dialer): swap it into an
// http.Client, or use [NewClient].
func NewTransport() *http.Transport {
	return NewTransportWith(Dialer())
}

// NewTransportWith is [NewTransport] dialling with d (another net, no
// fallback, a TCP dialer of its own...).
func NewTransportWith(d *xio.Dialer) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = d.DialContext
	// Many requests in flight to one service keep as many connections.
	t.MaxIdleConnsPerHost = 256
	return t
}

// NewClient is an http.Client over [NewTransport].
func NewClient() *http.Client {
	return &http.Client{Transport: NewTransport()}
}

// NewH2CTransport is an HTTP/2 cleartext transport over X-IO (prior
// knowledge: no upgrade, as free5GC's SBI clients speak it): requests to
// http:// URLs go over HTTP/2 on one connection per service.
func NewH2CTransport() *http2.Transport {
	return NewH2CTransportWith(Dialer())
}

// NewH2CTransportWith is [NewH2CTransport] dialling with d.
func NewH2CTransportWith(d *xio.Dialer) *http2.Transport {
	return &http2.Transport{
		AllowHTTP: true,
		DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
			return d.DialContext(ctx, network, addr)
		},
	}
}

// NewH2CClient is an http.Client over [NewH2CTransport].
func NewH2CClient() *http.Client {
	return &http.Client{Transport: NewH2CTransport()}
}

// Handler serves h over HTTP/1.1 and over h2c (HTTP/2 with prior
// knowledge, or upgraded from HTTP/1.1) on the same connections.
func Handler(h http.Handler) http.Handler {
	return h2c.NewHandler(h, &http2.Server{})
}

// Serve serves h (HTTP/1.1 and h2c) on l until l is closed.
func Serve(l net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: Handler(h)}
	return srv.Serve(l)
}

// ListenAndServe listens on addr over X-IO and serves h there (HTTP/1.1
// and h2c).
func ListenAndServe(addr string, h http.Handler) error {
	l, err := xio.Listen(addr)
	if err != nil {
		return err
	}
	return Serve(l, h)
}

// ServeBoth serves h on addr over X-IO and over TCP at once (X-IO clients
// of this node take the first, everyone else the second), until either
// fails; then it closes both and returns that error.
func ServeBoth(addr string, h http.Handler) error {
	xl, err := xio.Listen(addr)
	if err != nil {
		return err
	}
	tl, err := net.Listen("tcp", addr)
	if err != nil {
		xl.Close()
		return err
	}
	errs := make(chan error, 2)
	var once sync.Once
	stop := func() { once.Do(func() { xl.Close(); tl.Close() }) }
	for _, l := range []net.Listener{xl, tl} {
		go func(l net.Listener) {
			errs <- Serve(l, h)
			stop()
		}(l)
	}
	err = <-errs
	<-errs
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
