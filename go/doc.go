// Package xio is X-IO for Go: net.Conn and net.Listener over lock-free
// shared memory between processes of one node, so Go services (net/http,
// HTTP/2 cleartext, gRPC) talk to each other, and to Rust and C services
// of the same pool, without the kernel's network stack.
//
// The library under it is X-IO's C ABI (xio.h, libxio from this
// repository's xio-capi crate), linked statically: build it first with
// `cargo build --release -p xio-capi`. A manager must run for the pool
// (`xio-manager --prefix P`, or [StartManager] in the process).
//
//	l, err := xio.Listen(":8080")            // a net.Listener
//	go http.Serve(l, handler)
//	c, err := xio.Dial("127.0.0.1:8080")     // a net.Conn
//
// The xiohttp package makes net/http clients and servers use it in one
// line, with a fallback to TCP for services not on this node.
//
// Connections behave as TCP's: byte streams with end of stream, half
// close and reset, deadlines (os.ErrDeadlineExceeded), Close unblocking
// waiting calls (net.ErrClosed), and errors that unwrap to the system
// error numbers a socket gives (syscall.ECONNREFUSED, ECONNRESET, EPIPE).
// Goroutines waiting on a connection hold no OS thread: each Net has one
// dispatcher goroutine that drains the rings and wakes them.
//
// A process that exits without closing its connections (os.Exit skips
// the C library's exit handlers) has them reset by the manager, as if it
// had crashed: close connections for a clean end of stream.
package xio
