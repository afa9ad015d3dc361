//! xio-tokio under tokio: an embedded manager, two nets (two stacks, real
//! shared-memory channels between them) in the test process, and a real
//! child process where a test kills its peer.

#[path = "../../xio-core/tests/common/process_dir.rs"]
mod process_dir;

use std::future::Future;
use std::io::{self, Write};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use xio_core::manager::{Manager, ManagerHandle};
use xio_tokio::{Net, XioListener, XioStream};

/// Generous: a guard against hangs, not a performance bound.
const WATCHDOG: Duration = Duration::from_secs(120);

fn setup(test: &str) -> (ManagerHandle, String) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("XIO_CHILD_ROLE").is_none() {
            let dir = process_dir::process_dir("xio-tokio-test");
            std::env::set_var("XIO_RUN_DIR", &dir);
        }
    });
    let p = format!("tt-{test}-{}", std::process::id());
    let mgr = Manager::builder(&p).spawn().unwrap();
    (mgr, p)
}

fn rt(threads: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap()
}

fn stream_byte(seed: u64, i: u64) -> u8 {
    let x = (i / 8).wrapping_add(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let x = (x ^ (x >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    (x >> (8 * (i % 8))) as u8
}

/// A connection between two nets of pool `p` through a listener on
/// `addr`: the client's end and the server's (the listener is dropped;
/// the streams keep their nets).
async fn connected(p: &str, addr: &str) -> (XioStream, XioStream) {
    let srv = Net::attach(p).unwrap();
    let cli = Net::attach(p).unwrap();
    let l = XioListener::bind_with(&srv, addr).unwrap();
    let c = XioStream::connect_with(&cli, addr).await.unwrap();
    let (s, _) = l.accept().await.unwrap();
    (c, s)
}

/// Echoes the first 4 bytes of `s` (a child service's reply to the
/// test's ping).
async fn echo4(mut s: XioStream) {
    let mut b = [0u8; 4];
    if s.read_exact(&mut b).await.is_ok() {
        let _ = s.write_all(&b).await;
    }
}

async fn echo_server(l: XioListener) {
    loop {
        let Ok((mut s, _)) = l.accept().await else {
            return;
        };
        tokio::spawn(async move {
            let mut buf = vec![0u8; 64 << 10];
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
    }
}

/// One checksummed echo of `total` bytes with random write sizes, the
/// writer and the reader on the two owned halves.
async fn checked_echo(s: XioStream, seed: u64, total: u64) {
    let (mut r, mut w) = s.into_split();
    let writer = tokio::spawn(async move {
        let mut rng = seed | 1;
        let mut sent = 0u64;
        while sent < total {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let n = (1 + rng % 3000).min(total - sent);
            let chunk: Vec<u8> = (sent..sent + n).map(|i| stream_byte(seed, i)).collect();
            w.write_all(&chunk).await.unwrap();
            sent += n;
        }
        w.shutdown().await.unwrap();
    });
    let mut got = 0u64;
    let mut buf = vec![0u8; 5000];
    loop {
        let n = r.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        for (k, &b) in buf[..n].iter().enumerate() {
            assert_eq!(
                b,
                stream_byte(seed, got + k as u64),
                "stream {seed} byte {}",
                got + k as u64
            );
        }
        got += n as u64;
    }
    assert_eq!(got, total);
    writer.await.unwrap();
}

/// The halves answer what tokio's `TcpStream` halves answer (addresses,
/// readiness, `try_*`, `peek`), so ported code calling them compiles and
/// behaves; `forget` leaves writing open, and either half reunites.
#[test]
fn halves_have_tcp_stream_halves_methods() {
    let (_mgr, p) = setup("halves");
    rt(1).block_on(async {
        let (mut c, s) = connected(&p, "10.4.0.30:80").await;
        let (peer, local) = (c.peer_addr().unwrap(), c.local_addr().unwrap());
        {
            let (r, w) = c.split();
            assert_eq!(
                (r.peer_addr().unwrap(), r.local_addr().unwrap()),
                (peer, local)
            );
            assert_eq!(
                (w.peer_addr().unwrap(), w.local_addr().unwrap()),
                (peer, local)
            );
            w.writable().await.unwrap();
            assert_eq!(w.try_write(b"ab").unwrap(), 2);
            let ready = w.ready(Interest::WRITABLE).await.unwrap();
            assert!(ready.is_writable());
            assert_eq!(
                r.try_read(&mut [0u8; 4]).unwrap_err().kind(),
                io::ErrorKind::WouldBlock
            );
        }
        let (r, w) = c.into_split();
        let (sr, sw) = s.into_split();
        assert_eq!(sr.local_addr().unwrap(), peer);
        assert_eq!(sw.peer_addr().unwrap(), local);
        sr.readable().await.unwrap();
        let mut two = [0u8; 2];
        assert_eq!(sr.peek(&mut two).await.unwrap(), 2);
        assert_eq!(sr.try_read(&mut two).unwrap(), 2);
        assert_eq!(&two, b"ab");
        let iov = [io::IoSlice::new(b"c"), io::IoSlice::new(b"d")];
        assert_eq!(sw.try_write_vectored(&iov).unwrap(), 2);
        r.readable().await.unwrap();
        assert!(r.ready(Interest::READABLE).await.unwrap().is_readable());
        let mut got = [0u8; 2];
        let mut bufs = [io::IoSliceMut::new(&mut got)];
        assert_eq!(r.try_read_vectored(&mut bufs).unwrap(), 2);
        assert_eq!(&got, b"cd");
        // Forgotten, the write half leaves the stream open for writes.
        w.forget();
        assert_eq!(r.as_ref().try_write(b"e").unwrap(), 1);
        let mut e = [0u8; 1];
        let mut sr = sr;
        sr.read_exact(&mut e).await.unwrap();
        assert_eq!(&e, b"e");
        // Either half reunites.
        let s = sw.reunite(sr).unwrap();
        drop((r, s));
    });
}

#[test]
fn echo_with_1000_concurrent_tasks() {
    let (_mgr, p) = setup("echo1000");
    let rt = rt(2);
    rt.block_on(async {
        let srv = Net::attach(&p).unwrap();
        let cli = Net::attach(&p).unwrap();
        let l = XioListener::bind_with(&srv, "10.4.0.1:80").unwrap();
        tokio::spawn(echo_server(l));
        let tasks: Vec<_> = (0..1000u64)
            .map(|i| {
                let cli = cli.clone();
                tokio::spawn(async move {
                    let s = XioStream::connect_with(&cli, "10.4.0.1:80").await.unwrap();
                    checked_echo(s, i, 20_000).await;
                })
            })
            .collect();
        tokio::time::timeout(WATCHDOG, async {
            for t in tasks {
                t.await.unwrap();
            }
        })
        .await
        .expect("watchdog");
    });
}

/// A writer that meets a full ring, toward a peer that never answers,
/// finishes: its task waits for a retry, and the first such task rings
/// its own net's doorbell so the sleeping driver retries. Without the
/// ring the driver slept on with no timer, and the write hung (seen as a
/// rare hang of `echo_with_1000_concurrent_tasks`, whose server tasks all
/// waited for a retry).
#[test]
fn a_write_that_meets_a_full_ring_finishes_without_traffic_back() {
    drop(setup("fullring"));
    let p = format!("tt-fullring-{}", std::process::id());
    let pool = xio_core::layout::PoolConfig {
        ring_capacity: 4,
        ..Default::default()
    };
    let _mgr = Manager::builder(&p).pool(pool).spawn().unwrap();
    let srv = Net::attach(&p).unwrap();
    let cli = Net::attach(&p).unwrap();
    let data: Vec<u8> = (0..64 * 2048u32).map(|i| (i % 251) as u8).collect();
    rt(1).block_on(async {
        // The server accepts, and reads only once told the writes are done:
        // its driver drains the ring meanwhile, but nothing comes back.
        let l = XioListener::bind_with(&srv, "10.4.0.21:80").unwrap();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let reader = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            done_rx.await.unwrap();
            let mut all = Vec::new();
            s.read_to_end(&mut all).await.unwrap();
            all
        });
        let mut c = XioStream::connect_with(&cli, "10.4.0.21:80").await.unwrap();
        // A buffer's worth per write, so each meets the ring alone: a
        // 4-slot ring fills at once. The FIN may queue behind it too.
        tokio::time::timeout(WATCHDOG, async {
            for chunk in data.chunks(2048) {
                c.write_all(chunk).await.unwrap();
            }
            c.shutdown().await.unwrap();
        })
        .await
        .expect("watchdog: a write waited for a retry that never came");
        done_tx.send(()).unwrap();
        let got = tokio::time::timeout(WATCHDOG, reader)
            .await
            .expect("watchdog: the FIN never left its queue")
            .unwrap();
        assert_eq!(got, data);
    });
}

fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn current_thread_runtime_echo_and_zero_copy() {
    let (_mgr, p) = setup("current");
    let rt = current_thread_runtime();
    rt.block_on(async {
        let srv = Net::attach(&p).unwrap();
        let cli = Net::attach(&p).unwrap();
        let l = XioListener::bind_with(&srv, "10.4.0.2:80").unwrap();
        let addr = l.local_addr().unwrap();
        let mut c = XioStream::connect_with(&cli, addr).await.unwrap();
        c.connected().await.unwrap();
        let (s, peer) = l.accept().await.unwrap();
        assert_eq!(peer, c.local_addr().unwrap());
        // Vectored: header and body in one buffer, seen as one by recv_buf.
        let n = c
            .write_vectored(&[
                std::io::IoSlice::new(b"HEAD"),
                std::io::IoSlice::new(b"body"),
            ])
            .await
            .unwrap();
        assert_eq!(n, 8);
        let b = s.recv_bytes().await.unwrap().unwrap();
        assert_eq!(&b[..], b"HEADbody");
        let clone = b.clone();
        drop(b);
        assert_eq!(
            &clone[..4],
            b"HEAD",
            "the pool buffer lives while a clone does"
        );
        // Forward a pool buffer back without a copy.
        let mut m = s.alloc(3).await.unwrap();
        m.copy_from_slice(b"zc!");
        s.send_buf(m).await.unwrap();
        let mut got = [0u8; 3];
        c.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"zc!");
    });
}

#[test]
fn copy_and_copy_bidirectional_with_another_stream() {
    let (_mgr, p) = setup("copy");
    rt(2).block_on(async {
        let (mut c, mut s) = connected(&p, "10.4.0.3:80").await;
        // X-IO <-> an in-memory duplex, both ways.
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let proxy =
            tokio::spawn(async move { tokio::io::copy_bidirectional(&mut s, &mut a).await });
        let data: Vec<u8> = (0..300_000u64).map(|i| stream_byte(9, i)).collect();
        // tokio::io::copy from a reader into the X-IO stream.
        let mut src = &data[..];
        let n = tokio::io::copy(&mut src, &mut c).await.unwrap();
        assert_eq!(n, data.len() as u64);
        let mut through = vec![0u8; data.len()];
        b.read_exact(&mut through).await.unwrap();
        assert_eq!(through, data);
        b.write_all(b"and back").await.unwrap();
        b.shutdown().await.unwrap();
        let mut back = Vec::new();
        c.shutdown().await.unwrap();
        c.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"and back");
        let (to_b, to_s) = proxy.await.unwrap().unwrap();
        assert_eq!((to_b, to_s), (data.len() as u64, 8));
    });
}

#[test]
fn framed_lines_round_trip() {
    use tokio_util::codec::{Framed, LinesCodec};
    let (_mgr, p) = setup("framed");
    rt(2).block_on(async {
        let srv = Net::attach(&p).unwrap();
        let cli = Net::attach(&p).unwrap();
        let l = XioListener::bind_with(&srv, "10.4.0.4:80").unwrap();
        tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            let mut f = Framed::new(s, LinesCodec::new());
            while let Some(Ok(line)) = f.next().await {
                f.send(format!("echo: {line}")).await.unwrap();
            }
        });
        let c = XioStream::connect_with(&cli, "10.4.0.4:80").await.unwrap();
        let mut f = Framed::new(c, LinesCodec::new());
        for i in 0..500 {
            f.send(format!("line {i}")).await.unwrap();
            let got = f.next().await.unwrap().unwrap();
            assert_eq!(got, format!("echo: line {i}"));
        }
    });
}

/// A read raced against a short timeout, over and over, loses nothing.
#[test]
fn cancelled_reads_lose_nothing() {
    let (_mgr, p) = setup("cancel");
    rt(2).block_on(async {
        let srv = Net::attach(&p).unwrap();
        let cli = Net::attach(&p).unwrap();
        let l = XioListener::bind_with(&srv, "10.4.0.5:80").unwrap();
        let total = 200_000u64;
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut sent = 0u64;
            while sent < total {
                let n = 777.min(total - sent);
                let chunk: Vec<u8> = (sent..sent + n).map(|i| stream_byte(5, i)).collect();
                s.write_all(&chunk).await.unwrap();
                sent += n;
                if sent % 7770 == 0 {
                    tokio::time::sleep(Duration::from_micros(300)).await;
                }
            }
        });
        let mut c = XioStream::connect_with(&cli, "10.4.0.5:80").await.unwrap();
        let mut got = 0u64;
        let mut timeouts = 0;
        let mut buf = [0u8; 500];
        while got < total {
            tokio::select! {
                r = c.read(&mut buf) => {
                    let n = r.unwrap();
                    assert!(n > 0);
                    for (k, &b) in buf[..n].iter().enumerate() {
                        assert_eq!(b, stream_byte(5, got + k as u64));
                    }
                    got += n as u64;
                }
                _ = tokio::time::sleep(Duration::from_micros(100)) => timeouts += 1,
            }
        }
        assert_eq!(got, total);
        println!("{timeouts} reads cancelled");
    });
}

/// A waker that raises a flag.
struct Flag(std::sync::atomic::AtomicBool);

impl std::task::Wake for Flag {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

fn flag_waker() -> (std::sync::Arc<Flag>, std::task::Waker) {
    let f = std::sync::Arc::new(Flag(std::sync::atomic::AtomicBool::new(false)));
    (f.clone(), std::task::Waker::from(f))
}

/// A poll of a quiet read that finds its waker still registered returns
/// `Pending` without the net's lock. That must never keep a task asleep
/// that polled last (as tokio's `poll_read`, the last poller's waker is
/// the one kept): another task's poll in between replaces the waker, and
/// the first task's next poll must register it again rather than take the
/// lock-free way. Each round ends on a different task; that one is woken
/// by one write, and its poll sees the byte.
#[test]
fn the_task_polling_a_quiet_read_last_is_woken() {
    let (_mgr, p) = setup("wakers");
    rt(1).block_on(async {
        let (mut c, s) = connected(&p, "10.4.0.9:80").await;
        let mut buf = [0u8; 16];
        for round in 0..4u8 {
            let (fa, wa) = flag_waker();
            let (fb, wb) = flag_waker();
            let order: &[(&std::task::Waker, &Flag)] = if round % 2 == 0 {
                &[(&wa, &fa), (&wb, &fb), (&wa, &fa), (&wb, &fb)]
            } else {
                &[(&wa, &fa), (&wa, &fa), (&wb, &fb), (&wb, &fb), (&wa, &fa)]
            };
            for (w, _) in order {
                let mut cx = std::task::Context::from_waker(w);
                assert!(s.as_core().poll_read(&mut cx, &mut buf).is_pending());
            }
            let (last_w, last) = order[order.len() - 1];
            c.write_all(&[round]).await.unwrap();
            tokio::time::timeout(WATCHDOG, async {
                while !last.0.load(std::sync::atomic::Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
            .await
            .expect("the task that polled the read last was never woken");
            let mut cx = std::task::Context::from_waker(last_w);
            match s.as_core().poll_read(&mut cx, &mut buf) {
                std::task::Poll::Ready(Ok(1)) => assert_eq!(buf[0], round),
                other => panic!("expected the byte, got {other:?}"),
            }
        }
    });
}

/// Entry point of the child process of `peer_killed_gives_connection_reset`.
#[test]
fn child_main() {
    let Ok(role) = std::env::var("XIO_CHILD_ROLE") else {
        return;
    };
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
    let prefix = std::env::var("XIO_CHILD_PREFIX").unwrap();
    if role == "manager" {
        // Serves until killed.
        let _mgr = Manager::builder(&prefix).spawn().unwrap();
        println!("ready");
        std::io::stdout().flush().unwrap();
        loop {
            std::thread::park();
        }
    }
    if role == "follower" {
        // A service on the process-wide pool ($XIO_PREFIX), as an axum
        // app is: binds once, then only accepts, echoing 4 bytes.
        rt(1).block_on(async {
            let l = XioListener::bind("10.4.0.20:80").await.unwrap();
            println!("ready");
            std::io::stdout().flush().unwrap();
            loop {
                let (s, _) = l.accept().await.unwrap();
                tokio::spawn(echo4(s));
            }
        });
    }
    if role == "follower_two_runtimes" {
        // As "follower", but the listener's first runtime waits out part
        // of the manager's absence in an accept (its retry timer made
        // there) and is then shut down; a second runtime accepts on.
        let first = rt(1);
        let l = first.block_on(async {
            let l = XioListener::bind("10.4.0.23:80").await.unwrap();
            println!("ready");
            std::io::stdout().flush().unwrap();
            // Serves the test's first client until the manager is gone,
            // then waits in accepts (the retry timer made here) a while.
            while !l.as_core().net().manager_gone() {
                tokio::select! {
                    r = l.accept() => if let Ok((s, _)) = r {
                        tokio::spawn(echo4(s));
                    },
                    () = tokio::time::sleep(Duration::from_millis(1)) => {}
                }
            }
            let until = tokio::time::Instant::now() + Duration::from_millis(300);
            while tokio::time::Instant::now() < until {
                tokio::select! {
                    r = l.accept() => drop(r),
                    () = tokio::time::sleep(Duration::from_millis(1)) => {}
                }
            }
            l
        });
        drop(first);
        rt(1).block_on(async {
            loop {
                let (s, _) = l.accept().await.unwrap();
                tokio::spawn(echo4(s));
            }
        });
    }
    if role == "follower_ticking" {
        // As "follower", on a runtime with one worker, with a task that
        // prints a tick every 10 ms: ticks stop while that worker waits.
        rt(1).block_on(async {
            let l = XioListener::bind("10.4.0.24:80").await.unwrap();
            println!("ready");
            std::io::stdout().flush().unwrap();
            tokio::spawn(async move {
                loop {
                    let (s, _) = l.accept().await.unwrap();
                    tokio::spawn(echo4(s));
                }
            });
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                println!("tick");
                std::io::stdout().flush().unwrap();
            }
        });
    }
    if role == "two_acceptors" {
        // As "follower", with a second task that accepts on the same
        // listener until the manager is gone, then goes on to other work
        // (its accept future dropped) after a last look at the listener.
        rt(1).block_on(async {
            let l = std::sync::Arc::new(XioListener::bind("10.4.0.22:80").await.unwrap());
            let acceptor = l.clone();
            tokio::spawn(async move {
                loop {
                    let (s, _) = acceptor.accept().await.unwrap();
                    tokio::spawn(echo4(s));
                }
            });
            println!("ready");
            std::io::stdout().flush().unwrap();
            while !l.as_core().net().manager_gone() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let until = tokio::time::Instant::now() + Duration::from_millis(300);
            while tokio::time::Instant::now() < until {
                tokio::select! {
                    r = l.accept() => drop(r),
                    () = tokio::time::sleep(Duration::from_millis(1)) => {}
                }
            }
            // One last look, then other work: this task never accepts again.
            std::future::poll_fn(|cx| {
                drop(l.poll_accept(cx));
                std::task::Poll::Ready(())
            })
            .await;
            std::future::pending::<()>().await;
        });
    }
    if role == "embedded_holder" {
        // A single-binary service: its manager embedded; echoes 4 bytes,
        // then holds the connection open.
        let _mgr = Manager::builder(&prefix).spawn().unwrap();
        rt(1).block_on(async {
            let net = Net::attach(&prefix).unwrap();
            let l = XioListener::bind_with(&net, "10.4.0.21:80").unwrap();
            println!("ready");
            std::io::stdout().flush().unwrap();
            let (mut s, _) = l.accept().await.unwrap();
            let mut b = [0u8; 4];
            s.read_exact(&mut b).await.unwrap();
            s.write_all(&b).await.unwrap();
            std::future::pending::<()>().await;
        });
    }
    if role == "forker" {
        return fork_holding_the_registry(&prefix);
    }
    if role == "connects_and_parks" {
        // Connects to a listener that has not accepted yet, writes, and
        // waits to be killed.
        let net = Net::attach(&prefix).unwrap();
        let mut s = net.connect("10.4.0.25:80").unwrap();
        std::io::Write::write_all(&mut s, b"hi").unwrap();
        println!("ready");
        std::io::stdout().flush().unwrap();
        loop {
            std::thread::park();
        }
    }
    assert_eq!(role, "writer");
    // A plain blocking X-IO server in the child: accepts, then writes.
    let net = Net::attach(&prefix).unwrap();
    let l = net.listen("10.4.0.6:80").unwrap();
    println!("ready");
    std::io::stdout().flush().unwrap();
    let (mut s, _) = l.accept().unwrap();
    let chunk = vec![0x5au8; 50_000];
    while s.write_all(&chunk).is_ok() {}
}

extern "C" {
    fn fork() -> i32;
    fn _exit(code: i32) -> !;
}

/// One 4-byte exchange between two nets of pool `p` in a runtime of its
/// own, under `addr`.
fn exchange_in_a_new_runtime(p: &str, addr: &str) {
    rt(1).block_on(async {
        let (mut c, mut s) = connected(p, addr).await;
        c.write_all(b"ping").await.unwrap();
        let mut b = [0u8; 4];
        s.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"ping");
    });
}

/// Role of `a_child_forked_while_the_driver_registry_is_locked_drives_its_nets`:
/// uses xio-tokio (so the registry exists), then forks while holding the
/// registry's lock, as another thread of a service may when it forks. The
/// child makes a runtime and nets of its own and talks over them; it used
/// to wait forever for the lock.
fn fork_holding_the_registry(prefix: &str) {
    exchange_in_a_new_runtime(prefix, "10.4.0.30:80");
    let held = xio_tokio::__hold_registry();
    let (rd, wr) = rustix::pipe::pipe().unwrap();
    // SAFETY: the child makes a runtime and nets (new threads, fds and
    // mappings), writes to a pipe and `_exit`s; this process's other
    // threads (an idle runtime's) hold no lock the child takes.
    let pid = unsafe { fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        drop(rd);
        std::mem::forget(held);
        let _ =
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
        let ok = std::panic::catch_unwind(|| exchange_in_a_new_runtime(prefix, "10.4.0.31:80"));
        let verdict = if ok.is_ok() { "ok" } else { "failed" };
        rustix::io::write(&wr, verdict.as_bytes()).unwrap();
        // SAFETY: ends the forked child without running the parent's exit
        // handlers a second time.
        unsafe { _exit(0) }
    }
    drop(wr);
    drop(held);
    let mut p = [rustix::event::PollFd::new(
        &rd,
        rustix::event::PollFlags::IN,
    )];
    let limit = rustix::event::Timespec {
        tv_sec: WATCHDOG.as_secs() as _,
        tv_nsec: 0,
    };
    assert_eq!(
        rustix::event::poll(&mut p, Some(&limit)).unwrap(),
        1,
        "watchdog: the forked child hung"
    );
    let mut verdict = [0u8; 16];
    let n = rustix::io::read(&rd, &mut verdict).unwrap();
    assert_eq!(&verdict[..n], b"ok", "the forked child's exchange");
    let _ = rustix::process::waitpid(
        rustix::process::Pid::from_raw(pid),
        rustix::process::WaitOptions::empty(),
    );
    println!("ready");
    std::io::stdout().flush().unwrap();
}

#[test]
fn a_child_forked_while_the_driver_registry_is_locked_drives_its_nets() {
    let (_mgr, p) = setup("forkreg");
    let mut child = spawn_child("forker", &p);
    child.kill().unwrap();
    child.wait().unwrap();
}

/// The command that runs `child_main` as `role` on pool `prefix`, its
/// stdout piped.
fn child_command(role: &str, prefix: &str) -> std::process::Command {
    let mut c = std::process::Command::new(std::env::current_exe().unwrap());
    c.args([
        "--exact",
        "child_main",
        "--nocapture",
        "--test-threads=1",
        "--quiet",
    ])
    .env("XIO_CHILD_ROLE", role)
    .env("XIO_CHILD_PREFIX", prefix)
    // The process-wide pool, for roles that use it.
    .env("XIO_PREFIX", prefix)
    .stdout(std::process::Stdio::piped());
    c
}

/// Runs `child_main` in a child process as `role` on pool `prefix`, and
/// waits for its "ready".
fn spawn_child(role: &str, prefix: &str) -> std::process::Child {
    let mut child = child_command(role, prefix).spawn().unwrap();
    // The test harness prints its own lines first.
    let out = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
    let mut out = out.map_while(Result::ok);
    assert!(out.any(|l| l == "ready"), "child never got ready");
    child
}

#[test]
fn peer_killed_gives_connection_reset() {
    let (mgr, p) = setup("killed");
    let mut child = spawn_child("writer", &p);
    rt(1).block_on(async {
        let cli = Net::attach(&p).unwrap();
        let mut c = XioStream::connect_with(&cli, "10.4.0.6:80").await.unwrap();
        let mut buf = vec![0u8; 1 << 16];
        let mut got = 0;
        while got < (4 << 20) {
            got += c.read(&mut buf).await.unwrap();
        }
        child.kill().unwrap();
        child.wait().unwrap();
        let err = tokio::time::timeout(WATCHDOG, async {
            loop {
                match c.read(&mut buf).await {
                    Ok(n) => assert!(n > 0, "a reset, not end of stream"),
                    Err(e) => return e,
                }
            }
        })
        .await
        .expect("watchdog");
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    });
    wait_pool_whole(&mgr);
}

/// A client killed -9 after its connection was queued and before the
/// server accepted it: the accept still hands the connection over (with
/// the client's address), as Linux's accept returns a connection reset in
/// its backlog, and the stream reads what the client wrote, then
/// `ConnectionReset`. It used to fail the accept itself with
/// `NotConnected`, an error servers' accept loops do not expect (axum's
/// sleeps a second on it), where the blocking accept returned the stream.
#[test]
fn a_client_killed_before_its_connection_is_accepted_is_accepted_reset() {
    let (mgr, p) = setup("killedq");
    rt(1).block_on(async {
        let net = Net::attach(&p).unwrap();
        let l = XioListener::bind_with(&net, "10.4.0.25:80").unwrap();
        let mut child = spawn_child("connects_and_parks", &p);
        let pid = child.id();
        child.kill().unwrap();
        child.wait().unwrap();
        // The manager has announced the death; the net learns of it at
        // its next look at the control socket, before the accept.
        let deadline = std::time::Instant::now() + WATCHDOG;
        while mgr.snapshot().stacks.iter().any(|s| s.pid == pid) {
            assert!(std::time::Instant::now() < deadline, "watchdog: death seen");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(50));
        let (mut s, _) = tokio::time::timeout(WATCHDOG, l.accept())
            .await
            .expect("watchdog")
            .expect("a queued connection whose client died is still accepted");
        let mut buf = [0u8; 16];
        let mut got = Vec::new();
        let err = loop {
            match s.read(&mut buf).await {
                Ok(n) => {
                    assert!(n > 0, "a reset, not end of stream");
                    got.extend_from_slice(&buf[..n]);
                }
                Err(e) => break e,
            }
        };
        assert_eq!(got, b"hi");
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    });
    wait_pool_whole(&mgr);
}

/// The manager's process is killed while the driver sleeps (an idle
/// listener and an idle connection): the net learns it through the
/// manager's watch, and the connection keeps working without the manager.
#[test]
fn a_sleeping_driver_learns_of_a_killed_manager() {
    // Only the run directory: this test's manager runs in a child.
    drop(setup("mgrkill"));
    let p = format!("tt-mgrkill-child-{}", std::process::id());
    let mut child = spawn_child("manager", &p);
    rt(1).block_on(async {
        let net = Net::attach(&p).unwrap();
        let l = XioListener::bind_with(&net, "10.4.0.9:80").unwrap();
        let mut c = XioStream::connect_with(&net, "10.4.0.9:80").await.unwrap();
        let (mut s, _) = l.accept().await.unwrap();
        c.write_all(b"ping").await.unwrap();
        let mut b = [0u8; 4];
        s.read_exact(&mut b).await.unwrap();
        assert!(!net.manager_gone());
        // Idle long enough for the driver's spin budget to end: it sleeps.
        tokio::time::sleep(Duration::from_millis(200)).await;
        child.kill().unwrap();
        child.wait().unwrap();
        tokio::time::timeout(WATCHDOG, async {
            while !net.manager_gone() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("watchdog: the net never noticed its manager's death");
        s.write_all(b"pong").await.unwrap();
        c.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"pong");
    });
}

/// A listener bound on the process-wide pool follows its manager across
/// a restart: the manager is killed with -9 and another started on the
/// same prefix; the service, which only accepts, binds again on the new
/// one by itself and new clients reach it there.
#[test]
fn a_global_listener_binds_again_on_a_restarted_manager() {
    service_follows_a_restart("follow", "follower", "10.4.0.20:80");
}

/// As `a_global_listener_binds_again_on_a_restarted_manager`, with the
/// listener's retry timer made on a runtime that is shut down during the
/// manager's absence: the runtime that accepts next must not poll that
/// timer (tokio panics on a timer of a runtime that is gone).
#[test]
fn a_global_listener_follows_a_restart_from_a_second_runtime() {
    service_follows_a_restart("follow2rt", "follower_two_runtimes", "10.4.0.23:80");
}

/// Kills the manager of a service (child role `role`, listening on
/// `addr`) with -9, starts another on the same prefix after a while with
/// none, and waits (watchdog) until new clients reach the service there.
fn service_follows_a_restart(test: &str, role: &str, addr: &'static str) {
    // Only the run directory: the managers and the service are children.
    drop(setup(test));
    let p = format!("tt-{test}-child-{}", std::process::id());
    let mut first = spawn_child("manager", &p);
    let mut service = spawn_child(role, &p);
    let echo = |net: Net| async move {
        let mut c = XioStream::connect_with(&net, addr).await?;
        c.write_all(b"ping").await?;
        let mut b = [0u8; 4];
        c.read_exact(&mut b).await?;
        assert_eq!(&b, b"ping");
        io::Result::Ok(())
    };
    rt(1).block_on(async {
        echo(Net::attach(&p).unwrap()).await.unwrap();
        first.kill().unwrap();
        first.wait().unwrap();
    });
    // A while with no manager at all: the service's accept keeps trying
    // (its timer), and accepts on the new manager once one runs.
    std::thread::sleep(Duration::from_millis(700));
    let mut second = spawn_child("manager", &p);
    rt(1).block_on(async {
        let net = Net::attach(&p).unwrap();
        tokio::time::timeout(WATCHDOG, async {
            // Refused until the service has bound again.
            while let Err(e) = echo(net.clone()).await {
                assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("watchdog: the service never bound again on the new manager");
    });
    for c in [&mut service, &mut second] {
        c.kill().unwrap();
        c.wait().unwrap();
    }
}

/// A service with its manager embedded is killed -9: no manager is left to
/// announce its death, and a tokio client's pending read still ends in a
/// reset (the driver falls back to the liveness tick, on which the stack
/// looks at the peer's pidfd) instead of waiting forever.
#[test]
fn a_peer_dying_with_its_embedded_manager_resets_a_pending_read() {
    // Only the run directory: the manager lives in the service.
    drop(setup("embedded"));
    let p = format!("tt-embedded-child-{}", std::process::id());
    let mut service = spawn_child("embedded_holder", &p);
    rt(1).block_on(async {
        let net = Net::attach(&p).unwrap();
        let mut c = XioStream::connect_with(&net, "10.4.0.21:80").await.unwrap();
        c.write_all(b"ping").await.unwrap();
        let mut b = [0u8; 4];
        c.read_exact(&mut b).await.unwrap();
        let read = tokio::spawn(async move { c.read(&mut [0u8; 4]).await });
        tokio::time::sleep(Duration::from_millis(20)).await; // pending (either way)
        service.kill().unwrap();
        service.wait().unwrap();
        let r = tokio::time::timeout(WATCHDOG, read)
            .await
            .expect("watchdog: the read never ended")
            .unwrap();
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::ConnectionReset);
    });
}

/// Shutting a runtime down with connections open and reads pending returns
/// promptly; the nets work again from a new runtime.
#[test]
fn runtime_shuts_down_cleanly_with_connections_open() {
    let (_mgr, p) = setup("shutdown");
    let srv = Net::attach(&p).unwrap();
    let cli = Net::attach(&p).unwrap();
    let first = rt(2);
    let (l, c) = first.block_on(async {
        let l = XioListener::bind_with(&srv, "10.4.0.7:80").unwrap();
        let c = XioStream::connect_with(&cli, "10.4.0.7:80").await.unwrap();
        (l, c)
    });
    let (mut s, _) = first.block_on(l.accept()).unwrap();
    // Pending reads on both ends, then shut down under them.
    let mut c2 = c;
    first.spawn(async move {
        let mut b = [0u8; 1];
        let _ = c2.read(&mut b).await;
    });
    first.shutdown_timeout(WATCHDOG);
    // A new runtime: the server side still works (its driver is respawned).
    rt(1).block_on(async {
        let mut c = XioStream::connect_with(&cli, "10.4.0.7:80").await.unwrap();
        let (mut s2, _) = l.accept().await.unwrap();
        c.write_all(b"again").await.unwrap();
        let mut b = [0u8; 5];
        s2.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"again");
        // The first server stream saw its peer close (the task was dropped).
        let mut one = [0u8; 1];
        assert_eq!(s.read(&mut one).await.unwrap(), 0);
    });
}

/// The `io::ErrorKind`s a TCP user expects, and cancelled accepts and
/// zero-copy reads that lose nothing.
#[test]
fn error_kinds_and_cancelled_accept_and_recv_buf() {
    let (_mgr, p) = setup("errors");
    rt(2).block_on(async {
        let srv = Net::attach(&p).unwrap();
        let cli = Net::attach(&p).unwrap();
        let e = XioStream::connect_with(&cli, "10.4.0.8:1")
            .await
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
        let l = XioListener::bind_with(&srv, "10.4.0.8:80").unwrap();
        let e = XioListener::bind_with(&cli, "10.4.0.8:80").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
        // accept raced against a timeout, then the connection comes.
        for _ in 0..20 {
            tokio::select! {
                _ = l.accept() => panic!("nobody connected yet"),
                _ = tokio::time::sleep(Duration::from_micros(200)) => {}
            }
        }
        let mut c = XioStream::connect_with(&cli, "10.4.0.8:80").await.unwrap();
        let (s, _) = tokio::time::timeout(WATCHDOG, l.accept())
            .await
            .unwrap()
            .unwrap();
        // recv_buf raced against a timeout loses no buffer.
        let writer = tokio::spawn(async move {
            for i in 0..200u32 {
                c.write_all(&i.to_le_bytes()).await.unwrap();
                if i % 10 == 0 {
                    tokio::time::sleep(Duration::from_micros(300)).await;
                }
            }
            c.shutdown().await.unwrap();
            // Writing after shutdown is a broken pipe.
            let e = c.write_all(b"late").await.unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
            c
        });
        let mut got = Vec::new();
        loop {
            tokio::select! {
                r = s.recv_buf() => match r.unwrap() {
                    Some(b) => got.extend_from_slice(&b),
                    None => break,
                },
                _ = tokio::time::sleep(Duration::from_micros(100)) => {}
            }
        }
        let want: Vec<u8> = (0..200u32).flat_map(|i| i.to_le_bytes()).collect();
        assert_eq!(got, want);
        drop(writer.await.unwrap());
    });
}

#[test]
fn listener_from_std_keeps_its_backlog() {
    let (_mgr, p) = setup("fromstd");
    let rt = current_thread_runtime();
    rt.block_on(async {
        let srv = Net::attach(&p).unwrap();
        let cli = Net::attach(&p).unwrap();
        let l = XioListener::from_std(srv.listen_with_backlog("10.4.0.9:80", 1).unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        tokio::time::timeout(WATCHDOG, async {
            let first = XioStream::connect_with(&cli, addr).await.unwrap();
            first.connected().await.unwrap();
            let second = XioStream::connect_with(&cli, addr).await.unwrap();
            let e = second.connected().await.unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
            let (_s, peer) = l.accept().await.unwrap();
            assert_eq!(peer, first.local_addr().unwrap());
            let third = XioStream::connect_with(&cli, addr).await.unwrap();
            third.connected().await.unwrap();
        })
        .await
        .expect("watchdog");
    });
}

/// The readiness style of tokio's `TcpStream`: wait with `readable`, take
/// what is there with `try_read` until `WouldBlock`; `peek` leaves bytes
/// for the next read; `try_write` writes without waiting. A reset seen by
/// `readable` is the next read's to report.
#[test]
fn readable_try_read_peek_and_try_write() {
    let (_mgr, p) = setup("readiness");
    rt(1).block_on(async {
        let (c, s) = connected(&p, "10.4.0.9:80").await;
        let mut buf = [0u8; 64];
        assert_eq!(
            s.try_read(&mut buf).unwrap_err().kind(),
            std::io::ErrorKind::WouldBlock
        );
        // The reader says when it has "hello world", so "!!" cannot join
        // it in one drain however the threads are scheduled.
        let (have_11, got_11) = tokio::sync::oneshot::channel();
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            let mut buf = [0u8; 3];
            while got.len() < 11 {
                s.readable().await.unwrap();
                loop {
                    match s.try_read(&mut buf) {
                        Ok(0) => panic!("end of stream too early"),
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                        Err(e) => panic!("try_read: {e}"),
                    }
                }
            }
            assert_eq!(got, b"hello world");
            have_11.send(()).unwrap();
            // Peeked bytes are read again.
            let mut two = [0u8; 2];
            assert_eq!(s.peek(&mut two).await.unwrap(), 2);
            assert_eq!(&two, b"!!");
            let mut all = [0u8; 8];
            assert_eq!(s.try_read(&mut all).unwrap(), 2);
            assert_eq!(&all[..2], b"!!");
            s
        });
        assert_eq!(c.try_write(b"hello ").unwrap(), 6);
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        assert_eq!(c.try_write(b"world").unwrap(), 5);
        got_11.await.unwrap();
        // Most likely after the reader began to wait in `peek`: it must
        // wake (and if not, the bytes are simply there when it looks).
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        assert_eq!(c.try_write(b"!!").unwrap(), 2);
        let s = reader.await.unwrap();
        drop(s);
        drop(c);
    });
}

/// `readable` then `try_read_buf` into `buf` until `len` more bytes are in.
async fn read_buf_until(s: &XioStream, buf: &mut impl bytes::BufMut, len: usize) {
    let mut have = 0;
    while have < len {
        s.readable().await.unwrap();
        match s.try_read_buf(buf) {
            Ok(0) => panic!("end of stream too early"),
            Ok(n) => have += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("try_read_buf: {e}"),
        }
    }
}

/// `try_read_buf`, as tokio's `TcpStream` has it: `WouldBlock` with
/// nothing there, then appends what arrived to a `BytesMut` (which grows
/// as needed) or a `Vec`, a byte stream larger than one chunk in order,
/// through the owned read half too; `Ok(0)` at end of stream.
#[test]
fn try_read_buf_appends_to_bytes_mut_and_vec() {
    let (_mgr, p) = setup("read-buf");
    rt(1).block_on(async {
        tokio::time::timeout(WATCHDOG, async {
            let (mut c, s) = connected(&p, "10.4.0.10:80").await;
            let mut got = bytes::BytesMut::new();
            assert_eq!(
                s.try_read_buf(&mut got).unwrap_err().kind(),
                std::io::ErrorKind::WouldBlock
            );
            assert!(got.is_empty());
            // More than BytesMut's first growth (64 bytes) and more than
            // one 2 KiB buffer, in two writes.
            let data: Vec<u8> = (0..5000u64).map(|i| stream_byte(7, i)).collect();
            c.write_all(&data[..3000]).await.unwrap();
            c.write_all(&data[3000..]).await.unwrap();
            read_buf_until(&s, &mut got, data.len()).await;
            assert_eq!(&got[..], &data[..]);
            // A Vec keeps what it had and gets the new bytes after it.
            let (r, _w) = s.into_split();
            let mut v = b"kept:".to_vec();
            c.write_all(b"tail").await.unwrap();
            read_buf_until(r.as_ref(), &mut v, 4).await;
            assert_eq!(v, b"kept:tail");
            c.shutdown().await.unwrap();
            loop {
                r.readable().await.unwrap();
                match r.try_read_buf(&mut v) {
                    Ok(0) => break,
                    Ok(n) => panic!("{n} bytes after the end"),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => panic!("try_read_buf: {e}"),
                }
            }
            assert_eq!(v, b"kept:tail");
        })
        .await
        .expect("watchdog");
    });
}

/// `writable` / `poll_write_ready` / `ready`, as tokio's `TcpStream` has
/// them: a writer filling the window of a reader that does not read stays
/// write-ready until a write meets `WouldBlock`, then sees
/// `poll_write_ready` pending (never ready again while nothing changed,
/// or a `writable` + `try_write` loop would spin), is woken once the
/// reader reads, and every byte arrives, then end of stream as
/// `READ_CLOSED`.
#[test]
fn writable_and_ready_wait_for_room_and_wake() {
    use std::task::Poll;
    use tokio::io::Interest;
    let (_mgr, p) = setup("writable");
    rt(1).block_on(async {
        let (c, s) = connected(&p, "10.4.0.10:80").await;
        let chunk: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
        let mut sent = 0usize;
        // Ready until a write meets `WouldBlock` (the window is full),
        // then pending.
        let poll_ready = || std::future::poll_fn(|cx| Poll::Ready(c.poll_write_ready(cx)));
        while let Poll::Ready(r) = poll_ready().await {
            r.unwrap();
            let from = sent % chunk.len();
            match c.try_write(&chunk[from..]) {
                Ok(n) => {
                    assert!(n > 0);
                    sent += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    assert!(
                        poll_ready().await.is_pending(),
                        "write-ready again right after WouldBlock"
                    );
                    break;
                }
                Err(e) => panic!("try_write: {e}"),
            }
        }
        assert!(
            sent >= chunk.len(),
            "only {sent} bytes before the window filled"
        );
        assert_eq!(
            c.try_write(&chunk).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        let reader = tokio::spawn(async move {
            let mut got = 0usize;
            let mut buf = vec![0u8; 16 * 1024];
            // Nothing was written this way: writable at once.
            let r = s
                .ready(Interest::READABLE | Interest::WRITABLE)
                .await
                .unwrap();
            assert!(r.is_writable(), "{r:?}");
            loop {
                let r = s.ready(Interest::READABLE).await.unwrap();
                assert!(r.is_readable(), "{r:?}");
                loop {
                    match s.try_read(&mut buf) {
                        Ok(0) => {
                            let r = s.ready(Interest::READABLE).await.unwrap();
                            assert!(r.is_read_closed(), "{r:?}");
                            return got;
                        }
                        Ok(n) => {
                            for (k, b) in buf[..n].iter().enumerate() {
                                assert_eq!(*b, ((got + k) % chunk_len() % 251) as u8);
                            }
                            got += n;
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => panic!("try_read: {e}"),
                    }
                }
            }
        });
        // Another 4 MiB, each write after `writable`: the reader's reads
        // must wake the writer.
        let total = sent + (4 << 20);
        while sent < total {
            c.writable().await.unwrap();
            let from = sent % chunk.len();
            let end = chunk.len().min(from + total - sent);
            match c.try_write(&chunk[from..end]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("try_write: {e}"),
            }
        }
        drop(c);
        assert_eq!(reader.await.unwrap(), total);
    });
}

/// `poll_write_ready` with the ring to the peer full but window left (two
/// connections to a peer that does not drain: each has credit, the ring
/// they share fills): once a `try_write` met `WouldBlock`, pending, never
/// ready again while the ring stays full (a `writable` + `try_write` loop
/// would spin).
#[test]
fn write_readiness_waits_for_a_full_ring() {
    use std::task::Poll;
    let (_mgr, p) = setup("ringfull");
    rt(1).block_on(async {
        let srv = Net::attach(&p).unwrap();
        let cli = Net::attach(&p).unwrap();
        let l = srv.listen("10.4.0.50:80").unwrap();
        // Accepted on a plain thread, which then leaves the net alone: no
        // one drains the client's ring.
        let acc = std::thread::spawn(move || {
            let a = l.accept().unwrap().0;
            let b = l.accept().unwrap().0;
            (l, a, b)
        });
        let c1 = XioStream::connect_with(&cli, "10.4.0.50:80").await.unwrap();
        let c2 = XioStream::connect_with(&cli, "10.4.0.50:80").await.unwrap();
        let kept = tokio::task::spawn_blocking(move || acc.join().unwrap())
            .await
            .unwrap();
        let chunk = [7u8; 100];
        let (mut written, mut pending) = (0u64, 0u64);
        for i in 0..5000 {
            let c = if i % 2 == 0 { &c1 } else { &c2 };
            match poll_write_ready_once(c).await {
                Poll::Ready(r) => {
                    r.unwrap();
                    match c.try_write(&chunk) {
                        Ok(n) => {
                            assert!(n > 0);
                            written += 1;
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            assert!(
                                poll_write_ready_once(c).await.is_pending(),
                                "write-ready again right after WouldBlock"
                            );
                        }
                        Err(e) => panic!("try_write: {e}"),
                    }
                }
                Poll::Pending => pending += 1,
            }
        }
        assert!(
            written > 0 && pending > 0,
            "{written} written, {pending} pending"
        );
        drop(kept);
    });
}

/// One `poll_write_ready` of `c`, without waiting.
async fn poll_write_ready_once(c: &XioStream) -> std::task::Poll<io::Result<()>> {
    std::future::poll_fn(|cx| std::task::Poll::Ready(c.poll_write_ready(cx))).await
}

fn chunk_len() -> usize {
    64 * 1024
}

/// Sends `sig` to the child. After a SIGSTOP, waits until every thread of
/// it has stopped: the signal is delivered asynchronously, and a thread
/// running at the time can still answer a request sent right after.
fn signal(child: &std::process::Child, sig: rustix::process::Signal) {
    rustix::process::kill_process(rustix::process::Pid::from_child(child), sig).unwrap();
    if sig != rustix::process::Signal::STOP {
        return;
    }
    let id = child.id();
    let deadline = std::time::Instant::now() + WATCHDOG;
    loop {
        let tasks = std::fs::read_dir(format!("/proc/{id}/task")).unwrap();
        let stopped = tasks.flatten().all(|t| {
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            // The state follows the parenthesised command name.
            stat.rsplit(") ").next().is_some_and(|r| r.starts_with('T'))
        });
        if stopped {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "watchdog: the child to stop"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A child killed (-9, which ends a stopped process too) and reaped when
/// dropped, a failing test included.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A connect the manager must resolve waits for it off the runtime's
/// threads: with the manager stopped (SIGSTOP; a debugger, a hang), a
/// current-thread runtime still runs its other tasks while the connect
/// waits, and the connect completes once the manager runs again. A
/// connect to a process already reached needs no manager at all.
#[test]
fn a_connect_waiting_for_a_stopped_manager_does_not_hold_the_runtime() {
    // Only the run directory: this test's manager runs in a child.
    drop(setup("stopmgr"));
    let p = format!("tt-stopmgr-child-{}", std::process::id());
    let child = KillOnDrop(spawn_child("manager", &p));
    let child = &child.0;
    let addr = "10.4.0.31:80";
    let srv = Net::attach(&p).unwrap();
    let cli = Net::attach(&p).unwrap();
    // Long enough never to end a passing run; a failing one (the connect
    // waiting on the runtime's thread) ends when it does.
    cli.set_control_timeout(Duration::from_secs(20));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let l = XioListener::bind_with(&srv, addr).unwrap();
        signal(child, rustix::process::Signal::STOP);
        let c = {
            let cli = cli.clone();
            tokio::spawn(async move { XioStream::connect_with(&cli, addr).await })
        };
        // The runtime's one thread is free: this task runs, and the
        // connect has not completed (it cannot without the manager).
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if c.is_finished() {
            let r = c.await.unwrap().map(|_| ());
            panic!("the connect waited for the manager on the runtime's thread: {r:?}");
        }
        signal(child, rustix::process::Signal::CONT);
        let mut c = tokio::time::timeout(WATCHDOG, c)
            .await
            .expect("watchdog: the connect never completed")
            .unwrap()
            .unwrap();
        let (mut s, _) = l.accept().await.unwrap();
        c.write_all(b"ping").await.unwrap();
        let mut b = [0u8; 4];
        s.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"ping");
        // The route is known now: connecting again needs no manager.
        signal(child, rustix::process::Signal::STOP);
        let mut c2 = tokio::time::timeout(WATCHDOG, XioStream::connect_with(&cli, addr))
            .await
            .expect("watchdog: a connect over a known route waited")
            .unwrap();
        let (mut s2, _) = l.accept().await.unwrap();
        c2.write_all(b"pong").await.unwrap();
        s2.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"pong");
        signal(child, rustix::process::Signal::CONT);
    });
}

/// Outside a tokio runtime, a bind and a connect that would wait on a
/// blocking thread fail with an error that says so (they used to panic
/// in `spawn_blocking`).
#[test]
fn a_bind_or_connect_outside_a_runtime_is_an_error() {
    let (_mgr, p) = setup("nort");
    let net = Net::attach(&p).unwrap();
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut bind = std::pin::pin!(XioListener::bind("10.4.0.33:80"));
    let std::task::Poll::Ready(Err(e)) = bind.as_mut().poll(&mut cx) else {
        panic!("a bind outside a runtime did not fail at once");
    };
    assert!(e.to_string().contains("tokio runtime"), "{e}");
    let mut connect = std::pin::pin!(XioStream::connect_with(&net, "10.4.0.34:80"));
    let std::task::Poll::Ready(Err(e)) = connect.as_mut().poll(&mut cx) else {
        panic!("a connect outside a runtime did not fail at once");
    };
    assert!(e.to_string().contains("tokio runtime"), "{e}");
}

/// `connect` takes what `tokio::net::TcpStream::connect` takes: a host
/// name with a port, as a string or a tuple (looked up by tokio); every
/// address the name stands for is tried in order, so `localhost` reaches
/// a listener on 127.0.0.1 also where it resolves to `::1` first.
#[test]
fn a_connect_takes_a_host_name() {
    let (_mgr, p) = setup("hostname");
    current_thread_runtime().block_on(async {
        let srv = Net::attach(&p).unwrap();
        let cli = Net::attach(&p).unwrap();
        let l = XioListener::bind_with(&srv, "127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(echo_server(l));
        let name = format!("localhost:{port}");
        for c in [
            XioStream::connect_with(&cli, name.as_str()).await,
            XioStream::connect_with(&cli, ("localhost", port)).await,
            XioStream::connect_with(&cli, name.clone()).await,
        ] {
            let mut c = c.unwrap();
            assert_eq!(c.peer_addr().unwrap().port(), port);
            c.write_all(b"named").await.unwrap();
            let mut b = [0u8; 5];
            c.read_exact(&mut b).await.unwrap();
            assert_eq!(&b, b"named");
        }
        let e = XioStream::connect_with(&cli, "localhost")
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    });
}

/// Reads `n` bytes from `s`, telling `pending` when the read first
/// returns `Pending` (its waker is registered: from then on it relies on
/// a driver of the net to wake it).
async fn read_noting_pending(
    mut s: XioStream,
    n: usize,
    pending: tokio::sync::oneshot::Sender<()>,
) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; n];
    let mut pending = Some(pending);
    let mut read = std::pin::pin!(s.read_exact(&mut buf));
    std::future::poll_fn(|cx| {
        let p = read.as_mut().poll(cx);
        if p.is_pending() {
            pending.take().map(|tx| tx.send(()));
        }
        p
    })
    .await?;
    Ok(buf)
}

/// Waits (on the current runtime) for [`read_noting_pending`]'s signal.
async fn went_pending(rx: tokio::sync::oneshot::Receiver<()>) {
    tokio::time::timeout(WATCHDOG, rx)
        .await
        .expect("watchdog: the read never went pending")
        .expect("the read ended before it went pending");
}

/// A task of one runtime waiting on a net whose driver ran on another
/// runtime, which then shut down: the driver's end wakes the task, which
/// starts a driver on its own runtime. (It used to wait forever: the
/// driver's end only cleared its live flag.)
#[test]
fn a_pending_read_survives_the_shutdown_of_the_drivers_runtime() {
    let (_mgr, p) = setup("driver-rt-gone");
    let a = rt(1);
    let (c, s) = a.block_on(connected(&p, "10.4.0.40:80"));
    let b = rt(1);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let read = b.spawn(read_noting_pending(s, 5, tx));
    b.block_on(went_pending(rx));
    a.shutdown_timeout(WATCHDOG); // both nets' drivers go with it
    b.block_on(write_hello_and_see_it_read(c, read));
}

/// On the runtime it runs in: a task reads `s` and goes pending, then
/// `c` writes; the read must be woken (by a driver that serves this
/// runtime) and get every byte.
async fn read_woken_elsewhere(c: XioStream, s: XioStream) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let read = tokio::spawn(read_noting_pending(s, 5, tx));
    went_pending(rx).await;
    write_hello_and_see_it_read(c, read).await;
}

/// Writes "hello" on `c`; the pending `read` of its peer must be woken
/// and get it.
async fn write_hello_and_see_it_read(
    mut c: XioStream,
    read: tokio::task::JoinHandle<std::io::Result<Vec<u8>>>,
) {
    c.write_all(b"hello").await.unwrap();
    let got = tokio::time::timeout(WATCHDOG, read)
        .await
        .expect("watchdog: the pending read was never woken")
        .unwrap()
        .unwrap();
    assert_eq!(got, b"hello");
}

/// A task of one runtime waiting on a net whose only driver is on a
/// current_thread runtime that nobody runs (its `block_on` returned):
/// that driver cannot serve it, so the task starts one on its own
/// runtime. (It used to rely on the idle driver and wait forever.)
/// Concurrent `#[tokio::test]`s sharing `Net::global()` are this case.
#[test]
fn a_pending_read_does_not_rely_on_an_idle_current_thread_runtime() {
    let (_mgr, p) = setup("driver-rt-idle");
    let a = current_thread_runtime();
    let (c, s) = a.block_on(connected(&p, "10.4.0.41:80"));
    rt(1).block_on(read_woken_elsewhere(c, s));
    drop(a);
}

/// As above with two current_thread runtimes run one after the other on
/// one thread (as a test harness may run `#[tokio::test]`s): the driver
/// this thread found last is the first runtime's, which does not run in
/// the second's `block_on`.
#[test]
fn current_thread_runtimes_in_turn_on_one_thread_each_get_a_driver() {
    let (_mgr, p) = setup("driver-ct-turns");
    let a = current_thread_runtime();
    let (c, s) = a.block_on(connected(&p, "10.4.0.42:80"));
    current_thread_runtime().block_on(read_woken_elsewhere(c, s));
    drop(a);
}

/// `connected()` waits on the net as a read does, so it needs a driver
/// that serves its runtime too: here the stream's only driver is on a
/// current_thread runtime nobody runs any more, and the listener answers
/// while another runtime's task waits in `connected()`.
#[test]
fn connected_does_not_rely_on_an_idle_current_thread_runtime() {
    let (_mgr, p) = setup("connected-idle");
    let srv = Net::attach(&p).unwrap();
    // A core listener: nothing drains its net (nothing answers the SYN)
    // until a thread accepts on it.
    let l = srv.listen("10.4.0.43:80").unwrap();
    let a = current_thread_runtime();
    let c = a.block_on(async {
        let cli = Net::attach(&p).unwrap();
        XioStream::connect_with(&cli, "10.4.0.43:80").await.unwrap()
    });
    rt(1).block_on(async move {
        let waiting = tokio::spawn(async move {
            c.connected().await.unwrap();
            c
        });
        // Let the task wait (a wake-up it misses is what is tested; the
        // SYN is unanswered until the accept below, so it waits).
        tokio::time::sleep(Duration::from_millis(50)).await;
        let acc = std::thread::spawn(move || l.accept().unwrap());
        tokio::time::timeout(WATCHDOG, waiting)
            .await
            .expect("watchdog: connected() was never woken")
            .unwrap();
        acc.join().unwrap();
    });
    drop(a);
}

/// A net's driver task ends once the net is gone (every stream, listener
/// and handle of it dropped): a process that attaches nets over its life
/// (the global one again after each manager restart, say) must not keep
/// a sleeping task and its fds per net it ever had.
#[test]
fn a_drivers_task_ends_when_its_net_is_dropped() {
    let (_mgr, p) = setup("driver-net-gone");
    let rt = rt(1);
    rt.block_on(async {
        let (mut c, mut s) = connected(&p, "10.4.0.44:80").await;
        c.write_all(b"hello").await.unwrap();
        let mut b = [0u8; 5];
        s.read_exact(&mut b).await.unwrap();
        drop((c, s));
    });
    // Both nets are gone now: their drivers have nothing left to serve.
    let m = rt.metrics();
    rt.block_on(async {
        tokio::time::timeout(WATCHDOG, async {
            while m.num_alive_tasks() > 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap_or_else(|_| {
            panic!(
                "watchdog: {} driver task(s) outlived their nets",
                m.num_alive_tasks()
            )
        });
    });
}

/// An accept cancelled while it waited (a `select!` against a timeout, or
/// `axum::serve`'s graceful shutdown) leaves its task's waker registered
/// on the net; dropping the listener must let go of it (the net lives on
/// with its other connections), as dropping a stream does for its reads'.
#[test]
fn a_dropped_listener_lets_go_of_a_cancelled_accepts_waker() {
    let (_mgr, p) = setup("accept-waker");
    rt(1).block_on(async {
        let srv = Net::attach(&p).unwrap();
        let l = XioListener::bind_with(&srv, "10.4.0.45:80").unwrap();
        let (flag, w) = flag_waker();
        let mut cx = std::task::Context::from_waker(&w);
        assert!(l.poll_accept(&mut cx).is_pending());
        drop(w);
        drop(l);
        assert_eq!(
            std::sync::Arc::strong_count(&flag),
            1,
            "the net still holds the waker of an accept on a dropped listener"
        );
        drop(srv);
    });
}

/// One net used by tokio tasks and by a thread's blocking call (a sync
/// library on `Net::global`, say): while the thread waits it drives the
/// net itself, asleep on the futex rather than the doorbell; once it is
/// done the tasks' driver, asleep on the doorbell all along, must be rung
/// again when their data comes.
#[test]
fn a_blocking_call_on_the_same_net_leaves_the_tasks_driver_reachable() {
    use std::io::Read;
    let (_mgr, p) = setup("mixed-blocking");
    let srv = Net::attach(&p).unwrap();
    let cli = Net::attach(&p).unwrap();
    rt(1).block_on(async {
        let addr = "10.4.0.46:80";
        let l = XioListener::bind_with(&srv, addr).unwrap();
        let c = XioStream::connect_with(&cli, addr).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        let blocking = {
            let cli = cli.clone();
            tokio::task::spawn_blocking(move || cli.connect(addr).unwrap())
                .await
                .unwrap()
        };
        let (mut bs, _) = l.accept().await.unwrap();
        // A task waits on the net's driver.
        let (tx, rx) = tokio::sync::oneshot::channel();
        let read = tokio::spawn(read_noting_pending(c, 5, tx));
        went_pending(rx).await;
        // A thread's blocking read on the same net, answered.
        let (tx, rx) = tokio::sync::oneshot::channel();
        let reader = std::thread::spawn(move || {
            let mut b = [0u8; 3];
            (&blocking).read_exact(&mut b).unwrap();
            let _ = tx.send(());
            blocking
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        bs.write_all(b"abc").await.unwrap();
        tokio::time::timeout(WATCHDOG, rx)
            .await
            .expect("watchdog: the blocking read never returned")
            .unwrap();
        drop(reader.join().unwrap());
        // The task's data comes now.
        write_hello_and_see_it_read(s, read).await;
    });
}

/// As `a_global_listener_binds_again_on_a_restarted_manager`, with two
/// tasks accepting on the listener, the second of which stops accepting
/// while no manager runs (its accept future dropped after it polled
/// last): the remaining task must still be woken to try the next manager.
#[test]
fn a_listener_follows_a_restart_after_one_of_its_acceptors_left() {
    service_follows_a_restart("follow2", "two_acceptors", "10.4.0.22:80");
}

/// Write readiness of a reset connection is only a hint, as a socket's
/// `EPOLLOUT|EPOLLERR` is: it must not consume the error. A peer that
/// closed with data unread resets us; `writable()` (or `ready` with
/// `WRITABLE`) then says ready, and the next read must still report
/// `ConnectionReset`. (It read end of stream: the readiness check took the
/// reset as reported, so a reset looked like a clean close.)
#[test]
fn write_readiness_leaves_a_reset_for_the_read() {
    use tokio::io::Interest;
    let (_mgr, p) = setup("ready-reset");
    rt(1).block_on(async {
        tokio::time::timeout(WATCHDOG, async {
            for (i, how) in ["writable", "ready"].into_iter().enumerate() {
                let addr = format!("10.4.0.47:{}", 80 + i);
                let (mut c, s) = connected(&p, &addr).await;
                c.write_all(b"never read").await.unwrap();
                s.readable().await.unwrap();
                drop(s); // unread data: a reset
                c.readable().await.unwrap(); // the reset is in
                match how {
                    "writable" => c.writable().await.unwrap(),
                    _ => {
                        let r = c.ready(Interest::WRITABLE).await.unwrap();
                        assert!(r.is_writable(), "{r:?}");
                    }
                }
                let mut b = [0u8; 4];
                let r = c.read(&mut b).await;
                assert_eq!(
                    r.as_ref().map_err(io::Error::kind).err(),
                    Some(io::ErrorKind::ConnectionReset),
                    "after {how}: {r:?}"
                );
            }
        })
        .await
        .expect("watchdog");
    });
}

/// `take_error` reports a reset once, as `SO_ERROR` does (it always said
/// `None`, so a ported event loop took a failed connection for a live one).
#[test]
fn take_error_reports_a_reset_once() {
    let (_mgr, p) = setup("take-error");
    rt(1).block_on(async {
        tokio::time::timeout(WATCHDOG, async {
            let (mut c, s) = connected(&p, "10.4.0.49:80").await;
            assert!(c.take_error().unwrap().is_none(), "a live connection");
            c.write_all(b"never read").await.unwrap();
            s.readable().await.unwrap();
            drop(s); // unread data: a reset
            c.readable().await.unwrap(); // the reset is in
            let e = c.take_error().unwrap().expect("the reset");
            assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}");
            assert!(c.take_error().unwrap().is_none(), "reported once");
            // Reported: reads end, as on Linux once SO_ERROR was read.
            assert_eq!(c.read(&mut [0u8; 4]).await.unwrap(), 0);
        })
        .await
        .expect("watchdog");
    });
}

/// `ready` with `ERROR` (or `PRIORITY`) alone waited for ever: nothing
/// wakes such a wait. It is refused now; next to `READABLE`, a reset
/// reports `ERROR` too.
#[test]
fn ready_for_errors_alone_is_refused_and_a_reset_reports_error() {
    use tokio::io::Interest;
    let (_mgr, p) = setup("ready-error");
    rt(1).block_on(async {
        tokio::time::timeout(WATCHDOG, async {
            let (mut c, s) = connected(&p, "10.4.0.48:80").await;
            for i in [Interest::ERROR, Interest::PRIORITY] {
                let e = c.ready(i).await.unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::Unsupported, "{i:?}: {e}");
            }
            c.write_all(b"never read").await.unwrap();
            s.readable().await.unwrap();
            drop(s); // unread data: a reset
            let r = c.ready(Interest::READABLE | Interest::ERROR).await.unwrap();
            assert!(
                r.is_readable() && r.is_error() && r.is_read_closed(),
                "{r:?}"
            );
            // As epoll reports a reset: closed for reading, ERROR only
            // when asked for.
            let r = c.ready(Interest::READABLE).await.unwrap();
            assert!(
                r.is_readable() && r.is_read_closed() && !r.is_error(),
                "{r:?}"
            );
            let mut b = [0u8; 4];
            let r = c.read(&mut b).await;
            assert_eq!(
                r.as_ref().map_err(io::Error::kind).err(),
                Some(io::ErrorKind::ConnectionReset),
                "{r:?}"
            );
        })
        .await
        .expect("watchdog");
    });
}

/// Two current_thread runtimes on two threads share one net (as
/// concurrent `#[tokio::test]`s share `Net::global()`), so each has a
/// driver of it. One runtime runs in short `block_on`s, each an echo
/// exchange that may return while its driver watches the rings (the
/// doorbell switched off, peers not ringing it), and then waits for the
/// other runtime, always in its `block_on`, to make an exchange of its
/// own. That one's driver sleeps on the doorbell: it must still hear the
/// echo. (It did not: the first runtime's driver, no longer polled, left
/// the doorbell off until that runtime ran again, which here was never.)
#[test]
fn a_block_on_returning_mid_watch_leaves_the_other_runtimes_driver_reachable() {
    let (_mgr, p) = setup("watch-suspended");
    let addr = "10.4.0.51:80";
    // The echo server, on a net of its own and a runtime of its own.
    let server = rt(1);
    let l = server.block_on(async { XioListener::bind_with(&Net::attach(&p).unwrap(), addr) });
    server.spawn(echo_server(l.unwrap()));
    // The adaptive policy starts out watching: fresh nets, fresh runtimes.
    for attempt in 0..20 {
        exchanges_beside_short_block_ons(&p, addr, attempt);
    }
}

/// One attempt of the test above, on a shared net of its own: it is used
/// first by this thread's runtime (so it gets a driver of its own), then
/// by the other's.
fn exchanges_beside_short_block_ons(p: &str, addr: &'static str, attempt: usize) {
    let shared = Net::attach(p).unwrap();
    let a = current_thread_runtime();
    let mut ca = a.block_on(async { XioStream::connect_with(&shared, addr).await.unwrap() });
    let (go_tx, mut go_rx) = tokio::sync::mpsc::unbounded_channel::<u8>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let b = {
        let shared = shared.clone();
        std::thread::spawn(move || {
            current_thread_runtime().block_on(async move {
                let mut cb = XioStream::connect_with(&shared, addr).await.unwrap();
                while let Some(i) = go_rx.recv().await {
                    cb.write_all(&[i]).await.unwrap();
                    let mut got = [0u8];
                    cb.read_exact(&mut got).await.unwrap();
                    assert_eq!(got, [i]);
                    if done_tx.send(()).is_err() {
                        return;
                    }
                }
            })
        })
    };
    for round in 0..100 {
        let i = round as u8;
        a.block_on(async {
            ca.write_all(&[i]).await.unwrap();
            let mut got = [0u8];
            ca.read_exact(&mut got).await.unwrap();
            assert_eq!(got, [i]);
            // Hold the thread a varying while (a task's work), giving the
            // other runtime's driver time to settle asleep, then let this
            // runtime's driver go on a varying number of steps (into a
            // watch of the rings, say) before returning.
            let t = std::time::Instant::now();
            let hold = Duration::from_micros(20 * (round % 8) as u64);
            while t.elapsed() < hold {
                std::hint::spin_loop();
            }
            for _ in 0..round % 5 {
                tokio::task::yield_now().await;
            }
        });
        go_tx.send(i).unwrap();
        done_rx.recv_timeout(WATCHDOG).unwrap_or_else(|e| {
            panic!("watchdog: attempt {attempt}, round {round}: the other runtime's exchange never ended ({e})")
        });
    }
    drop(go_tx);
    b.join().unwrap();
    drop(a);
}

/// A route this process learnt to a process that has since stopped
/// listening on the address and makes no X-IO call any more (a blocking
/// program between calls): nobody there reads the SYN. `connected()` asks
/// the manager after a little while; a read (or a write that waits for
/// the window) straight after `connect`, as code ported from tokio does,
/// waited for good where TCP's connect is refused.
#[test]
fn a_read_on_a_stale_route_to_a_silent_process_is_refused() {
    let (_mgr, p) = setup("silent-read");
    let srv = Net::attach(&p).unwrap();
    let addrs = ["10.4.0.44:80", "10.4.0.45:80"];
    rt(1).block_on(async {
        // A blocking server, no tokio driver: it reads its rings only
        // while one of its threads waits in X-IO.
        let ls: Vec<_> = addrs.iter().map(|a| srv.listen(*a).unwrap()).collect();
        let served = std::thread::spawn(move || {
            for l in ls {
                drop(l.accept().unwrap());
            }
        });
        let cli = Net::attach(&p).unwrap();
        for a in addrs {
            let first = XioStream::connect_with(&cli, a).await.unwrap();
            first.connected().await.unwrap();
        }
        // Its listeners close; the process goes quiet (`srv` stays).
        tokio::task::spawn_blocking(move || served.join().unwrap())
            .await
            .unwrap();
        tokio::time::timeout(WATCHDOG, async {
            // The cached route: connected at once, the SYN unanswered.
            let mut c = XioStream::connect_with(&cli, addrs[0]).await.unwrap();
            let mut b = [0u8; 8];
            let e = c.read(&mut b).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
            // A write that waits for a window nobody opens.
            let mut c = XioStream::connect_with(&cli, addrs[1]).await.unwrap();
            let big = vec![7u8; 16 << 20];
            let e = c.write_all(&big).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
        })
        .await
        .expect("refused, not waited for");
    });
    drop(srv);
}

/// A listener that follows its manager binds again on the new one when it
/// runs: attaching and binding are requests to that manager, which may
/// be slow or stopped (SIGSTOP, a debugger). They were made in the
/// accept's poll, on a runtime worker, which then waited (up to the
/// control timeout) with every task of that worker: a service's other
/// work stopped because its manager was restarted into a stopped state.
#[test]
fn a_listener_following_a_restart_does_not_wait_for_the_manager_on_a_worker() {
    drop(setup("followstop"));
    let p = format!("tt-followstop-child-{}", std::process::id());
    let mut first = KillOnDrop(spawn_child("manager", &p));
    let mut child = child_command("follower_ticking", &p)
        // A wait on the stopped manager lasts past the watchdog.
        .env("XIO_CONTROL_TIMEOUT_MS", "600000")
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let _service = KillOnDrop(child);
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in std::io::BufRead::lines(std::io::BufReader::new(out)).map_while(Result::ok) {
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    let ticks = |n: usize, what: &str| {
        let deadline = std::time::Instant::now() + WATCHDOG;
        let mut seen = 0;
        while seen < n {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match lines.recv_timeout(left) {
                Ok(l) if l == "tick" => seen += 1,
                Ok(_) => {}
                Err(_) => panic!("watchdog: {what}"),
            }
        }
    };
    ticks(1, "the service never ticked");
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    // A new manager, stopped as soon as it listens: the service's next
    // attempt to follow waits on it.
    let second = KillOnDrop(spawn_child("manager", &p));
    signal(&second.0, rustix::process::Signal::STOP);
    // 100 ticks take a second at least: several follow attempts (every
    // 200 ms) fall within them.
    ticks(100, "the service's runtime waited on the stopped manager");
    signal(&second.0, rustix::process::Signal::CONT);
}

// ---------------------------------------------------------------------
// Behaviour a port from tokio::net would rely on.
// ---------------------------------------------------------------------

/// Waits (with the watchdog) until every stack left `mgr` and every
/// buffer is back in its pool.
fn wait_pool_whole(mgr: &ManagerHandle) {
    let deadline = std::time::Instant::now() + WATCHDOG;
    while !mgr.snapshot().stacks.is_empty() || !mgr.pool_is_whole() {
        assert!(
            std::time::Instant::now() < deadline,
            "pool whole after every stack left"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `write`, `writable` and `readable` raced against timers, with a
/// reader that pauses so that writes really wait for the window: every
/// byte arrives once and in order, as tokio's cancel-safe `TcpStream`
/// methods promise.
#[test]
fn cancelled_writes_and_readiness_waits_lose_nothing() {
    let (mgr, p) = setup("cancelw");
    rt(2).block_on(async {
        let (c, s) = connected(&p, "10.4.0.60:80").await;
        // Twelve windows: on a loaded machine the reader can keep up with
        // a few, and no write then waits long enough to be cancelled
        // (CI saw none once with three).
        let total = 12 * c.as_core().net().window() as u64 + 12_345;
        let writer = tokio::spawn(async move {
            let mut c = c;
            let mut sent = 0u64;
            let mut cancelled = 0u32;
            let mut round = 0u32;
            while sent < total {
                round += 1;
                let n = 50_000.min(total - sent);
                let chunk: Vec<u8> = (sent..sent + n).map(|i| stream_byte(9, i)).collect();
                if round % 3 == 0 {
                    tokio::select! {
                        r = c.writable() => r.unwrap(),
                        _ = tokio::time::sleep(Duration::from_millis(1)) => { cancelled += 1; continue; }
                    }
                }
                tokio::select! {
                    r = c.write(&chunk) => { let w = r.unwrap(); assert!(w > 0); sent += w as u64; }
                    _ = tokio::time::sleep(Duration::from_millis(1)) => cancelled += 1,
                }
            }
            c.shutdown().await.unwrap();
            (c, cancelled)
        });
        let mut got = 0u64;
        let mut buf = vec![0u8; 40_000];
        'outer: loop {
            // Pause: the writer meets a full window and its waits time out.
            tokio::time::sleep(Duration::from_millis(10)).await;
            loop {
                tokio::select! {
                    r = s.readable() => r.unwrap(),
                    _ = tokio::time::sleep(Duration::from_millis(1)) => continue 'outer,
                }
                loop {
                    let n = match s.try_read(&mut buf) {
                        Ok(n) => n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => panic!("{e}"),
                    };
                    if n == 0 {
                        break 'outer;
                    }
                    for (k, &b) in buf[..n].iter().enumerate() {
                        assert_eq!(b, stream_byte(9, got + k as u64), "byte {}", got + k as u64);
                    }
                    got += n as u64;
                }
            }
        }
        assert_eq!(got, total);
        let (c, cancelled) = tokio::time::timeout(WATCHDOG, writer).await.unwrap().unwrap();
        assert!(cancelled > 0, "no write or wait was cancelled");
        println!("{cancelled} writes/waits cancelled");
        drop((c, s));
    });
    wait_pool_whole(&mgr);
}

/// Zero-length reads and writes, and vectored writes with empty slices,
/// as a `TcpStream` has them: `write(&[])` is `Ok(0)` at once even with a
/// full window, empty slices are skipped, `read(&mut [])` is `Ok(0)` and
/// takes nothing; `shutdown` twice is fine.
#[test]
fn zero_length_and_vectored_io_match_tcp() {
    use std::task::Poll;
    use tokio::io::AsyncWrite;
    let (mgr, p) = setup("zerolen");
    rt(1).block_on(async {
        let (mut c, mut s) = connected(&p, "10.4.0.61:80").await;
        assert!(c.is_write_vectored());
        assert_eq!(c.write(&[]).await.unwrap(), 0);
        assert_eq!(c.write_vectored(&[]).await.unwrap(), 0);
        let iov = [
            io::IoSlice::new(b""),
            io::IoSlice::new(b"ab"),
            io::IoSlice::new(b""),
            io::IoSlice::new(b"c"),
        ];
        assert_eq!(c.write_vectored(&iov).await.unwrap(), 3);
        s.readable().await.unwrap();
        assert_eq!(s.read(&mut []).await.unwrap(), 0);
        let mut three = [0u8; 3];
        s.read_exact(&mut three).await.unwrap();
        assert_eq!(&three, b"abc");
        // Fill the window: a zero-length write still does not wait.
        let big = vec![1u8; 64 << 10];
        loop {
            match c.try_write(&big) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        let r =
            std::future::poll_fn(|cx| Poll::Ready(std::pin::Pin::new(&mut c).poll_write(cx, &[])))
                .await;
        assert!(matches!(r, Poll::Ready(Ok(0))), "{r:?}");
        c.shutdown().await.unwrap();
        c.shutdown().await.unwrap();
        let e = c.write(b"x").await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe, "{e}");
        // As Linux's `send` of nothing on a shut-down socket.
        let e = c.write(&[]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe, "{e}");
        let mut sink = Vec::new();
        s.read_to_end(&mut sink).await.unwrap();
        assert!(!sink.is_empty());
        drop((c, s));
    });
    wait_pool_whole(&mgr);
}

/// A stream dropped with bytes it never read resets its peer (as TCP
/// sends a RST): the peer's read says `ConnectionReset`, its write fails.
#[test]
fn dropping_a_stream_with_unread_bytes_resets_the_peer() {
    let (mgr, p) = setup("unread");
    rt(1).block_on(async {
        let (mut c, s) = connected(&p, "10.4.0.62:80").await;
        c.write_all(b"never read").await.unwrap();
        s.readable().await.unwrap();
        drop(s);
        let mut b = [0u8; 8];
        let e = tokio::time::timeout(WATCHDOG, c.read(&mut b))
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}");
        // As tokio's (since 1.46, which maps Linux's `NotConnected` to
        // success): shutting a reset stream down succeeds.
        c.shutdown().await.unwrap();
        drop(c);
    });
    wait_pool_whole(&mgr);
}

/// A runtime dropped while its tasks hold X-IO streams (reads pending,
/// writes waiting for a full window, received `Bytes` held): the drop
/// does not hang, every peer sees its stream end (end of stream or a
/// reset), and every buffer goes back to the pool. Both flavours: a
/// current_thread runtime's tasks are dropped where they stopped when its
/// last `block_on` returned.
#[test]
fn a_runtime_dropped_with_streams_in_tasks_returns_every_buffer() {
    runtime_dropped_with_streams_in_tasks("rtdrop-mt", "10.4.0.63:80", || rt(2));
    runtime_dropped_with_streams_in_tasks("rtdrop-ct", "10.4.0.69:80", current_thread_runtime);
}

fn runtime_dropped_with_streams_in_tasks(
    test: &str,
    addr: &'static str,
    make: fn() -> tokio::runtime::Runtime,
) {
    let (mgr, p) = setup(test);
    let cli = Net::attach(&p).unwrap();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let p2 = p.clone();
    let server = std::thread::spawn(move || {
        let rt = make();
        rt.block_on(async {
            let srv = Net::attach(&p2).unwrap();
            let l = XioListener::bind_with(&srv, addr).unwrap();
            ready_tx.send(()).unwrap();
            for i in 0..6 {
                let (mut s, _) = l.accept().await.unwrap();
                let ready = ready_tx.clone();
                tokio::spawn(async move {
                    match i % 3 {
                        // Holds a received buffer, then waits on a read.
                        0 => {
                            let held = s.recv_bytes().await.unwrap().unwrap();
                            ready.send(()).unwrap();
                            let mut b = [0u8; 1];
                            let _ = s.read(&mut b).await;
                            drop(held);
                        }
                        // Writes into a full window (the client never reads).
                        1 => {
                            let big = vec![3u8; 8 << 20];
                            ready.send(()).unwrap();
                            let _ = s.write_all(&big).await;
                        }
                        // Split halves in two tasks, both waiting.
                        _ => {
                            let (mut r, mut w) = s.into_split();
                            tokio::spawn(async move {
                                let big = vec![4u8; 8 << 20];
                                let _ = w.write_all(&big).await;
                            });
                            ready.send(()).unwrap();
                            let mut b = [0u8; 1];
                            let _ = r.read(&mut b).await;
                        }
                    }
                });
            }
            // Keep the listener in a task too.
            tokio::spawn(async move {
                let _ = l.accept().await;
            });
            // Let the tasks run to where they wait (a current_thread
            // runtime runs them only in here).
            tokio::time::sleep(Duration::from_millis(200)).await;
        });
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(rt);
            tx.send(()).unwrap();
        });
        rx.recv_timeout(WATCHDOG).expect("the runtime's drop hung");
    });
    rt(1).block_on(async {
        ready_rx.recv().unwrap();
        let mut cs = Vec::new();
        for i in 0..6 {
            let mut c = XioStream::connect_with(&cli, addr).await.unwrap();
            if i % 3 == 0 {
                c.write_all(b"hold me").await.unwrap();
            }
            cs.push(c);
        }
        for _ in 0..6 {
            tokio::task::block_in_place(|| ready_rx.recv().unwrap());
        }
        server.join().unwrap();
        // Every peer sees its stream end, after whatever was in flight.
        for mut c in cs {
            let mut b = vec![0u8; 64 << 10];
            tokio::time::timeout(WATCHDOG, async {
                loop {
                    match c.read(&mut b).await {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
            })
            .await
            .expect("the peer never saw the stream end");
        }
    });
    drop(cli);
    wait_pool_whole(&mgr);
}

/// The CPU time used so far by this process's threads named `name`.
fn cpu_of_threads(name: &str) -> Duration {
    let tick = 100u64; // USER_HZ on Linux
    let mut ticks = 0u64;
    let mut found = 0;
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // Fields after the ")" of the command: state is field 3, utime 14, stime 15.
        let Some(rest) = stat.rsplit_once(')').map(|x| x.1) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        found += 1;
        ticks += f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    }
    assert!(found > 0, "no thread named {name}");
    Duration::from_millis(ticks * 1000 / tick)
}

/// Many idle streams, each with a task waiting to read, burn no CPU: the
/// driver sleeps on the doorbell. A spinning driver or task would use
/// about a core; the bound is a quarter of one.
#[test]
fn many_idle_streams_burn_no_cpu() {
    let (mgr, p) = setup("idlecpu");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("xio-idle-rt")
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let srv = Net::attach(&p).unwrap();
        let cli = Net::attach(&p).unwrap();
        let l = XioListener::bind_with(&srv, "10.4.0.64:80").unwrap();
        let mut tasks = Vec::new();
        for _ in 0..200 {
            let mut c = XioStream::connect_with(&cli, "10.4.0.64:80").await.unwrap();
            let (mut s, _) = l.accept().await.unwrap();
            c.write_all(b"x").await.unwrap();
            let mut one = [0u8; 1];
            s.read_exact(&mut one).await.unwrap();
            tasks.push(tokio::spawn(async move {
                let mut b = [0u8; 16];
                let _ = c.read(&mut b).await;
                c
            }));
            tasks.push(tokio::spawn(async move {
                let mut b = [0u8; 16];
                let _ = s.read(&mut b).await;
                s
            }));
        }
        // Settle (the adaptive watch ends when nothing comes), then measure.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = cpu_of_threads("xio-idle-rt");
        tokio::task::block_in_place(|| std::thread::sleep(Duration::from_secs(2)));
        let used = cpu_of_threads("xio-idle-rt") - before;
        println!("idle CPU over 2 s: {used:?}");
        assert!(
            used < Duration::from_millis(500),
            "idle streams used {used:?} of CPU in 2 s"
        );
        for t in tasks {
            t.abort();
        }
        drop(l);
    });
    drop(rt);
    wait_pool_whole(&mgr);
}

/// A `connect` that waits for the manager (the first to its address),
/// dropped mid-way, leaves no connection behind the listener could wait
/// on for good, and a later connect works.
#[test]
fn a_cancelled_first_connect_leaves_nothing_behind() {
    let (mgr, p) = setup("cancelconn");
    rt(2).block_on(async {
        let srv = Net::attach(&p).unwrap();
        let l = XioListener::bind_with(&srv, "10.4.0.65:80").unwrap();
        for _ in 0..20 {
            let cli = Net::attach(&p).unwrap();
            // Polled once (it goes to a blocking thread), then dropped.
            let _ = tokio::time::timeout(
                Duration::from_micros(1),
                XioStream::connect_with(&cli, "10.4.0.65:80"),
            )
            .await;
            let mut c = XioStream::connect_with(&cli, "10.4.0.65:80").await.unwrap();
            c.write_all(b"z").await.unwrap();
            // What the cancelled connect made (if anything) reads end of stream.
            loop {
                let (mut s, _) = tokio::time::timeout(WATCHDOG, l.accept())
                    .await
                    .unwrap()
                    .unwrap();
                let mut b = [0u8; 1];
                let n = tokio::time::timeout(WATCHDOG, s.read(&mut b))
                    .await
                    .unwrap()
                    .unwrap();
                if n == 1 {
                    assert_eq!(&b, b"z");
                    break;
                }
            }
        }
        drop(l);
    });
    wait_pool_whole(&mgr);
}

/// Both ends split (`tokio::io::split` on one, `into_split` on the
/// other), each half in its own task on a 4-worker runtime, both
/// directions at once: everything arrives.
#[test]
fn split_halves_full_duplex_on_a_multi_thread_runtime() {
    let (mgr, p) = setup("duplex");
    rt(4).block_on(async {
        let (c, s) = connected(&p, "10.4.0.68:80").await;
        let (mut cr, mut cw) = tokio::io::split(c);
        let (mut sr, mut sw) = s.into_split();
        let total = 5_000_000u64;
        async fn send(w: &mut (impl tokio::io::AsyncWrite + Unpin), seed: u64, total: u64) {
            let mut sent = 0u64;
            while sent < total {
                let n = 7001.min(total - sent);
                let chunk: Vec<u8> = (sent..sent + n).map(|i| stream_byte(seed, i)).collect();
                w.write_all(&chunk).await.unwrap();
                sent += n;
            }
            w.shutdown().await.unwrap();
        }
        async fn recv(r: &mut (impl tokio::io::AsyncRead + Unpin), seed: u64) -> u64 {
            let mut got = 0u64;
            let mut buf = vec![0u8; 5000];
            loop {
                let n = r.read(&mut buf).await.unwrap();
                if n == 0 {
                    return got;
                }
                for (k, &b) in buf[..n].iter().enumerate() {
                    assert_eq!(b, stream_byte(seed, got + k as u64));
                }
                got += n as u64;
            }
        }
        let t1 = tokio::spawn(async move {
            send(&mut cw, 1, total).await;
            cw
        });
        let t2 = tokio::spawn(async move {
            send(&mut sw, 2, total).await;
            sw
        });
        let t3 = tokio::spawn(async move { (recv(&mut cr, 2).await, cr) });
        let t4 = tokio::spawn(async move { (recv(&mut sr, 1).await, sr) });
        let all = tokio::time::timeout(WATCHDOG, async {
            let (a, b, c, d) = tokio::join!(t1, t2, t3, t4);
            (a.unwrap(), b.unwrap(), c.unwrap(), d.unwrap())
        })
        .await
        .expect("watchdog");
        assert_eq!((all.2).0, total);
        assert_eq!((all.3).0, total);
        drop(all);
    });
    wait_pool_whole(&mgr);
}

/// What `tokio::spawn` needs of the futures a ported service awaits.
#[test]
fn the_futures_are_send() {
    fn send<T: Send>(_: &T) {}
    fn check(l: &XioListener, s: &mut XioStream, net: &Net, b: xio_tokio::BufMut) {
        send(&l.accept());
        send(&XioStream::connect("10.0.0.1:80"));
        send(&XioStream::connect_with(net, "10.0.0.1:80"));
        send(&XioListener::bind("10.0.0.1:80"));
        send(&s.readable());
        send(&s.writable());
        send(&s.ready(Interest::READABLE));
        send(&s.recv_bytes());
        send(&s.alloc(10));
        send(&s.connected());
        send(&s.read(&mut []));
        send(&s.send_buf(b));
    }
    let _ = check;
}

/// A readiness wait that cannot wait (no driver can serve it: here,
/// polled outside any runtime while the net's only driver is a
/// current_thread runtime's) fails, as `read` does: it must not report
/// the stream readable, or a `readable().await?; try_read()` loop spins
/// on `WouldBlock` for good.
#[test]
fn a_readiness_wait_without_a_driver_fails_instead_of_reporting_ready() {
    use std::task::{Context, Poll};
    let (_mgr, p) = setup("nodriver");
    let rt = current_thread_runtime();
    let (c, s) = rt.block_on(connected(&p, "10.4.0.67:80"));
    // An accepted stream starts read-ready, as tokio's: the read that
    // finds nothing clears that.
    assert_eq!(
        s.try_read(&mut [0u8; 1]).unwrap_err().kind(),
        io::ErrorKind::WouldBlock
    );
    let (_flag, w) = flag_waker();
    let mut cx = Context::from_waker(&w);
    // Outside the runtime: nothing would wake the task.
    let mut one = [0u8; 1];
    let mut read = std::pin::pin!(s.peek(&mut one));
    assert!(matches!(read.as_mut().poll(&mut cx), Poll::Ready(Err(_))));
    assert!(
        matches!(s.poll_read_ready(&mut cx), Poll::Ready(Err(_))),
        "poll_read_ready reported ready without a driver"
    );
    let mut readable = std::pin::pin!(s.readable());
    match readable.as_mut().poll(&mut cx) {
        Poll::Ready(Err(_)) => {}
        other => panic!("readable without a driver: {other:?}"),
    }
    let mut ready = std::pin::pin!(s.ready(Interest::READABLE));
    match ready.as_mut().poll(&mut cx) {
        Poll::Ready(Err(_)) => {}
        other => panic!("ready(READABLE) without a driver: {other:?}"),
    }
    assert_eq!(
        s.try_read(&mut [0u8; 1]).unwrap_err().kind(),
        io::ErrorKind::WouldBlock
    );
    drop(c);
}

/// A runtime dropped while a stream's close waits behind a full ring to
/// its peer, the net kept (as `Net::global` keeps it): the peer still
/// reads what was written, then end of stream, as a TCP peer would once
/// the kernel sent the closed socket's data. (No driver was left to retry
/// the queued FIN: the peer waited for good.)
#[test]
fn a_close_queued_behind_a_full_ring_leaves_when_the_runtime_drops() {
    use std::io::Read;
    drop(setup("fullring-drop"));
    let p = format!("tt-fullring-drop-{}", std::process::id());
    let pool = xio_core::layout::PoolConfig {
        ring_capacity: 4,
        ..Default::default()
    };
    let _mgr = Manager::builder(&p).pool(pool).spawn().unwrap();
    let srv = Net::attach(&p).unwrap();
    let cli = Net::attach(&p).unwrap();
    let l = srv.listen("10.4.0.70:80").unwrap();
    let a = rt(1);
    let l = a.block_on(async { XioListener::from_std(l).unwrap() });
    // A blocking client: nobody drains its ring until it reads.
    let c = cli.connect("10.4.0.70:80").unwrap();
    let (wrote_tx, wrote_rx) = std::sync::mpsc::channel();
    a.spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        // Small writes, each a descriptor: the 4-slot ring fills.
        for i in 0..64u32 {
            s.write_all(&[i as u8; 100]).await.unwrap();
            wrote_tx.send(i).unwrap();
        }
        s.shutdown().await.unwrap();
        std::future::pending::<()>().await;
    });
    // Wait until the writes stall (or finish), then drop the runtime.
    let mut written = 0usize;
    while wrote_rx.recv_timeout(Duration::from_millis(300)).is_ok() {
        written += 1;
    }
    drop(a);
    c.set_read_timeout(Some(WATCHDOG)).unwrap();
    let mut got = Vec::new();
    let r = (&c).read_to_end(&mut got);
    assert!(
        r.is_ok(),
        "the peer never saw the stream end: {r:?} after {} bytes",
        got.len()
    );
    // Every write that returned was sent (a stalled one may have sent a
    // prefix of its own too).
    assert!(got.len() >= 100 * written, "{} bytes", got.len());
    for (k, &b) in got.iter().enumerate() {
        assert_eq!(b, (k / 100) as u8, "byte {k}");
    }
    drop(srv);
}

/// The conversions tokio's `TcpStream` and `TcpListener` have, between the
/// tokio types and the core's (std-like) ones: a stream moved to blocking
/// code and back keeps its connection and its bytes, in order.
#[test]
fn into_std_from_std_and_try_from() {
    let (_mgr, p) = setup("convert");
    rt(2).block_on(async {
        let srv = Net::attach(&p).unwrap();
        let cli = Net::attach(&p).unwrap();
        let l = XioListener::bind_with(&srv, "10.4.0.11:80").unwrap();
        // Listener: to the core type and back, both ways.
        let core_l = l.into_std().unwrap();
        let l = XioListener::try_from(core_l.try_clone().unwrap()).unwrap();
        drop(core_l);
        let mut c = XioStream::connect_with(&cli, "10.4.0.11:80").await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        c.write_all(b"to blocking").await.unwrap();
        // Stream: into the core type (non-blocking, as tokio's into_std),
        // used from a blocking thread, then back.
        let std_s = s.into_std().unwrap();
        let std_s = tokio::task::spawn_blocking(move || {
            use std::io::Read;
            assert_eq!(
                (&std_s).read(&mut [0u8; 1]).map_err(|e| e.kind()).ok(),
                Some(1),
                "a byte was there"
            );
            std_s.set_nonblocking(false).unwrap();
            let mut b = [0u8; 10];
            (&std_s).read_exact(&mut b).unwrap();
            assert_eq!(&b, b"o blocking");
            (&std_s).write_all(b"from blocking").unwrap();
            std_s
        })
        .await
        .unwrap();
        let mut s = XioStream::try_from(std_s).unwrap();
        let mut b = [0u8; 13];
        c.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"from blocking");
        // The stream is async again: a read waits for the peer.
        let (n, ()) = tokio::join!(s.read(&mut b), async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            c.write_all(b"async").await.unwrap();
        });
        assert_eq!(&b[..n.unwrap()], b"async");
        let s2 = XioStream::from_std(s.into_std().unwrap()).unwrap();
        drop(c);
        let mut rest = Vec::new();
        let mut s2 = s2;
        assert_eq!(s2.read_to_end(&mut rest).await.unwrap(), 0);
    });
}
