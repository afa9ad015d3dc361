//! The C ABI called from Rust, for what a C test program cannot set up
//! easily: a second stack to observe a peer's death with, thread-local
//! teardown, a write that stops half way. (Linked as the rlib; the C
//! programs of `tests/c.rs` cover the same functions through the header.)

#[path = "../../xio-core/tests/common/process_dir.rs"]
mod process_dir;

use std::ffi::CString;
use std::ptr::null_mut;
use std::sync::OnceLock;

use xio::*;
use xio_core::manager::{Manager, ManagerHandle};

/// Against hangs only; not a performance bound.
const WATCHDOG_MS: i32 = 120_000;

/// Moves C handles to another thread in the tests below.
struct Send<T>(T);
// SAFETY: the tests send only handles the header says any thread may use
// (nets, streams), or a stack that one thread at a time uses: the other
// thread until it ends or releases it (joined or signalled), then the
// test's own.
unsafe impl<T> std::marker::Send for Send<T> {}

/// A manager for `test`'s own pool prefix.
fn manager(test: &str) -> (ManagerHandle, CString) {
    manager_with(test, xio_core::prelude::PoolConfig::default())
}

/// [`manager`] with the pool `pool`.
fn manager_with(test: &str, pool: xio_core::prelude::PoolConfig) -> (ManagerHandle, CString) {
    run_dir();
    let p = format!("abi-{test}-{}", std::process::id());
    let m = Manager::builder(&p).pool(pool).spawn().unwrap();
    (m, CString::new(p).unwrap())
}

/// The test process's own run directory, set once, before any thread of
/// ours reads the environment.
fn run_dir() {
    static DIR: OnceLock<()> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = process_dir::process_dir("xio-capi-abi");
        std::env::set_var("XIO_RUN_DIR", &dir);
    });
}

fn addr(s: &str) -> CString {
    CString::new(s).unwrap()
}

/// A listener of `server` at `a`, a stream `client` dials to it, and the
/// accepted end: `(listener, dialled, accepted)`.
///
/// # Safety
/// `server` and `client` are live nets.
unsafe fn connected(
    server: *mut XioNet,
    client: *mut XioNet,
    a: &str,
) -> (*mut XioListener, *mut XioStream, *mut XioStream) {
    let a = addr(a);
    let (mut l, mut c, mut s) = (null_mut(), null_mut(), null_mut());
    // SAFETY: live nets (contract), valid out-parameters, a NUL-terminated
    // address.
    unsafe {
        assert_eq!(xio_listen(server, a.as_ptr(), &mut l), XIO_OK);
        assert_eq!(xio_dial(client, a.as_ptr(), &mut c), XIO_OK);
        assert_eq!(xio_accept(l, &mut s), XIO_OK);
    }
    (l, c, s)
}

/// A stack attached to pool `p`.
fn stack(p: &CString) -> *mut XioStack {
    let mut s = null_mut();
    // SAFETY: a NUL-terminated prefix and a valid out-parameter.
    assert_eq!(unsafe { xio_stack_attach(p.as_ptr(), &mut s) }, XIO_OK);
    s
}

/// Sends `n` 8-byte buffers from `s` to `peer`.
///
/// # Safety
/// `s` is a live stack handle.
unsafe fn send_some(s: *mut XioStack, peer: XioPeer, n: usize) {
    for _ in 0..n {
        let mut b = null_mut();
        // SAFETY: per this function's contract; `b` is the live buffer
        // just allocated, consumed by the send.
        unsafe {
            assert_eq!(xio_alloc(s, 8, &mut b), XIO_OK);
            assert_eq!(xio_buf_set_len(b, 8), XIO_OK);
            assert_eq!(xio_send(s, peer, b), XIO_OK);
        }
    }
}

/// Stacks `rx` and `watcher` of pool `p` (addresses in 10.9.`net`.0/24),
/// with two buffers from a stack that then closed waiting in `rx`'s
/// ring, and the manager's notice of that close on `rx`'s control socket
/// behind them: both buffers and then the reset are there before the
/// next receive starts. Returns them and `rx`'s address.
///
/// # Safety
/// Calls the C ABI with valid handles and arguments; the caller closes
/// the two stacks.
unsafe fn two_buffers_then_a_reset(
    p: &CString,
    net: u8,
) -> (*mut XioStack, *mut XioStack, CString) {
    // SAFETY: live handles from `stack`, valid out-parameters and
    // NUL-terminated strings throughout.
    unsafe {
        let rx = stack(p);
        let tx = stack(p);
        let watcher = stack(p);
        let (rx_addr, tx_addr) = (
            addr(&format!("10.9.{net}.1:80")),
            addr(&format!("10.9.{net}.2:80")),
        );
        assert_eq!(xio_stack_bind(rx, rx_addr.as_ptr()), XIO_OK);
        assert_eq!(xio_stack_bind(tx, tx_addr.as_ptr()), XIO_OK);
        let mut to_rx = 0;
        assert_eq!(xio_stack_connect(tx, rx_addr.as_ptr(), &mut to_rx), XIO_OK);
        let mut to_tx = 0;
        assert_eq!(
            xio_stack_connect(watcher, tx_addr.as_ptr(), &mut to_tx),
            XIO_OK
        );
        send_some(tx, to_rx, 2);
        assert_eq!(xio_stack_close(tx), XIO_OK);
        // The manager tells all of a dead stack's peers at once: once the
        // watcher has its reset, `rx`'s notice is on its control socket,
        // and a request of `rx` (its answer comes after the notice) takes
        // it in, behind the two buffers.
        let mut b = null_mut();
        let mut from = 0;
        assert_eq!(
            xio_recv(watcher, WATCHDOG_MS, &mut b, &mut from),
            XIO_ERR_CONNECTION_RESET
        );
        let other = addr(&format!("10.9.{net}.3:80"));
        assert_eq!(xio_stack_bind(rx, other.as_ptr()), XIO_OK);
        (rx, watcher, rx_addr)
    }
}

/// A peer's reset that comes right after a burst's buffers ends the
/// burst and is reported by the next call, as the header promises. (The
/// burst used to take it from the stack and drop it: the next call waited
/// for traffic that the dead peer would never send.)
#[test]
fn a_reset_after_a_bursts_buffers_is_reported_by_the_next_call() {
    let (_m, p) = manager("burst-reset");
    // SAFETY: live handles from `stack`, valid out-parameters and
    // NUL-terminated strings throughout; every received buffer is freed.
    unsafe {
        let (rx, watcher, rx_addr) = two_buffers_then_a_reset(&p, 0);
        let (mut b, mut from) = (null_mut(), 0);
        let mut bufs = [null_mut(); 16];
        let mut froms = [0; 16];
        let mut n = 0;
        let r = xio_recv_burst(rx, 0, bufs.as_mut_ptr(), froms.as_mut_ptr(), 16, &mut n);
        assert_eq!(r, XIO_OK);
        assert_eq!(n, 2, "the burst takes both buffers");
        assert!(froms[..n].iter().all(|&f| f == froms[0]));
        for b in &bufs[..n] {
            assert_eq!(xio_buf_free(*b), XIO_OK);
        }
        let r = xio_recv(rx, WATCHDOG_MS, &mut b, &mut from);
        assert_eq!(r, XIO_ERR_CONNECTION_RESET, "the reset was lost");
        // Reported once.
        assert_eq!(xio_recv(rx, 0, &mut b, &mut from), XIO_ERR_WOULD_BLOCK);

        // Through a burst: the notice it ends on is reported by the next
        // burst. (The reset comes in this burst, or after it and is then
        // waited for: either way the next burst reports it.)
        let tx2 = stack(&p);
        let mut to_rx = 0;
        assert_eq!(xio_stack_connect(tx2, rx_addr.as_ptr(), &mut to_rx), XIO_OK);
        send_some(tx2, to_rx, 1);
        assert_eq!(xio_stack_close(tx2), XIO_OK);
        let r = xio_recv_burst(rx, WATCHDOG_MS, bufs.as_mut_ptr(), null_mut(), 16, &mut n);
        assert_eq!(r, XIO_OK);
        assert_eq!(n, 1);
        assert_eq!(xio_buf_free(bufs[0]), XIO_OK);
        n = 99;
        let r = xio_recv_burst(rx, WATCHDOG_MS, bufs.as_mut_ptr(), null_mut(), 16, &mut n);
        assert_eq!(r, XIO_ERR_CONNECTION_RESET, "the reset was lost");
        assert_eq!(n, 99, "n_out is written only on success");
        for s in [rx, watcher] {
            assert_eq!(xio_stack_close(s), XIO_OK);
        }
    }
}

/// A failing `xio_` call made from a thread-local destructor that runs
/// after libxio's own thread-locals are gone (a C program's
/// `pthread_key_create` destructor, say) returns its error code. (It used
/// to panic in an `extern "C"` function while recording the message, and
/// abort the process.)
#[test]
fn a_failing_call_during_thread_teardown_returns_its_code() {
    const CHILD: &str = "XIO_ABI_TLS_CHILD";
    if std::env::var_os(CHILD).is_some() {
        struct LateCaller;
        impl Drop for LateCaller {
            fn drop(&mut self) {
                let mut junk = [0u64; 4];
                // SAFETY: deliberately not a stream handle: its magic
                // number is checked (reading 8 bytes of `junk`) and found
                // wrong.
                let r = unsafe { xio_stream_close(junk.as_mut_ptr().cast()) };
                assert_eq!(r, XIO_ERR_INVALID_HANDLE);
                // The message is gone with the thread's storage.
                // SAFETY: a NUL-terminated string, per its contract.
                let msg = unsafe { std::ffi::CStr::from_ptr(xio_last_error()) };
                eprintln!("late call: {r}, {msg:?}");
                println!("late call returned");
            }
        }
        thread_local!(static LATE: LateCaller = const { LateCaller });
        std::thread::spawn(|| {
            // Registered before libxio's: destroyed after them.
            LATE.with(|_| {});
            let mut junk = [0u64; 4];
            // SAFETY: as above.
            let r = unsafe { xio_stream_close(junk.as_mut_ptr().cast()) };
            assert_eq!(r, XIO_ERR_INVALID_HANDLE);
            // SAFETY: as above.
            let msg = unsafe { std::ffi::CStr::from_ptr(xio_last_error()) };
            assert!(!msg.is_empty());
        })
        .join()
        .unwrap();
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "a_failing_call_during_thread_teardown_returns_its_code",
            "--exact",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("late call returned"),
        "the child failed: {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
}

/// Runs `first` on a new thread and then, as that thread exits, `late`
/// from a thread-local destructor that runs after libxio's own
/// thread-locals are gone (as a C program's `pthread_key_create`
/// destructor may); joins the thread.
fn on_a_thread_then_at_its_teardown(
    first: impl FnOnce() + std::marker::Send + 'static,
    late: impl FnOnce() + std::marker::Send + 'static,
) {
    type Late = Box<dyn FnOnce()>;
    struct AtExit(std::cell::RefCell<Option<Late>>);
    impl Drop for AtExit {
        fn drop(&mut self) {
            if let Some(f) = self.0.borrow_mut().take() {
                f();
            }
        }
    }
    thread_local!(static AT_EXIT: AtExit = const { AtExit(std::cell::RefCell::new(None)) });
    std::thread::spawn(move || {
        // Registered before libxio's: destroyed after them.
        AT_EXIT.with(|a| *a.0.borrow_mut() = Some(Box::new(late)));
        first();
    })
    .join()
    .unwrap();
}

/// A stack that a thread claims while it exits, from a thread-local
/// destructor that runs after libxio's own thread-locals are gone (a C
/// program's `pthread_key_create` destructor, say), is not left owned by
/// the dead thread: the header says a thread owns a stack until it
/// releases it or exits. (The claim could not be recorded for release
/// at exit, so it was kept for good: every other thread's calls said
/// `XIO_ERR_BUSY` for ever.)
#[test]
fn a_stack_claimed_during_thread_teardown_is_not_kept_by_the_dead_thread() {
    let (_m, p) = manager("teardown-claim");
    let (s, other) = (stack(&p), stack(&p));
    let (hs, ho) = (Send(s), Send(other));
    on_a_thread_then_at_its_teardown(
        move || {
            let ho = ho;
            // libxio's thread-locals (its list of this thread's claims).
            let mut b = null_mut();
            // SAFETY: a live stack, used by this thread alone; the buffer
            // is freed once.
            unsafe {
                assert_eq!(xio_alloc(ho.0, 8, &mut b), XIO_OK);
                assert_eq!(xio_buf_free(b), XIO_OK);
            }
        },
        move || {
            let hs = hs;
            let mut b = null_mut();
            // SAFETY: a live stack nobody else uses now; the buffer is
            // freed once.
            unsafe {
                assert_eq!(xio_alloc(hs.0, 8, &mut b), XIO_OK);
                assert_eq!(xio_buf_free(b), XIO_OK);
            }
        },
    );
    // SAFETY: live stacks, the spawned thread is gone; valid
    // out-parameters.
    unsafe {
        let mut b = null_mut();
        assert_eq!(
            xio_alloc(s, 8, &mut b),
            XIO_OK,
            "the exited thread still owns the stack: {:?}",
            std::ffi::CStr::from_ptr(xio_last_error())
        );
        assert_eq!(xio_buf_free(b), XIO_OK);
        assert_eq!(xio_alloc(other, 8, &mut b), XIO_OK);
        assert_eq!(xio_buf_free(b), XIO_OK);
        assert_eq!(xio_stack_close(s), XIO_OK);
        assert_eq!(xio_stack_close(other), XIO_OK);
    }
}

/// A write batch that a thread begins while it exits, from a
/// thread-local destructor that runs after libxio's own thread-locals are
/// gone (a C program's `pthread_key_create` destructor, say), does not
/// outlive the thread: the header says a thread that exits ends its
/// batch. (The batch could not be recorded for ending at exit, so it
/// stayed the dead thread's: every other thread's `xio_net_batch_begin`
/// said `XIO_ERR_BUSY` for ever, and its held bytes waited.)
#[test]
fn a_batch_begun_during_thread_teardown_is_not_kept_by_the_dead_thread() {
    let (_m, p) = manager("teardown-batch");
    // SAFETY: live handles, valid out-parameters and buffers of the
    // lengths given, NUL-terminated strings throughout.
    unsafe {
        let mut net = null_mut();
        assert_eq!(xio_net_attach(p.as_ptr(), &mut net), XIO_OK);
        // Another net dials: a stream to the same net is never held.
        let mut net2 = null_mut();
        assert_eq!(xio_net_attach(p.as_ptr(), &mut net2), XIO_OK);
        let (l, c, s) = connected(net, net2, "10.9.11.1:80");
        let (first, late) = (Send(net2), Send((net2, c)));
        on_a_thread_then_at_its_teardown(
            move || {
                let first = first;
                // libxio's thread-locals (its list of this thread's
                // batches).
                assert_eq!(xio_net_batch_begin(first.0), XIO_OK);
                assert_eq!(xio_net_batch_end(first.0), XIO_OK);
            },
            move || {
                let late = late;
                let (net2, c) = late.0;
                let mut k = 0;
                assert_eq!(xio_net_batch_begin(net2), XIO_OK);
                assert_eq!(xio_write(c, b"late".as_ptr().cast(), 4, &mut k), XIO_OK);
                assert_eq!(k, 4);
                // Ends without xio_net_batch_end.
            },
        );
        assert_eq!(
            xio_net_batch_begin(net2),
            XIO_OK,
            "the exited thread's batch is still under way: {:?}",
            std::ffi::CStr::from_ptr(xio_last_error())
        );
        assert_eq!(xio_net_batch_end(net2), XIO_OK);
        // The bytes went out (the timeout is only a watchdog).
        assert_eq!(xio_stream_set_timeouts(s, WATCHDOG_MS, 0), XIO_OK);
        let mut buf = [0u8; 8];
        let mut n = 0;
        assert_eq!(xio_read(s, buf.as_mut_ptr().cast(), 8, &mut n), XIO_OK);
        assert_eq!(&buf[..n], b"late");
        assert_eq!(xio_stream_close(c), XIO_OK);
        assert_eq!(xio_stream_close(s), XIO_OK);
        assert_eq!(xio_listener_close(l), XIO_OK);
        assert_eq!(xio_net_close(net2), XIO_OK);
        assert_eq!(xio_net_close(net), XIO_OK);
    }
}

/// A blocking write that the peer's reset cuts short after some bytes
/// went returns success with their count, as Linux's `send` does; the
/// next write reports the reset. (It returned the reset and left `n_out`
/// unwritten: the caller could not know what had been sent.)
#[test]
fn a_write_cut_short_by_a_reset_reports_what_went() {
    let (_m, p) = manager("write-reset");
    // SAFETY: live handles, valid out-parameters and buffers of the
    // lengths given, NUL-terminated strings throughout.
    unsafe {
        let mut net = null_mut();
        assert_eq!(xio_net_attach(p.as_ptr(), &mut net), XIO_OK);
        let mut other = null_mut();
        assert_eq!(xio_net_attach(p.as_ptr(), &mut other), XIO_OK);
        let (l, c, s) = connected(other, net, "10.9.1.2:80");
        // The watchdog: a write that never ends times out instead.
        assert_eq!(xio_stream_set_timeouts(c, 0, WATCHDOG_MS), XIO_OK);
        let h = Send(c);
        let writer = std::thread::spawn(move || {
            let h = h;
            // Far more than the reader's window.
            let big = vec![7u8; 64 << 20];
            let mut n = usize::MAX;
            let r = xio_write(h.0, big.as_ptr().cast(), big.len(), &mut n);
            let mut m = usize::MAX;
            let r2 = xio_write(h.0, big.as_ptr().cast(), 1, &mut m);
            (r, n, r2)
        });
        // Some bytes arrive; the reader then closes with the rest unread.
        assert_eq!(xio_stream_set_timeouts(s, WATCHDOG_MS, 0), XIO_OK);
        let mut buf = vec![0u8; 4096];
        let mut k = 0;
        assert_eq!(
            xio_read(s, buf.as_mut_ptr().cast(), buf.len(), &mut k),
            XIO_OK
        );
        assert!(k > 0);
        assert_eq!(xio_stream_close(s), XIO_OK);
        let (r, n, r2) = writer.join().unwrap();
        assert_eq!(r, XIO_OK, "a write the reset cut short is a success");
        assert!(n > 0 && n < 64 << 20, "n_out = {n}");
        assert_eq!(r2, XIO_ERR_CONNECTION_RESET, "the next write reports it");
        assert_eq!(xio_stream_close(c), XIO_OK);
        assert_eq!(xio_listener_close(l), XIO_OK);
        assert_eq!(xio_net_close(other), XIO_OK);
        assert_eq!(xio_net_close(net), XIO_OK);
    }
}

/// A blocking write with a write timeout that sent part of its bytes
/// before the timeout returns success with that count, as `send` with
/// `SO_SNDTIMEO` does; the next write reports the timeout. (It used to
/// fail with `XIO_ERR_TIMED_OUT` and leave `n_out` unwritten: the caller
/// could not know what the peer would read.)
#[test]
fn a_write_timeout_after_some_bytes_reports_their_count() {
    let (_m, p) = manager("write-timeout");
    // SAFETY: live handles, valid out-parameters and buffers of the
    // lengths given, NUL-terminated strings throughout.
    unsafe {
        let mut net = null_mut();
        assert_eq!(xio_net_attach(p.as_ptr(), &mut net), XIO_OK);
        let (l, c, s) = connected(net, net, "10.9.1.1:80");
        assert_eq!(xio_stream_set_timeouts(c, 0, 200), XIO_OK);
        // Far more than the reader's window: the write stops part way.
        let big = vec![7u8; 64 << 20];
        let mut n = usize::MAX;
        let r = xio_write(c, big.as_ptr().cast(), big.len(), &mut n);
        assert_eq!(r, XIO_OK, "a partial write is a success");
        assert!(n > 0 && n < big.len(), "n_out = {n}");
        // Nothing was read meanwhile: the next write times out.
        let mut m = usize::MAX;
        let r = xio_write(c, big.as_ptr().cast(), big.len(), &mut m);
        assert_eq!(r, XIO_ERR_TIMED_OUT);
        assert_eq!(m, usize::MAX, "n_out is written only on success");
        // The reader gets exactly the reported bytes, then end of stream.
        assert_eq!(xio_stream_set_timeouts(s, WATCHDOG_MS, 0), XIO_OK);
        assert_eq!(xio_stream_close(c), XIO_OK);
        let mut got = 0usize;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let mut k = 0;
            let r = xio_read(s, buf.as_mut_ptr().cast(), buf.len(), &mut k);
            assert_eq!(r, XIO_OK, "watchdog or error after {got} bytes");
            if k == 0 {
                break;
            }
            assert!(buf[..k].iter().all(|&x| x == 7));
            got += k;
        }
        assert_eq!(got, n, "the peer read what n_out reported");
        assert_eq!(xio_stream_close(s), XIO_OK);
        assert_eq!(xio_listener_close(l), XIO_OK);
        assert_eq!(xio_net_close(net), XIO_OK);
    }
}

/// A write of no bytes reports what a write would: `XIO_ERR_BROKEN_PIPE`
/// after this side shut down writes, as the header (and `send(2)`) say,
/// and success with 0 on a healthy stream. (The C layer returned success
/// without asking the stream, so a zero-length write could not tell a
/// broken stream from a live one.)
#[test]
fn a_zero_length_write_reports_a_shut_down_stream() {
    let (_m, p) = manager("write-zero");
    // SAFETY: live handles, valid out-parameters and buffers of the
    // lengths given, NUL-terminated strings throughout.
    unsafe {
        let mut net = null_mut();
        assert_eq!(xio_net_attach(p.as_ptr(), &mut net), XIO_OK);
        let (l, c, s) = connected(net, net, "10.9.7.1:80");
        let mut n = usize::MAX;
        assert_eq!(xio_write(c, b"x".as_ptr().cast(), 0, &mut n), XIO_OK);
        assert_eq!(n, 0);
        // Nothing to read, nothing waited for (the stream is blocking
        // and empty); NULL allowed, as with read(2) and xio_write.
        let mut n = usize::MAX;
        assert_eq!(xio_read(s, null_mut(), 0, &mut n), XIO_OK);
        assert_eq!(n, 0);
        assert_eq!(xio_stream_set_nonblocking(s, 1), XIO_OK);
        let mut n = usize::MAX;
        assert_eq!(xio_read(s, null_mut(), 0, &mut n), XIO_OK, "non-blocking");
        assert_eq!(n, 0);
        assert_eq!(xio_stream_set_nonblocking(s, 0), XIO_OK);
        assert_eq!(xio_read(s, null_mut(), 1, &mut n), XIO_ERR_INVALID_ARGUMENT);
        assert_eq!(xio_shutdown(c, XIO_SHUT_WR), XIO_OK);
        let mut n = usize::MAX;
        assert_eq!(
            xio_write(c, b"x".as_ptr().cast(), 1, &mut n),
            XIO_ERR_BROKEN_PIPE
        );
        assert_eq!(
            xio_write(c, b"x".as_ptr().cast(), 0, &mut n),
            XIO_ERR_BROKEN_PIPE,
            "a write of nothing after SHUT_WR"
        );
        let iov = XioIovec {
            base: std::ptr::null(),
            len: 0,
        };
        assert_eq!(xio_writev(c, &iov, 1, &mut n), XIO_ERR_BROKEN_PIPE);
        assert_eq!(n, usize::MAX, "n_out is written only on success");
        assert_eq!(xio_stream_close(c), XIO_OK);
        assert_eq!(xio_stream_close(s), XIO_OK);
        assert_eq!(xio_listener_close(l), XIO_OK);
        assert_eq!(xio_net_close(net), XIO_OK);
    }
}

/// A thread that exits inside a write batch (`xio_net_batch_begin`
/// without `xio_net_batch_end`: an error path, `pthread_exit`) ends it,
/// as a thread's exit gives up the stacks it owns: its held writes leave
/// and other threads may batch again. (The batch stayed the dead
/// thread's: every other thread's `xio_net_batch_begin` said
/// `XIO_ERR_BUSY` for good, and the held bytes waited for some other
/// traffic on the net to push them out.)
#[test]
fn a_thread_that_exits_inside_a_write_batch_ends_it() {
    let (_m, p) = manager("batch-exit");
    // SAFETY: live handles, valid out-parameters and buffers of the
    // lengths given, NUL-terminated strings throughout.
    unsafe {
        let mut net = null_mut();
        assert_eq!(xio_net_attach(p.as_ptr(), &mut net), XIO_OK);
        // Another net (another stack) dials: a stream to the same net is
        // never held.
        let mut net2 = null_mut();
        assert_eq!(xio_net_attach(p.as_ptr(), &mut net2), XIO_OK);
        let (l, c, s) = connected(net, net2, "10.9.8.1:80");
        let h = Send((net2, c));
        std::thread::spawn(move || {
            let h = h;
            let (net2, c) = h.0;
            assert_eq!(xio_net_batch_begin(net2), XIO_OK);
            let mut k = 0;
            assert_eq!(xio_write(c, b"held".as_ptr().cast(), 4, &mut k), XIO_OK);
            assert_eq!(k, 4);
            // Exits with the batch open.
        })
        .join()
        .unwrap();
        assert_eq!(
            xio_net_batch_begin(net2),
            XIO_OK,
            "the exited thread's batch is still under way: {:?}",
            std::ffi::CStr::from_ptr(xio_last_error())
        );
        assert_eq!(xio_net_batch_end(net2), XIO_OK);
        // The held bytes went out (the timeout is only a watchdog).
        assert_eq!(xio_stream_set_timeouts(s, WATCHDOG_MS, 0), XIO_OK);
        let mut buf = [0u8; 8];
        let mut n = 0;
        assert_eq!(xio_read(s, buf.as_mut_ptr().cast(), 8, &mut n), XIO_OK);
        assert_eq!(&buf[..n], b"held");
        assert_eq!(xio_stream_close(c), XIO_OK);
        assert_eq!(xio_stream_close(s), XIO_OK);
        assert_eq!(xio_listener_close(l), XIO_OK);
        assert_eq!(xio_net_close(net2), XIO_OK);
        assert_eq!(xio_net_close(net), XIO_OK);
    }
}

extern "C" {
    fn fork() -> i32;
    fn _exit(code: i32) -> !;
    fn alarm(seconds: u32) -> u32;
    fn waitpid(pid: i32, status: *mut i32, options: i32) -> i32;
    fn pipe(fds: *mut i32) -> i32;
    fn write(fd: i32, buf: *const u8, n: usize) -> isize;
    fn read(fd: i32, buf: *mut u8, n: usize) -> isize;
    fn close(fd: i32) -> i32;
    fn poll(fds: *mut PollFd, nfds: u64, timeout: i32) -> i32;
}

/// `struct pollfd`.
#[repr(C)]
struct PollFd {
    fd: i32,
    events: i16,
    revents: i16,
}

/// Whether `fd` is readable now (`poll` without waiting).
fn readable_now(fd: i32) -> bool {
    let mut p = PollFd {
        fd,
        events: 1, // POLLIN
        revents: 0,
    };
    // SAFETY: one valid `pollfd`.
    let r = unsafe { poll(&mut p, 1, 0) };
    assert!(r >= 0, "poll failed");
    r == 1
}

/// A process forked while another of its threads was inside a call on a
/// net gets `XIO_ERR_FORKED` from calls on the inherited net and its
/// streams, and closes them harmlessly, as the header promises, instead
/// of waiting for ever on the net's lock, which the child's copy has
/// taken by a thread that does not exist in the child. Each child is
/// killed by `alarm` (the watchdog) if a call hangs.
#[test]
fn a_child_forked_while_another_thread_polls_the_net_does_not_hang() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (_m, p) = manager("fork-busy-net");
    // SAFETY: live handles, valid out-parameters and NUL-terminated
    // strings throughout; the child calls only xio_ functions and exits
    // with `_exit`.
    unsafe {
        let mut net = null_mut();
        assert_eq!(xio_net_attach(p.as_ptr(), &mut net), XIO_OK);
        let (l, c, s) = connected(net, net, "10.9.2.1:80");
        assert_eq!(xio_stream_set_nonblocking(s, 1), XIO_OK);

        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let busy = {
            let stop = stop.clone();
            let h = Send((net, s));
            std::thread::spawn(move || {
                let h = h;
                let (net, s) = h.0;
                let mut ev = [XioEvent {
                    token: 0,
                    events: 0,
                }; 8];
                let mut buf = [0u8; 64];
                while !stop.load(Ordering::Relaxed) {
                    let mut n = 0;
                    xio_net_poll(net, ev.as_mut_ptr(), ev.len(), 0, &mut n);
                    xio_read(s, buf.as_mut_ptr().cast(), buf.len(), &mut n);
                }
            })
        };
        // Where hung children stopped: the last step each reported.
        let mut hung = Vec::new();
        let mut wrong = Vec::new();
        // The lock is taken at a fork now and then: try until a child
        // hangs (the first fails the test), or many times.
        for _ in 0..1000 {
            let mut fds = [0i32; 2];
            assert_eq!(pipe(fds.as_mut_ptr()), 0);
            let pid = fork();
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                alarm(30);
                let step = |k: u8| {
                    write(fds[1], &k, 1);
                };
                let mut ev = [XioEvent {
                    token: 0,
                    events: 0,
                }; 8];
                let mut n = 0;
                let r = xio_net_poll(net, ev.as_mut_ptr(), ev.len(), 0, &mut n);
                if r != XIO_ERR_FORKED {
                    _exit(100 + r);
                }
                step(1);
                let mut buf = [0u8; 8];
                let r = xio_read(c, buf.as_mut_ptr().cast(), buf.len(), &mut n);
                if r != XIO_ERR_FORKED {
                    _exit(150 + r);
                }
                step(2);
                let closes: [&dyn Fn() -> i32; 4] = [
                    &|| xio_stream_close(c),
                    &|| xio_stream_close(s),
                    &|| xio_listener_close(l),
                    &|| xio_net_close(net),
                ];
                for (k, close) in closes.iter().enumerate() {
                    let r = close();
                    if r != XIO_OK {
                        _exit(200 + r);
                    }
                    step(3 + k as u8);
                }
                _exit(0);
            }
            close(fds[1]);
            let mut status = 0;
            assert_eq!(waitpid(pid, &mut status, 0), pid);
            let mut steps = [0u8; 16];
            let got = read(fds[0], steps.as_mut_ptr(), steps.len());
            close(fds[0]);
            let last = if got > 0 { steps[got as usize - 1] } else { 0 };
            // WIFSIGNALED: killed by the watchdog.
            if (status & 0x7f) != 0 {
                hung.push(last);
            } else if (status >> 8) & 0xff != 0 {
                wrong.push((status >> 8) & 0xff);
            }
            if !hung.is_empty() || !wrong.is_empty() {
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
        busy.join().unwrap();
        assert!(
            hung.is_empty(),
            "a child hung on the inherited net after step {hung:?} \
             (0: poll, 1: read, 2..: closing the stream, stream, listener, net)"
        );
        assert!(wrong.is_empty(), "children's exit codes: {wrong:?}");
        assert_eq!(xio_stream_close(c), XIO_OK);
        assert_eq!(xio_stream_close(s), XIO_OK);
        assert_eq!(xio_listener_close(l), XIO_OK);
        assert_eq!(xio_net_close(net), XIO_OK);
    }
}

/// A stack that another thread of the parent owned at the fork is the
/// parent's too: in the child, calls on it fail with `XIO_ERR_FORKED`,
/// as the header says of inherited stacks, not `XIO_ERR_BUSY` (which
/// says to wait for a thread that does not exist in the child).
#[test]
fn a_stack_another_thread_owned_at_the_fork_says_forked_in_the_child() {
    let (_m, p) = manager("fork-owned-stack");
    // SAFETY: a live stack handle and valid out-parameters; the buffer is
    // freed by the thread that allocated it; the child calls only xio_
    // functions and exits with `_exit`.
    unsafe {
        let s = stack(&p);
        let (owned_tx, owned_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let h = Send(s);
        let owner = std::thread::spawn(move || {
            let h = h;
            let mut b = null_mut();
            // The first alloc makes this thread the stack's owner.
            assert_eq!(xio_alloc(h.0, 8, &mut b), XIO_OK);
            owned_tx.send(()).unwrap();
            done_rx.recv().unwrap();
            assert_eq!(xio_buf_free(b), XIO_OK);
            assert_eq!(xio_stack_release(h.0), XIO_OK);
        });
        owned_rx.recv().unwrap();
        let pid = fork();
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            alarm(30);
            let mut b = null_mut();
            let r = xio_alloc(s, 8, &mut b);
            // Nor can the child release it: no thread of its own owns it.
            let rel = xio_stack_release(s);
            _exit(if r == XIO_ERR_FORKED && rel != XIO_ERR_FORKED {
                100 + rel
            } else {
                r
            });
        }
        let mut status = 0;
        assert_eq!(waitpid(pid, &mut status, 0), pid);
        done_tx.send(()).unwrap();
        owner.join().unwrap();
        assert_eq!(status & 0x7f, 0, "the child was killed: {status:#x}");
        assert_eq!(
            (status >> 8) & 0xff,
            XIO_ERR_FORKED,
            "xio_alloc in the child (100 + code: xio_stack_release's)"
        );
        assert_eq!(xio_stack_close(s), XIO_OK);
    }
}

/// A buffer inherited across `fork()` is the parent's: a child that
/// attached stacks and a net of its own still cannot send it (the header:
/// calls that touch an inherited stack's pool fail with
/// `XIO_ERR_FORKED`). Sending it would hand a peer a buffer the parent
/// still holds, writes and frees: two owners of one pool buffer. (The
/// pool check let it through, as a buffer of the same pool.) Each child
/// is killed by `alarm` (the watchdog) if a call hangs.
#[test]
fn a_child_cannot_send_a_buffer_it_inherited() {
    let (_m, p) = manager("fork-send-buf");
    // SAFETY: live handles, valid out-parameters and NUL-terminated
    // strings throughout; the child calls only xio_ functions and exits
    // with `_exit`.
    unsafe {
        let a = stack(&p);
        let r = stack(&p);
        let r_addr = addr("10.9.6.1:80");
        assert_eq!(xio_stack_bind(r, r_addr.as_ptr()), XIO_OK);
        let mut b = null_mut();
        assert_eq!(xio_alloc(a, 8, &mut b), XIO_OK);
        assert_eq!(xio_buf_set_len(b, 8), XIO_OK);
        // Each way of sending, in a child of its own: 0 `xio_send`,
        // 1 `xio_send_burst`, 2 `xio_stream_send_buf`.
        for way in 0..3 {
            let pid = fork();
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                alarm(60);
                let r = match way {
                    0 | 1 => {
                        let c = stack(&p);
                        let mut peer = 0;
                        if xio_stack_connect(c, r_addr.as_ptr(), &mut peer) != XIO_OK {
                            _exit(100);
                        }
                        if way == 0 {
                            xio_send(c, peer, b)
                        } else {
                            let mut bufs = [b];
                            let mut sent = 0;
                            xio_send_burst(c, peer, bufs.as_mut_ptr(), 1, &mut sent)
                        }
                    }
                    _ => {
                        let mut net = null_mut();
                        if xio_net_attach(p.as_ptr(), &mut net) != XIO_OK {
                            _exit(101);
                        }
                        let (_l, c, _s) = connected(net, net, "10.9.6.2:80");
                        xio_stream_send_buf(c, b)
                    }
                };
                _exit(r);
            }
            let mut status = 0;
            assert_eq!(waitpid(pid, &mut status, 0), pid);
            assert_eq!(
                status & 0x7f,
                0,
                "way {way}: the child was killed: {status:#x}"
            );
            assert_eq!(
                (status >> 8) & 0xff,
                XIO_ERR_FORKED,
                "way {way} (0: xio_send, 1: xio_send_burst, 2: xio_stream_send_buf)"
            );
        }
        // Nothing reached the parent's receiver (a buffer would come
        // before the reset of the child's stack that sent it); the buffer
        // is still ours.
        let mut got = null_mut();
        let mut from = 0;
        let r_got = loop {
            match xio_recv(r, 0, &mut got, &mut from) {
                XIO_ERR_CONNECTION_RESET => continue,
                other => break other,
            }
        };
        assert_eq!(r_got, XIO_ERR_WOULD_BLOCK, "the child sent the buffer");
        assert_eq!(xio_buf_free(b), XIO_OK);
        assert_eq!(xio_stack_close(a), XIO_OK);
        assert_eq!(xio_stack_close(r), XIO_OK);
    }
}

/// A writable buffer inherited across `fork()` is the parent's memory
/// (the pool is shared, not copied on write): the child's `xio_buf_mut`
/// fails with `XIO_ERR_FORKED` instead of handing out a pointer through
/// which the child would rewrite the parent's buffer under it.
#[test]
fn a_child_cannot_write_a_buffer_it_inherited() {
    let (_m, p) = manager("fork-buf-mut");
    // SAFETY: a live stack and buffer, valid out-parameters; the child
    // calls only xio_ functions and exits with `_exit`.
    unsafe {
        let a = stack(&p);
        let mut b = null_mut();
        assert_eq!(xio_alloc(a, 8, &mut b), XIO_OK);
        let (mut data, mut cap) = (null_mut(), 0);
        assert_eq!(xio_buf_mut(b, &mut data, &mut cap), XIO_OK);
        std::ptr::copy_nonoverlapping(b"parent".as_ptr(), data, 6);
        assert_eq!(xio_buf_set_len(b, 6), XIO_OK);
        let pid = fork();
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            alarm(60);
            let (mut d, mut c) = (null_mut(), 0);
            let r = xio_buf_mut(b, &mut d, &mut c);
            if r == XIO_OK {
                std::ptr::copy_nonoverlapping(b"child!".as_ptr(), d, 6);
            }
            _exit(r);
        }
        let mut status = 0;
        assert_eq!(waitpid(pid, &mut status, 0), pid);
        assert_eq!(status & 0x7f, 0, "the child was killed: {status:#x}");
        assert_eq!((status >> 8) & 0xff, XIO_ERR_FORKED);
        let (mut d, mut len) = (std::ptr::null(), 0);
        assert_eq!(xio_buf_data(b, &mut d, &mut len), XIO_OK);
        assert_eq!(std::slice::from_raw_parts(d, len), b"parent");
        assert_eq!(xio_buf_free(b), XIO_OK);
        assert_eq!(xio_stack_close(a), XIO_OK);
    }
}

/// A received buffer inherited across `fork()` is the parent's memory
/// too: the child's `xio_buf_make_writable` fails with `XIO_ERR_FORKED`.
/// On a stream chunk that `xio_read` had taken bytes from, making it
/// writable moves the rest to the front of the buffer, and in the child
/// that rewrote the parent's received bytes under it (the pool is
/// shared, not copied on write).
#[test]
fn a_child_cannot_make_writable_a_buffer_it_inherited() {
    let (_m, p) = manager("fork-make-writable");
    // SAFETY: live handles, valid out-parameters and buffers of the
    // lengths given, NUL-terminated strings; the child calls only xio_
    // functions and exits with `_exit`.
    unsafe {
        let mut net = null_mut();
        assert_eq!(xio_net_attach(p.as_ptr(), &mut net), XIO_OK);
        let (l, c, s) = connected(net, net, "10.9.10.1:80");
        let mut n = 0;
        assert_eq!(xio_write(c, b"hello".as_ptr().cast(), 5, &mut n), XIO_OK);
        assert_eq!(n, 5);
        let mut two = [0u8; 2];
        assert_eq!(xio_read(s, two.as_mut_ptr().cast(), 2, &mut n), XIO_OK);
        assert_eq!(&two[..n], b"he");
        // The rest of the chunk, 2 bytes into its buffer.
        let mut b = null_mut();
        assert_eq!(xio_stream_recv_buf(s, &mut b), XIO_OK);
        assert!(!b.is_null());
        let pid = fork();
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            alarm(60);
            _exit(xio_buf_make_writable(b));
        }
        let mut status = 0;
        assert_eq!(waitpid(pid, &mut status, 0), pid);
        assert_eq!(status & 0x7f, 0, "the child was killed: {status:#x}");
        let (mut d, mut len) = (std::ptr::null(), 0);
        assert_eq!(xio_buf_data(b, &mut d, &mut len), XIO_OK);
        assert_eq!(
            std::slice::from_raw_parts(d, len),
            b"llo",
            "the child rewrote the parent's buffer"
        );
        assert_eq!((status >> 8) & 0xff, XIO_ERR_FORKED);
        assert_eq!(xio_buf_free(b), XIO_OK);
        assert_eq!(xio_stream_close(c), XIO_OK);
        assert_eq!(xio_stream_close(s), XIO_OK);
        assert_eq!(xio_listener_close(l), XIO_OK);
        assert_eq!(xio_net_close(net), XIO_OK);
    }
}

/// A receive on a stack inherited across `fork()` fails with
/// `XIO_ERR_FORKED`, as the header says, even when a burst of the parent
/// left a notice for the next receive call: the child is not the process
/// the notice concerns. (The child's first receive reported the parent's
/// `XIO_ERR_CONNECTION_RESET` instead.)
#[test]
fn a_childs_receive_on_an_inherited_stack_says_forked_not_the_parents_notice() {
    let (_m, p) = manager("fork-deferred");
    // SAFETY: live handles from `stack`, valid out-parameters and
    // NUL-terminated strings throughout; every received buffer is freed;
    // the child calls only xio_ functions and exits with `_exit`.
    unsafe {
        let (rx, watcher, _) = two_buffers_then_a_reset(&p, 12);
        let (mut b, mut from) = (null_mut(), 0);
        let mut bufs = [null_mut(); 16];
        let mut n = 0;
        let r = xio_recv_burst(rx, 0, bufs.as_mut_ptr(), null_mut(), 16, &mut n);
        assert_eq!(r, XIO_OK);
        assert_eq!(n, 2, "the burst takes both buffers and ends on the reset");
        for b in &bufs[..n] {
            assert_eq!(xio_buf_free(*b), XIO_OK);
        }
        // Each receive call, in a child of its own: 0 `xio_recv`,
        // 1 `xio_recv_burst`.
        for way in 0..2 {
            let pid = fork();
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                alarm(60);
                let r = if way == 0 {
                    xio_recv(rx, 0, &mut b, &mut from)
                } else {
                    xio_recv_burst(rx, 0, bufs.as_mut_ptr(), null_mut(), 16, &mut n)
                };
                _exit(r);
            }
            let mut status = 0;
            assert_eq!(waitpid(pid, &mut status, 0), pid);
            assert_eq!(
                status & 0x7f,
                0,
                "way {way}: the child was killed: {status:#x}"
            );
            assert_eq!(
                (status >> 8) & 0xff,
                XIO_ERR_FORKED,
                "way {way} (0: xio_recv, 1: xio_recv_burst)"
            );
        }
        // The parent still has its notice.
        assert_eq!(xio_recv(rx, 0, &mut b, &mut from), XIO_ERR_CONNECTION_RESET);
        for s in [rx, watcher] {
            assert_eq!(xio_stack_close(s), XIO_OK);
        }
    }
}

/// A pool with no stack slot or channel slot left refuses the attach or
/// the connect with `XIO_ERR_NO_SPACE`, a condition that passes once
/// others leave, not with `XIO_ERR_PROTOCOL`, which the header keeps for
/// a peer or manager that broke the protocol.
#[test]
fn a_full_pool_is_no_space_not_a_protocol_error() {
    let pool = xio_core::prelude::PoolConfig {
        max_stacks: 3,
        max_channels: 1,
        ..Default::default()
    };
    let (_m, p) = manager_with("full-pool", pool);
    // SAFETY: live handles, valid out-parameters and NUL-terminated
    // strings throughout.
    unsafe {
        let (a, b, c) = (stack(&p), stack(&p), stack(&p));
        let mut d = null_mut();
        assert_eq!(
            xio_stack_attach(p.as_ptr(), &mut d),
            XIO_ERR_NO_SPACE,
            "a fourth stack: {:?}",
            std::ffi::CStr::from_ptr(xio_last_error())
        );
        assert!(d.is_null());
        let (a_addr, b_addr) = (addr("10.9.3.1:80"), addr("10.9.3.2:80"));
        assert_eq!(xio_stack_bind(a, a_addr.as_ptr()), XIO_OK);
        assert_eq!(xio_stack_bind(b, b_addr.as_ptr()), XIO_OK);
        let mut peer = 0;
        assert_eq!(xio_stack_connect(c, a_addr.as_ptr(), &mut peer), XIO_OK);
        assert_eq!(
            xio_stack_connect(c, b_addr.as_ptr(), &mut peer),
            XIO_ERR_NO_SPACE,
            "a second channel: {:?}",
            std::ffi::CStr::from_ptr(xio_last_error())
        );
        for s in [a, b, c] {
            assert_eq!(xio_stack_close(s), XIO_OK);
        }
    }
}

/// A connect to an address another process binds, refused because that
/// process does not read its control socket (stopped, stuck), returns
/// `XIO_ERR_PEER_BUSY`, not `XIO_ERR_CONNECTION_REFUSED`: a C program
/// that dials TCP when no X-IO service binds the address (what the
/// refusal means) must not take a service that is there for one that is
/// not, as xio-hyper's TCP fallback does not.
#[test]
fn a_connect_to_a_stack_that_does_not_read_is_peer_busy_not_refused() {
    use std::os::fd::AsFd;
    use xio_core::ctrl;
    use xio_core::proto::Msg;
    raise_fd_limit();
    let (mgr, p) = manager_with(
        "peer-busy",
        xio_core::prelude::PoolConfig {
            classes: vec![(2 << 10, 256)],
            max_stacks: 300,
            max_channels: 300,
            ring_capacity: 16,
            quotas: Vec::new(),
        },
    );
    let prefix = p.to_str().unwrap();
    let a = "10.9.5.1:80";
    // A raw stack that binds `a`, then stops reading its socket.
    let raw = || {
        let s = ctrl::connect(&xio_core::paths::socket_path(prefix)).unwrap();
        let hello = Msg::Hello {
            pid: 1,
            name: "deaf".into(),
        };
        ctrl::send(s.as_fd(), &hello, &[]).unwrap();
        let Msg::Welcome { stack_id, .. } = ctrl::recv(s.as_fd(), false).unwrap().0 else {
            panic!("no welcome");
        };
        (s, stack_id)
    };
    let (deaf, id) = raw();
    let bind = Msg::Bind {
        addr: a.parse().unwrap(),
    };
    ctrl::send(deaf.as_fd(), &bind, &[]).unwrap();
    assert!(matches!(
        ctrl::recv(deaf.as_fd(), false).unwrap().0,
        Msg::Ok
    ));
    // Status requests it does not read, until the manager queues replies.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let queued = || {
        let s = mgr.snapshot();
        s.stacks.iter().find(|s| s.id == id).map_or(0, |s| s.queued)
    };
    while queued() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "watchdog: never queued"
        );
        while ctrl::send_nowait(deaf.as_fd(), &Msg::Status, &[]).is_ok() {}
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    // Peers' new channels fill what the manager may hold for it, until it
    // refuses.
    let mut peers = Vec::new();
    loop {
        assert!(peers.len() < 290, "connections were never refused");
        let (s, _) = raw();
        let connect = Msg::Connect {
            addr: a.parse().unwrap(),
        };
        ctrl::send(s.as_fd(), &connect, &[]).unwrap();
        match ctrl::recv(s.as_fd(), false).unwrap().0 {
            Msg::Connected { .. } => peers.push(s),
            Msg::Error { .. } => break,
            other => panic!("connect {}: {other:?}", peers.len()),
        }
    }
    let a = addr(a);
    // SAFETY: live handles, valid out-parameters and NUL-terminated
    // strings throughout.
    unsafe {
        let s = stack(&p);
        let mut peer = 0;
        let r = xio_stack_connect(s, a.as_ptr(), &mut peer);
        let msg = std::ffi::CStr::from_ptr(xio_last_error()).to_string_lossy();
        assert_eq!(r, XIO_ERR_PEER_BUSY, "xio_stack_connect: {msg}");
        assert!(msg.contains("not reading its control socket"), "{msg}");
        assert_eq!(xio_stack_close(s), XIO_OK);
        let mut net = null_mut();
        assert_eq!(xio_net_attach(p.as_ptr(), &mut net), XIO_OK);
        let mut c = null_mut();
        let r = xio_dial(net, a.as_ptr(), &mut c);
        let msg = std::ffi::CStr::from_ptr(xio_last_error()).to_string_lossy();
        assert_eq!(r, XIO_ERR_PEER_BUSY, "xio_dial: {msg}");
        assert!(c.is_null());
        assert_eq!(xio_net_close(net), XIO_OK);
    }
    drop((deaf, peers));
}

/// Enough fds for a few hundred stacks in this process (with its
/// manager's share of them): a soft limit of 1024 is common.
fn raise_fd_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let lim = getrlimit(Resource::Nofile);
    let want = lim.maximum.map_or(1 << 16, |h| h.min(1 << 16));
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(want.max(lim.current.unwrap_or(0))),
            maximum: lim.maximum,
        },
    );
}

/// A closed stream's readiness not yet returned by `xio_net_poll` is not
/// returned after the close, as `epoll_wait` reports nothing for a
/// closed fd: its token may be a pointer the program freed with the
/// stream. (The close itself used to queue a readable event, under the
/// program's token, for the bytes still unread.)
#[test]
fn a_closed_streams_token_is_not_reported_by_a_later_poll() {
    let (_m, p) = manager("closed-token");
    // SAFETY: live handles, valid out-parameters and buffers of the
    // lengths given, NUL-terminated strings throughout.
    unsafe {
        let mut net = null_mut();
        assert_eq!(xio_net_attach(p.as_ptr(), &mut net), XIO_OK);
        let mut net2 = null_mut();
        assert_eq!(xio_net_attach(p.as_ptr(), &mut net2), XIO_OK);
        let a = addr("10.9.2.1:80");
        let mut l = null_mut();
        assert_eq!(xio_listen(net, a.as_ptr(), &mut l), XIO_OK);
        let mut events = [XioEvent {
            token: 0,
            events: 0,
        }; 64];
        let mut n = 0;
        for (dialer, tok) in [(net, 0xdead_0001u64), (net2, 0xdead_0002)] {
            let mut c = null_mut();
            assert_eq!(xio_dial(dialer, a.as_ptr(), &mut c), XIO_OK);
            let mut s = null_mut();
            assert_eq!(xio_accept(l, &mut s), XIO_OK);
            assert_eq!(xio_stream_set_token(s, tok), XIO_OK);
            assert_eq!(xio_stream_set_nonblocking(s, 1), XIO_OK);
            // From now on readiness is tracked; take what is there.
            assert_eq!(
                xio_net_poll(net, events.as_mut_ptr(), 64, 0, &mut n),
                XIO_OK
            );
            let mut k = 0;
            assert_eq!(xio_write(c, b"x".as_ptr().cast(), 1, &mut k), XIO_OK);
            assert_eq!(k, 1);
            // Unread bytes in, not yet polled: closed.
            assert_eq!(xio_stream_close(s), XIO_OK);
            for _ in 0..3 {
                assert_eq!(
                    xio_net_poll(net, events.as_mut_ptr(), 64, 10, &mut n),
                    XIO_OK
                );
                for e in &events[..n] {
                    assert_ne!(e.token, tok, "an event of a closed stream");
                }
            }
            assert_eq!(xio_stream_close(c), XIO_OK);
        }
        assert_eq!(xio_listener_close(l), XIO_OK);
        assert_eq!(xio_net_close(net2), XIO_OK);
        assert_eq!(xio_net_close(net), XIO_OK);
    }
}

/// A closed listener's accept readiness not yet returned by
/// `xio_net_poll` is not returned after the close, as for a closed
/// stream (and a closed fd under `epoll`).
#[test]
fn a_closed_listeners_token_is_not_reported_by_a_later_poll() {
    let (_m, p) = manager("closed-listener");
    // SAFETY: live handles, valid out-parameters, NUL-terminated strings.
    unsafe {
        let mut net = null_mut();
        assert_eq!(xio_net_attach(p.as_ptr(), &mut net), XIO_OK);
        let a = addr("10.9.5.1:80");
        let mut l = null_mut();
        assert_eq!(xio_listen(net, a.as_ptr(), &mut l), XIO_OK);
        let mut tok = 0;
        assert_eq!(xio_listener_token(l, &mut tok), XIO_OK);
        let mut events = [XioEvent {
            token: 0,
            events: 0,
        }; 64];
        let mut n = 0;
        // From now on readiness is tracked.
        assert_eq!(
            xio_net_poll(net, events.as_mut_ptr(), 64, 0, &mut n),
            XIO_OK
        );
        let mut c = null_mut();
        assert_eq!(xio_dial(net, a.as_ptr(), &mut c), XIO_OK);
        // A connection waits to be accepted, not yet polled: closed.
        assert_eq!(xio_listener_close(l), XIO_OK);
        for _ in 0..3 {
            assert_eq!(
                xio_net_poll(net, events.as_mut_ptr(), 64, 10, &mut n),
                XIO_OK
            );
            for e in &events[..n] {
                assert_ne!(e.token, tok, "an event of a closed listener");
            }
        }
        assert_eq!(xio_stream_close(c), XIO_OK);
        assert_eq!(xio_net_close(net), XIO_OK);
    }
}

/// Polls `net` without waiting until its fd (`xio_net_fd`) is quiet, as
/// an event loop does before it sleeps on the fd; returns the events
/// seen meanwhile.
///
/// # Safety
/// `net` is a live net handle and `fd` its `xio_net_fd`.
unsafe fn poll_until_quiet(net: *mut XioNet, fd: i32) -> Vec<XioEvent> {
    let mut seen = Vec::new();
    let mut events = [XioEvent {
        token: 0,
        events: 0,
    }; 64];
    // A watchdog, not a bound: one or two polls quiet it.
    for _ in 0..10_000 {
        let mut n = 0;
        // SAFETY: per this function's contract; 64 events of room.
        let r = unsafe { xio_net_poll(net, events.as_mut_ptr(), 64, 0, &mut n) };
        assert_eq!(r, XIO_OK);
        seen.extend_from_slice(&events[..n]);
        if !readable_now(fd) {
            return seen;
        }
    }
    panic!("the net's fd never went quiet");
}

/// An event loop asleep on `xio_net_fd` is woken by what a connection
/// within its own net makes ready, as epoll is by a socket pair of one
/// process: another thread's dial to the loop's listener and its write
/// on that connection, and the window the loop's own read gives back to
/// its writer. Those readinesses came from no ring, so nothing wrote the
/// doorbell: the loop slept on with an accept, data or room waiting in
/// `xio_net_poll` (a process-wide net, `xio_net_attach(NULL)`, shared by
/// the loop and a client library in the same process, does this).
#[test]
fn an_event_loop_asleep_on_the_fd_hears_its_own_nets_connections() {
    let (_m, p) = manager("own-net-fd");
    // SAFETY: live handles, valid out-parameters and buffers of the
    // lengths given, NUL-terminated strings throughout.
    unsafe {
        let mut net = null_mut();
        assert_eq!(xio_net_attach(p.as_ptr(), &mut net), XIO_OK);
        let a = addr("10.9.6.1:80");
        let mut l = null_mut();
        assert_eq!(xio_listen(net, a.as_ptr(), &mut l), XIO_OK);
        assert_eq!(xio_listener_set_nonblocking(l, 1), XIO_OK);
        let mut ltok = 0;
        assert_eq!(xio_listener_token(l, &mut ltok), XIO_OK);
        let mut fd = -1;
        assert_eq!(xio_net_fd(net, &mut fd), XIO_OK);
        poll_until_quiet(net, fd);

        // Another thread dials the loop's listener.
        let (h, a2) = (Send(net), a.clone());
        let c = std::thread::spawn(move || {
            let h = h;
            let mut c = null_mut();
            assert_eq!(xio_dial(h.0, a2.as_ptr(), &mut c), XIO_OK);
            Send(c)
        })
        .join()
        .unwrap()
        .0;
        assert!(readable_now(fd), "the dial left the fd quiet");
        let seen = poll_until_quiet(net, fd);
        assert!(
            seen.iter()
                .any(|e| e.token == ltok && e.events & XIO_EVENT_ACCEPT != 0),
            "{seen:?}"
        );
        let mut s = null_mut();
        assert_eq!(xio_accept(l, &mut s), XIO_OK);
        assert_eq!(xio_stream_set_nonblocking(s, 1), XIO_OK);
        assert_eq!(xio_stream_set_token(s, 11), XIO_OK);
        poll_until_quiet(net, fd);

        // Another thread writes to the loop's stream.
        let h = Send(c);
        std::thread::spawn(move || {
            let h = h;
            let mut k = 0;
            assert_eq!(xio_write(h.0, b"ping".as_ptr().cast(), 4, &mut k), XIO_OK);
            assert_eq!(k, 4);
        })
        .join()
        .unwrap();
        assert!(readable_now(fd), "the write left the fd quiet");
        let seen = poll_until_quiet(net, fd);
        assert!(
            seen.iter()
                .any(|e| e.token == 11 && e.events & XIO_EVENT_READABLE != 0),
            "{seen:?}"
        );
        let mut buf = vec![0u8; 1 << 16];
        let mut k = 0;
        assert_eq!(
            xio_read(s, buf.as_mut_ptr().cast(), buf.len(), &mut k),
            XIO_OK
        );
        assert_eq!(&buf[..k], b"ping");

        // The loop writes until the window is full, then its own read of
        // the other end gives the window back.
        let big = vec![7u8; 1 << 16];
        let mut sent = 0;
        loop {
            let r = xio_write(s, big.as_ptr().cast(), big.len(), &mut k);
            if r == XIO_ERR_WOULD_BLOCK {
                break;
            }
            assert_eq!(r, XIO_OK);
            sent += k;
        }
        poll_until_quiet(net, fd);
        assert_eq!(xio_stream_set_nonblocking(c, 1), XIO_OK);
        let mut got = 0;
        while got < sent {
            assert_eq!(
                xio_read(c, buf.as_mut_ptr().cast(), buf.len(), &mut k),
                XIO_OK
            );
            got += k;
        }
        assert!(readable_now(fd), "the window came back with the fd quiet");
        let seen = poll_until_quiet(net, fd);
        assert!(
            seen.iter()
                .any(|e| e.token == 11 && e.events & XIO_EVENT_WRITABLE != 0),
            "{seen:?}"
        );
        assert_eq!(xio_write(s, big.as_ptr().cast(), 1, &mut k), XIO_OK);

        for x in [c, s] {
            assert_eq!(xio_stream_close(x), XIO_OK);
        }
        assert_eq!(xio_listener_close(l), XIO_OK);
        assert_eq!(xio_net_close(net), XIO_OK);
    }
}

/// 64 connections from `peer` to `net`'s listener, closed on `net`'s
/// side while `peer` reads nothing: with 16-slot rings their FINs wait
/// behind `peer`'s full ring. One more connection (`bell`) stays open,
/// to wake `net`'s event loop when the test is done.
struct FinsBehindFullRing {
    _manager: ManagerHandle,
    net: *mut XioNet,
    peer: *mut XioNet,
    l: *mut XioListener,
    /// `peer`'s ends of the closed connections.
    theirs: Vec<*mut XioStream>,
    bell: (*mut XioStream, *mut XioStream),
    /// `net`'s fd (`xio_net_fd`).
    fd: i32,
}

impl FinsBehindFullRing {
    /// # Safety
    /// Calls the C ABI with live handles it made itself.
    unsafe fn new(test: &str, at: &str) -> Self {
        // Small rings: 64 FINs do not fit.
        let pool = xio_core::prelude::PoolConfig {
            ring_capacity: 16,
            ..Default::default()
        };
        let (manager, p) = manager_with(test, pool);
        // SAFETY: valid out-parameters, NUL-terminated strings, live
        // handles made here.
        unsafe {
            let mut net = null_mut();
            assert_eq!(xio_net_attach(p.as_ptr(), &mut net), XIO_OK);
            let mut peer = null_mut();
            assert_eq!(xio_net_attach(p.as_ptr(), &mut peer), XIO_OK);
            let a = addr(at);
            let mut l = null_mut();
            assert_eq!(xio_listen(net, a.as_ptr(), &mut l), XIO_OK);
            let mut theirs = Vec::new();
            let mut ours = Vec::new();
            for _ in 0..64 {
                let mut c = null_mut();
                assert_eq!(xio_dial(peer, a.as_ptr(), &mut c), XIO_OK);
                let mut s = null_mut();
                assert_eq!(xio_accept(l, &mut s), XIO_OK);
                assert_eq!(xio_stream_set_nonblocking(s, 1), XIO_OK);
                // The watchdog: a read that never ends times out instead.
                assert_eq!(xio_stream_set_timeouts(c, WATCHDOG_MS, 0), XIO_OK);
                theirs.push(c);
                ours.push(s);
            }
            let (mut bell_c, mut bell_s) = (null_mut(), null_mut());
            assert_eq!(xio_dial(peer, a.as_ptr(), &mut bell_c), XIO_OK);
            assert_eq!(xio_accept(l, &mut bell_s), XIO_OK);
            let mut fd = -1;
            assert_eq!(xio_net_fd(net, &mut fd), XIO_OK);
            poll_until_quiet(net, fd);
            // The peer's net is idle: its ring fills with our FINs.
            for s in ours {
                assert_eq!(xio_stream_close(s), XIO_OK);
            }
            FinsBehindFullRing {
                _manager: manager,
                net,
                peer,
                l,
                theirs,
                bell: (bell_c, bell_s),
                fd,
            }
        }
    }

    /// The peer reads its streams now, draining its ring: each must end
    /// (its FIN came). It sends nothing meanwhile, which would wake
    /// `net`'s loop.
    ///
    /// # Safety
    /// As [`FinsBehindFullRing::new`].
    unsafe fn peer_reads_every_end(&mut self) {
        let mut buf = [0u8; 8];
        // SAFETY: live stream handles; `buf` and `k` valid for writes.
        unsafe {
            for (i, c) in self.theirs.iter().enumerate() {
                let mut k = usize::MAX;
                let r = xio_read(*c, buf.as_mut_ptr().cast(), buf.len(), &mut k);
                assert_eq!(
                    (r, k),
                    (XIO_OK, 0),
                    "stream {i}: no end of stream (a FIN still queued?)"
                );
            }
            for c in self.theirs.drain(..) {
                assert_eq!(xio_stream_close(c), XIO_OK);
            }
        }
    }

    /// Wakes `event_loop`, told to stop already, joins it and closes
    /// everything.
    ///
    /// # Safety
    /// As [`FinsBehindFullRing::new`].
    unsafe fn wake_join_and_close(self, event_loop: std::thread::JoinHandle<()>) {
        let (bell_c, bell_s) = self.bell;
        // SAFETY: live handles; `k` valid for a write.
        unsafe {
            // Non-blocking: the loop may have seen its stop flag and gone
            // already, leaving the ring toward it full of what the peer's
            // reads and closes sent (a blocking write would wait for room
            // for good); a full ring keeps its fd readable anyway.
            assert_eq!(xio_stream_set_nonblocking(bell_c, 1), XIO_OK);
            let mut k = 0;
            let r = xio_write(bell_c, b"x".as_ptr().cast(), 1, &mut k);
            assert!(r == XIO_OK || r == XIO_ERR_WOULD_BLOCK, "{r}");
            event_loop.join().unwrap();
            for s in [bell_c, bell_s] {
                assert_eq!(xio_stream_close(s), XIO_OK);
            }
            assert_eq!(xio_listener_close(self.l), XIO_OK);
            assert_eq!(xio_net_close(self.peer), XIO_OK);
            assert_eq!(xio_net_close(self.net), XIO_OK);
        }
    }
}

/// An event loop that closes connections faster than their peer drains
/// its ring has FINs queued behind the full ring. Nothing rings for the
/// room the peer makes later, and the loop has no write of its own
/// waiting (a write of its own sets the fd's timer): asleep on
/// `xio_net_fd` with no timeout, it kept them queued for good, and the
/// peer read on for ever instead of reaching the end of its streams.
/// `xio_net_poll` keeps the fd readable while something waits for ring
/// space, so the loop comes back and sends it.
#[test]
fn a_loop_asleep_on_the_fd_sends_the_fins_a_full_ring_held_back() {
    use std::sync::atomic::{AtomicBool, Ordering};
    // SAFETY: live handles, valid out-parameters and buffers of the
    // lengths given; the loop thread uses the net, which any thread may.
    unsafe {
        let mut t = FinsBehindFullRing::new("fins-behind-full-ring", "10.9.7.1:80");
        let fd = t.fd;
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let (h, stop2) = (Send(t.net), stop.clone());
        let event_loop = std::thread::spawn(move || {
            let h = h;
            let mut events = [XioEvent {
                token: 0,
                events: 0,
            }; 64];
            while !stop2.load(Ordering::Relaxed) {
                let mut n = 0;
                assert_eq!(
                    xio_net_poll(h.0, events.as_mut_ptr(), 64, 0, &mut n),
                    XIO_OK
                );
                // Asleep until the fd is readable (the timeout is only
                // the watchdog).
                let mut pfd = PollFd {
                    fd,
                    events: 1,
                    revents: 0,
                };
                poll(&mut pfd, 1, WATCHDOG_MS);
            }
        });
        t.peer_reads_every_end();
        stop.store(true, Ordering::Relaxed);
        t.wake_join_and_close(event_loop);
    }
}

/// What the calling thread has run on a CPU so far.
fn thread_cpu_time() -> std::time::Duration {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: a valid `timespec` to write.
    let r = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(r, 0);
    std::time::Duration::new(ts.sec as u64, ts.nsec as u32)
}

/// An event loop whose FINs wait behind the full ring of a peer that
/// does not run (stopped, or as here idle: it drains nothing until it
/// reads) sleeps on `xio_net_fd` meanwhile, instead of finding the fd
/// readable at every turn and burning a core for as long as the peer
/// stays away; and once the peer reads, the FINs still reach it without
/// the loop being woken by anything else. (Only CPU use and the number
/// of wake-ups are bounded, and loosely: a spinning loop uses all it
/// gets.)
#[test]
fn a_loop_waiting_on_a_stopped_peers_ring_sleeps_then_sends() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};
    // SAFETY: live handles, valid out-parameters and buffers of the
    // lengths given; the loop thread uses the net, which any thread may.
    unsafe {
        let mut t = FinsBehindFullRing::new("stopped-peer-sleep", "10.9.8.1:80");
        let fd = t.fd;
        let stop = Arc::new(AtomicBool::new(false));
        // (CPU used, time passed, turns of the loop) over the first second.
        let measured = Arc::new(Mutex::new(None));
        let (h, stop2, measured2) = (Send(t.net), stop.clone(), measured.clone());
        let event_loop = std::thread::spawn(move || {
            let h = h;
            let mut events = [XioEvent {
                token: 0,
                events: 0,
            }; 64];
            let (cpu0, t0) = (thread_cpu_time(), Instant::now());
            let mut turns = 0u64;
            while !stop2.load(Ordering::Relaxed) {
                let mut n = 0;
                assert_eq!(
                    xio_net_poll(h.0, events.as_mut_ptr(), 64, 0, &mut n),
                    XIO_OK
                );
                turns += 1;
                let mut m = measured2.lock().unwrap();
                if m.is_none() && t0.elapsed() >= Duration::from_secs(1) {
                    *m = Some((thread_cpu_time() - cpu0, t0.elapsed(), turns));
                }
                drop(m);
                // Asleep until the fd is readable (the timeout is only
                // the watchdog).
                let mut pfd = PollFd {
                    fd,
                    events: 1,
                    revents: 0,
                };
                poll(&mut pfd, 1, WATCHDOG_MS);
            }
        });
        // The peer stays away for a second (a wait for the measurement,
        // not a bound on anything).
        let measured = loop {
            if let Some(m) = *measured.lock().unwrap() {
                break m;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        // Then it reads its streams: each ends.
        t.peer_reads_every_end();
        stop.store(true, Ordering::Relaxed);
        let (cpu, passed, turns) = measured;
        assert!(
            cpu < passed / 2,
            "the loop used {cpu:?} of CPU in {passed:?} ({turns} turns) \
             while the peer did not run"
        );
        // On a busy machine a spinning loop may get less than half a
        // core; it still turns tens of thousands of times a second, where
        // a sleeping one comes back about once a millisecond at most.
        let most = 5 * passed.as_millis() as u64 + 100;
        assert!(
            turns <= most,
            "the loop came back {turns} times in {passed:?} ({cpu:?} of CPU) \
             while the peer did not run"
        );
        t.wake_join_and_close(event_loop);
    }
}

/// A hang guard for a thread asleep in `poll(2)` without a timeout: an fd
/// that becomes readable after [`WATCHDOG_MS`] unless the guard is
/// dropped first. Poll it alongside the fd under test.
struct Watchdog {
    fd: std::os::unix::net::UnixStream,
    _cancel: std::sync::mpsc::Sender<()>,
}

impl Watchdog {
    fn new() -> Self {
        use std::io::Write;
        let (fd, mut bark) = std::os::unix::net::UnixStream::pair().unwrap();
        let (cancel, cancelled) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            let limit = std::time::Duration::from_millis(WATCHDOG_MS as u64);
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = cancelled.recv_timeout(limit) {
                let _ = bark.write_all(b"!");
            }
        });
        Self {
            fd,
            _cancel: cancel,
        }
    }
}

/// What an event loop that sleeps on `xio_net_fd` alone does after a
/// non-blocking call on the stream `token` said `XIO_ERR_WOULD_BLOCK`:
/// sleeps in `poll(2)` with no timeout, calls `xio_net_poll` only when
/// the fd is readable, and returns once an event says the stream is
/// writable; the `xio_net_poll` calls it made. Panics if the watchdog
/// fires first (the fd never became readable for it).
///
/// # Safety
/// `net` is a live net handle whose `xio_net_fd` is `fd`.
unsafe fn sleep_on_fd_until_writable(net: *mut XioNet, fd: i32, token: u64, dog: &Watchdog) -> u64 {
    let mut turns = 0;
    use std::os::fd::AsRawFd;
    let mut events = [XioEvent {
        token: 0,
        events: 0,
    }; 64];
    loop {
        let mut fds = [
            PollFd {
                fd,
                events: 1,
                revents: 0,
            },
            PollFd {
                fd: dog.fd.as_raw_fd(),
                events: 1,
                revents: 0,
            },
        ];
        // SAFETY: two valid `pollfd`s.
        let r = unsafe { poll(fds.as_mut_ptr(), 2, -1) };
        assert!(r > 0, "poll failed");
        assert_eq!(
            fds[1].revents, 0,
            "watchdog: the net's fd never became readable for the blocked write"
        );
        let mut n = 0;
        // SAFETY: per this function's contract; 64 events of room.
        let r = unsafe { xio_net_poll(net, events.as_mut_ptr(), 64, 0, &mut n) };
        assert_eq!(r, XIO_OK);
        turns += 1;
        if events[..n]
            .iter()
            .any(|e| e.token == token && e.events & XIO_EVENT_WRITABLE != 0)
        {
            return turns;
        }
    }
}

/// Two nets of pool `p`, `peer` dialled to `net`'s listener on `at`:
/// the dialling end `c` (reads time out after the watchdog's time), the
/// accepted end `s` (non-blocking, `token` set), and `net`'s fd, polled
/// until quiet. Returns `(net, peer, l, c, s, fd)`.
///
/// # Safety
/// Calls the C ABI with handles it made itself.
unsafe fn one_connection_polled_by_fd(
    p: &CString,
    at: &str,
    token: u64,
) -> (
    *mut XioNet,
    *mut XioNet,
    *mut XioListener,
    *mut XioStream,
    *mut XioStream,
    i32,
) {
    // SAFETY: valid out-parameters, NUL-terminated strings, live handles
    // made here.
    unsafe {
        let mut net = null_mut();
        assert_eq!(xio_net_attach(p.as_ptr(), &mut net), XIO_OK);
        let mut peer = null_mut();
        assert_eq!(xio_net_attach(p.as_ptr(), &mut peer), XIO_OK);
        let a = addr(at);
        let mut l = null_mut();
        assert_eq!(xio_listen(net, a.as_ptr(), &mut l), XIO_OK);
        let mut c = null_mut();
        assert_eq!(xio_dial(peer, a.as_ptr(), &mut c), XIO_OK);
        assert_eq!(xio_stream_set_timeouts(c, WATCHDOG_MS, 0), XIO_OK);
        let mut s = null_mut();
        assert_eq!(xio_accept(l, &mut s), XIO_OK);
        assert_eq!(xio_stream_set_nonblocking(s, 1), XIO_OK);
        assert_eq!(xio_stream_set_token(s, token), XIO_OK);
        let mut fd = -1;
        assert_eq!(xio_net_fd(net, &mut fd), XIO_OK);
        poll_until_quiet(net, fd);
        (net, peer, l, c, s, fd)
    }
}

/// A write that met a peer's full ring is retried by a loop that sleeps on
/// `xio_net_fd` alone (no periodic `xio_net_poll`): once the peer reads,
/// the fd becomes readable for the write, which then goes through. While
/// the peer does not read, the loop is woken at most about once a
/// millisecond (a loose bound on wake-ups, not on time: a loop woken
/// every 50 us, or spinning, turns many times more).
#[test]
fn a_loop_asleep_on_the_fd_alone_retries_a_write_that_met_a_full_ring() {
    // Small rings: a few one-byte writes fill the peer's.
    let pool = xio_core::prelude::PoolConfig {
        ring_capacity: 16,
        ..Default::default()
    };
    let (_m, p) = manager_with("fd-alone-full-ring", pool);
    // SAFETY: live handles, valid out-parameters and buffers of the
    // lengths given, NUL-terminated strings; the loop thread uses the net
    // and a stream, which any thread may.
    unsafe {
        let (net, peer, l, c, s, fd) = one_connection_polled_by_fd(&p, "10.9.8.2:80", 7);
        let (blocked_tx, blocked) = std::sync::mpsc::channel();
        let h = Send((net, s));
        let event_loop = std::thread::spawn(move || {
            let h = h;
            let (net, s) = h.0;
            let dog = Watchdog::new();
            let mut k = 0;
            let mut sent = 0usize;
            // The peer does not read yet: its ring fills.
            let r = loop {
                let r = xio_write(s, b"x".as_ptr().cast(), 1, &mut k);
                if r != XIO_OK {
                    break r;
                }
                sent += 1;
            };
            assert_eq!(r, XIO_ERR_WOULD_BLOCK);
            let t0 = std::time::Instant::now();
            blocked_tx.send(sent).unwrap();
            let mut turns = 0;
            loop {
                turns += sleep_on_fd_until_writable(net, fd, 7, &dog);
                match xio_write(s, b"y".as_ptr().cast(), 1, &mut k) {
                    XIO_OK => break,
                    r => assert_eq!(r, XIO_ERR_WOULD_BLOCK),
                }
            }
            (turns, t0.elapsed())
        });
        let sent = blocked.recv().unwrap();
        // The peer stays away a while (a pause to count wake-ups over,
        // not a bound on anything).
        std::thread::sleep(std::time::Duration::from_millis(300));
        // The peer reads what filled its ring (making room, which rings
        // nobody), then the byte the loop wrote once it heard of the room.
        let mut got = vec![0u8; sent + 1];
        let mut at = 0;
        while at < got.len() {
            let mut k = 0;
            let r = xio_read(c, got[at..].as_mut_ptr().cast(), got.len() - at, &mut k);
            assert_eq!(r, XIO_OK);
            assert!(k > 0, "end of stream after {at} bytes");
            at += k;
            if at == sent {
                // Joined here: the loop's write went through.
                let (turns, passed) = event_loop.join().unwrap();
                let most = 5 * passed.as_millis() as u64 + 100;
                assert!(
                    turns <= most,
                    "the loop came back {turns} times in {passed:?} while the peer did not read"
                );
                break;
            }
        }
        let mut k = 0;
        assert_eq!(
            xio_read(c, got[sent..].as_mut_ptr().cast(), 1, &mut k),
            XIO_OK
        );
        assert_eq!(k, 1);
        assert!(got[..sent].iter().all(|&b| b == b'x'));
        assert_eq!(got[sent], b'y');
        for x in [c, s] {
            assert_eq!(xio_stream_close(x), XIO_OK);
        }
        assert_eq!(xio_listener_close(l), XIO_OK);
        assert_eq!(xio_net_close(peer), XIO_OK);
        assert_eq!(xio_net_close(net), XIO_OK);
    }
}

/// A write and a zero-copy alloc that met an empty pool are retried by a
/// loop that sleeps on `xio_net_fd` alone: once a buffer is freed, the fd
/// becomes readable for them and they go through.
#[test]
fn a_loop_asleep_on_the_fd_alone_retries_writes_that_met_an_empty_pool() {
    // No quota: one net may hold the whole class, as this test does.
    let pool = xio_core::prelude::PoolConfig {
        classes: vec![(2 << 10, 64)],
        quotas: vec![(2 << 10, 64)],
        ..Default::default()
    };
    let (_m, p) = manager_with("fd-alone-empty-pool", pool);
    // SAFETY: as in the test above; buffer handles are used by one thread.
    unsafe {
        let (net, peer, l, c, s, fd) = one_connection_polled_by_fd(&p, "10.9.8.3:80", 9);
        // Every buffer of the pool, held here.
        assert_eq!(xio_stream_set_nonblocking(c, 1), XIO_OK);
        let mut held = Vec::new();
        loop {
            let mut b = null_mut();
            match xio_stream_alloc(c, 1, &mut b) {
                XIO_OK => held.push(Send(b)),
                r => {
                    assert_eq!(r, XIO_ERR_WOULD_BLOCK);
                    break;
                }
            }
        }
        assert_eq!(xio_stream_set_nonblocking(c, 0), XIO_OK);
        let (blocked_tx, blocked) = std::sync::mpsc::channel();
        let h = Send((net, s));
        let event_loop = std::thread::spawn(move || {
            let h = h;
            let (net, s) = h.0;
            let dog = Watchdog::new();
            let mut k = 0;
            // A copying write, with no buffer to copy into.
            assert_eq!(
                xio_write(s, b"w".as_ptr().cast(), 1, &mut k),
                XIO_ERR_WOULD_BLOCK
            );
            blocked_tx.send(()).unwrap();
            loop {
                sleep_on_fd_until_writable(net, fd, 9, &dog);
                match xio_write(s, b"w".as_ptr().cast(), 1, &mut k) {
                    XIO_OK => break,
                    r => assert_eq!(r, XIO_ERR_WOULD_BLOCK),
                }
            }
            // A zero-copy send's buffer: the pool is empty again.
            let mut b = null_mut();
            assert_eq!(xio_stream_alloc(s, 1, &mut b), XIO_ERR_WOULD_BLOCK);
            blocked_tx.send(()).unwrap();
            loop {
                sleep_on_fd_until_writable(net, fd, 9, &dog);
                match xio_stream_alloc(s, 1, &mut b) {
                    XIO_OK => break,
                    r => assert_eq!(r, XIO_ERR_WOULD_BLOCK),
                }
            }
            let (mut data, mut cap) = (null_mut(), 0);
            assert_eq!(xio_buf_mut(b, &mut data, &mut cap), XIO_OK);
            *data = b'z';
            assert_eq!(xio_buf_set_len(b, 1), XIO_OK);
            assert_eq!(xio_stream_send_buf(s, b), XIO_OK);
        });
        // Each wait ends when a buffer is freed here (which rings nobody).
        for _ in 0..2 {
            blocked.recv().unwrap();
            assert_eq!(xio_buf_free(held.pop().unwrap().0), XIO_OK);
        }
        event_loop.join().unwrap();
        for b in held {
            assert_eq!(xio_buf_free(b.0), XIO_OK);
        }
        let mut got = [0u8; 2];
        let mut at = 0;
        while at < 2 {
            let mut k = 0;
            let r = xio_read(c, got[at..].as_mut_ptr().cast(), 2 - at, &mut k);
            assert_eq!(r, XIO_OK);
            assert!(k > 0, "end of stream");
            at += k;
        }
        assert_eq!(&got, b"wz");
        for x in [c, s] {
            assert_eq!(xio_stream_close(x), XIO_OK);
        }
        assert_eq!(xio_listener_close(l), XIO_OK);
        assert_eq!(xio_net_close(peer), XIO_OK);
        assert_eq!(xio_net_close(net), XIO_OK);
    }
}

/// The embedded manager through the ABI: spawned, seen by a net that
/// attaches (its stack, its buffers back once the net is closed), refused
/// a second time for the same prefix, and stopped.
#[test]
fn manager_spawn_stats_and_stop() {
    run_dir();
    let p = CString::new(format!("abi-mgr-{}", std::process::id())).unwrap();
    let mut m = null_mut();
    let mut again = null_mut();
    let mut st = XioManagerStats::default();
    // SAFETY: NUL-terminated prefixes, valid out-parameters, live handles
    // used by this thread alone, each closed once.
    unsafe {
        assert_eq!(xio_manager_spawn(p.as_ptr(), &mut m), XIO_OK);
        assert_eq!(
            xio_manager_spawn(p.as_ptr(), &mut again),
            XIO_ERR_MANAGER_RUNNING
        );
        assert!(again.is_null(), "no handle on failure");
        assert_eq!(xio_manager_get_stats(m, &mut st), XIO_OK);
        assert_eq!(st.stacks, 0);
        assert!(st.buffers_total > 0 && st.buffers_free == st.buffers_total);
        let mut net = null_mut();
        assert_eq!(xio_net_attach(p.as_ptr(), &mut net), XIO_OK);
        let (l, c, s) = connected(net, net, "10.77.0.1:80");
        let mut n = 0;
        assert_eq!(xio_write(c, b"held".as_ptr().cast(), 4, &mut n), XIO_OK);
        assert_eq!(xio_manager_get_stats(m, &mut st), XIO_OK);
        assert_eq!(st.stacks, 1);
        assert!(
            st.buffers_free < st.buffers_total,
            "the unread write holds one"
        );
        xio_stream_close(s);
        xio_stream_close(c);
        xio_listener_close(l);
        assert_eq!(xio_net_close(net), XIO_OK);
        // The stack leaves (and its buffers come back) in the manager's
        // time: wait for it (a watchdog, not a time bound).
        let mut looks = 0;
        loop {
            assert_eq!(xio_manager_get_stats(m, &mut st), XIO_OK);
            if st.stacks == 0 && st.buffers_free == st.buffers_total {
                break;
            }
            looks += 1;
            assert!(looks < WATCHDOG_MS, "{st:?}");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(xio_manager_stop(m), XIO_OK);
        assert_eq!(xio_manager_stop(null_mut()), XIO_OK);
        // Stopped: nothing to attach to, and the prefix is free again.
        let mut net = null_mut();
        assert_eq!(xio_net_attach(p.as_ptr(), &mut net), XIO_ERR_NO_MANAGER);
        assert_eq!(xio_manager_spawn(p.as_ptr(), &mut m), XIO_OK);
        assert_eq!(xio_manager_stop(m), XIO_OK);
    }
}

/// A loop that drives its net with a watch: while it watches, a write of
/// the peer shows in `xio_net_watch_look` and is collected by a poll with
/// timeout 0; a poll that would wait is refused within a watch; after
/// `xio_net_watch_end` the poll arms the fd again, which a later write
/// makes readable.
#[test]
fn a_watch_sees_arrivals_without_the_fd() {
    let (_m, p) = manager("watch");
    // SAFETY: live handles used as the header allows, each closed once;
    // valid out-parameters and buffers.
    unsafe {
        let (mut srv, mut cli) = (null_mut(), null_mut());
        assert_eq!(xio_net_attach(p.as_ptr(), &mut srv), XIO_OK);
        assert_eq!(xio_net_attach(p.as_ptr(), &mut cli), XIO_OK);
        let (l, c, s) = connected(srv, cli, "10.77.0.2:80");
        assert_eq!(xio_stream_set_nonblocking(s, 1), XIO_OK);
        let mut tok = 0;
        assert_eq!(xio_stream_token(s, &mut tok), XIO_OK);
        let mut evs = [XioEvent {
            token: 0,
            events: 0,
        }; 8];
        let mut n = 0;
        let mut fd = 0;
        assert_eq!(xio_net_fd(srv, &mut fd), XIO_OK);
        assert_eq!(xio_net_poll(srv, evs.as_mut_ptr(), 8, 0, &mut n), XIO_OK);
        let mut look = -1;
        assert_eq!(
            xio_net_watch_look(srv, &mut look),
            XIO_ERR_INVALID_ARGUMENT,
            "no watch yet"
        );
        let mut budget = 0;
        assert_eq!(xio_net_watch_begin(srv, &mut budget), XIO_OK);
        assert_eq!(xio_net_watch_begin(srv, &mut budget), XIO_ERR_BUSY);
        assert_eq!(
            xio_net_poll(srv, evs.as_mut_ptr(), 8, 10, &mut n),
            XIO_ERR_INVALID_ARGUMENT,
            "a waiting poll within a watch"
        );
        let mut w = 0;
        assert_eq!(xio_write(c, b"ping".as_ptr().cast(), 4, &mut w), XIO_OK);
        let mut looks = 0;
        loop {
            assert_eq!(xio_net_watch_look(srv, &mut look), XIO_OK);
            if look == 1 {
                break;
            }
            looks += 1;
            assert!(looks < 100_000_000, "the write never showed");
            std::hint::spin_loop();
        }
        assert_eq!(xio_net_poll(srv, evs.as_mut_ptr(), 8, 0, &mut n), XIO_OK);
        assert!(
            evs[..n]
                .iter()
                .any(|e| e.token == tok && e.events & XIO_EVENT_READABLE != 0),
            "{:?}",
            &evs[..n]
        );
        assert_eq!(xio_net_watch_look(srv, &mut look), XIO_OK);
        assert_eq!(look, 0, "collected");
        assert_eq!(xio_net_watch_end(srv, 1, 1000), XIO_OK);
        assert_eq!(xio_net_watch_end(srv, 0, 0), XIO_OK, "a no-op without one");
        let mut b = [0u8; 8];
        assert_eq!(xio_read(s, b.as_mut_ptr().cast(), 8, &mut w), XIO_OK);
        assert_eq!(&b[..w], b"ping");
        // Armed again by the poll: the next write makes the fd readable.
        assert_eq!(xio_net_poll(srv, evs.as_mut_ptr(), 8, 0, &mut n), XIO_OK);
        assert_eq!(xio_write(c, b"pong".as_ptr().cast(), 4, &mut w), XIO_OK);
        let mut pfd = [rustix::event::PollFd::from_borrowed_fd(
            std::os::fd::BorrowedFd::borrow_raw(fd),
            rustix::event::PollFlags::IN,
        )];
        let ready = rustix::event::poll(&mut pfd, None).unwrap();
        assert_eq!(ready, 1);
        xio_stream_close(s);
        xio_stream_close(c);
        xio_listener_close(l);
        xio_net_close(cli);
        xio_net_close(srv);
    }
}
