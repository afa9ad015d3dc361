use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::atomic::Ordering as AtomicOrdering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::conn::ConnId;
use crate::stack::PeerId;

use super::data::rewind;
use super::syn::{client_addr, decode_syn, put_addr, ADDR_LEN, SYN_LEN};
use super::waiters::{Key, WaitEntry};
use super::{Event, Net, XioListener, XioStream};

/// Every connection slot of a table gets its own client address, the
/// 2^20 of them, not only the first 64,512 (found in review: they
/// repeated every 64,512 slots).
#[test]
fn client_addresses_are_unique_over_a_whole_table() {
    let v4: SocketAddr = "10.1.2.3:80".parse().unwrap();
    let mut seen = std::collections::HashSet::new();
    for i in 0..crate::conn::MAX_CONNS as u32 {
        // A generation in the high bits changes nothing.
        let c = ConnId(7 << 20 | i);
        assert!(seen.insert(client_addr(PeerId(300), c, &v4)), "slot {i}");
    }
    assert_eq!(
        client_addr(PeerId(300), ConnId(0), &v4).to_string(),
        "127.88.1.44:1024"
    );
    let v6: SocketAddr = "[::1]:80".parse().unwrap();
    assert_eq!(
        client_addr(PeerId(300), ConnId(0), &v6).to_string(),
        "[::ffff:127.88.1.44]:1024"
    );
}

#[test]
fn syn_encoding_round_trips_and_rejects_garbage() {
    let t: SocketAddr = "10.1.2.3:80".parse().unwrap();
    let s: SocketAddr = "[fe80::1]:4242".parse().unwrap();
    let mut b = vec![0u8; SYN_LEN];
    b[0] = 1;
    put_addr(&mut b[1..1 + ADDR_LEN], &t);
    put_addr(&mut b[1 + ADDR_LEN..], &s);
    assert_eq!(decode_syn(&b), Some((t, s)));
    assert_eq!(decode_syn(&b[..SYN_LEN - 1]), None);
    b[1] = 9;
    assert_eq!(decode_syn(&b), None);
    b[1] = 4;
    b[0] = 2;
    assert_eq!(decode_syn(&b), None);
}

/// A manager of this test process's own (prefix `unit-<name>-<pid>`),
/// a server net listening at `addr`, and a client net.
fn two_nets(
    name: &str,
    addr: SocketAddr,
) -> (crate::manager::ManagerHandle, Net, Net, XioListener) {
    crate::paths::use_test_run_dir();
    let p = format!("unit-{name}-{}", std::process::id());
    let m = crate::Manager::builder(&p).spawn().unwrap();
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let l = server.listen(addr).unwrap();
    (m, server, client, l)
}

/// A drain that fails inside [`Net::poll_nowait`] after it collected
/// events (a control message the stack could not act on, say) lost
/// them: they were returned with the error, which the C ABI's
/// `xio_net_poll` turns into an error code alone, and taken out of
/// the net. And the doorbell, not armed when the rings held more,
/// was not rung either, so a loop asleep on the fd slept on it. Now
/// the events are returned, the error comes with the next call, and
/// the fd is readable to bring the loop back for it.
#[test]
fn a_drain_failing_in_poll_nowait_loses_no_event() {
    use std::io::Write;
    let addr: SocketAddr = "10.9.9.1:80".parse().unwrap();
    let (_m, server, client, l) = two_nets("drive-fails", addr);
    let mut c = client.connect(addr).unwrap();
    let (s, _) = l.accept().unwrap();
    s.set_nonblocking(true).unwrap();
    s.set_token(7);
    let fd = server.poll_fd().unwrap();
    let readable = || {
        let mut p = [rustix::event::PollFd::new(
            &fd,
            rustix::event::PollFlags::IN,
        )];
        let now = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        rustix::event::poll(&mut p, Some(&now)).unwrap() == 1
    };
    let mut events = Vec::new();
    // Quiet: nothing left to report, the fd not readable.
    for _ in 0..10_000 {
        events.clear();
        server.poll_nowait(&mut events).unwrap();
        if !readable() {
            break;
        }
    }
    assert!(!readable(), "the fd never went quiet");
    c.write_all(b"x").unwrap();
    server.lock().fail_drive = true;
    let mut got = Vec::new();
    let r = server.poll_nowait(&mut got);
    assert!(
        matches!(r, Ok(n) if n == got.len())
            && got.iter().any(|e| matches!(
                e,
                Event::Stream {
                    token: 7,
                    readable: true,
                    ..
                }
            )),
        "{r:?} {got:?}"
    );
    assert!(readable(), "the loop is not brought back for the error");
    let e = server.poll_nowait(&mut got).unwrap_err();
    assert!(e.to_string().contains("injected"), "{e}");
    // Then the net goes on as before.
    got.clear();
    server.poll_nowait(&mut got).unwrap();
}

/// A waker that counts its wake-ups.
#[derive(Default)]
struct Count(std::sync::atomic::AtomicUsize);

impl std::task::Wake for Count {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.fetch_add(1, AtomicOrdering::Relaxed);
    }
}

fn wakes(c: &Count) -> usize {
    c.0.load(AtomicOrdering::Relaxed)
}

/// A stream polled from ever new tasks while nothing arrives (a
/// `readable()` raced against a timeout in a loop, each round a new
/// task) once kept every task's waker until data came: the list grew
/// by one per task, without bound. A `poll_*` method keeps the last
/// task's waker only, and a future's entry leaves with the future, so
/// the list holds what waits; and every future still waiting, however
/// many, is woken once when data comes, never before.
#[test]
fn wakers_of_tasks_gone_do_not_pile_up() {
    use std::io::Write;
    use std::task::{Context, Waker};
    let addr: SocketAddr = "10.9.9.2:80".parse().unwrap();
    let (_m, server, client, l) = two_nets("wakers-pile", addr);
    let pair = || {
        let c = client.connect(addr).unwrap();
        (c, l.accept().unwrap().0)
    };
    let cx_of = |w: &Arc<Count>| Waker::from(w.clone());
    let tasks_on = |s: &XioStream| {
        server
            .lock()
            .waiters
            .get(&Key::Read(s.inner.id))
            .map_or(0, |ws| ws.list.len())
    };

    // Ever new tasks through the slot: one waker kept, the last.
    let (_c, s) = pair();
    let mut last = Arc::default();
    for _ in 0..1000 {
        last = Arc::default();
        let w = cx_of(&last);
        assert!(s
            .poll_read(&mut Context::from_waker(&w), &mut [0u8; 8])
            .is_pending());
    }
    assert_eq!(tasks_on(&s), 1);

    // Ever new futures, each dropped: nothing kept.
    for _ in 0..1000 {
        let mut e = WaitEntry::default();
        let w = cx_of(&Arc::default());
        assert!(s
            .poll_peek_ready_entry(&mut Context::from_waker(&w), &mut e, &mut [0u8; 1])
            .is_pending());
    }
    assert_eq!(tasks_on(&s), 1);

    // Many futures that keep waiting (polled once each, never again):
    // none is woken before data comes, and all are woken when it does.
    let (mut c, s) = pair();
    let live: Vec<Arc<Count>> = (0..500).map(|_| Arc::default()).collect();
    let mut entries: Vec<WaitEntry> = live.iter().map(|_| WaitEntry::default()).collect();
    for (w, e) in live.iter().zip(&mut entries) {
        let w = cx_of(w);
        assert!(s
            .poll_peek_ready_entry(&mut Context::from_waker(&w), e, &mut [0u8; 1])
            .is_pending());
    }
    assert_eq!(tasks_on(&s), live.len());
    assert!(live.iter().all(|w| wakes(w) == 0), "woken before any data");
    c.write_all(b"x").unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while live.iter().any(|w| wakes(w) == 0) {
        assert!(Instant::now() < deadline, "a waiting future was not woken");
        server.drive(false, false).unwrap();
        std::thread::yield_now();
    }
    assert!(live.iter().all(|w| wakes(w) == 1));
    drop(entries);
    assert_eq!(tasks_on(&s), 0);
    let _ = last;
}

#[test]
fn rewind_crosses_slices() {
    let a = [1u8; 3];
    let b = [2u8; 4];
    let bufs = [IoSlice::new(&a), IoSlice::new(&b)];
    let mut cur = (1, 2);
    rewind(&mut cur, &bufs, 4);
    assert_eq!(cur, (0, 1));
}
