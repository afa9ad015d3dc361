//! The manager's control socket treats its input as untrusted: malformed,
//! truncated, oversized or out-of-order messages get an error reply or a
//! closed socket, and the manager keeps serving everyone else.

mod common;

use std::os::fd::{AsFd, OwnedFd};

use common::*;
use xio_core::ctrl;
use xio_core::prelude::*;
use xio_core::proto::Msg;

/// Entry point of child processes (a no-op when run as a normal test).
#[test]
fn child_main() {
    let Some((role, a)) = child_role() else {
        return;
    };
    match role.as_str() {
        "manager" => {
            let m = manager_builder(&a[0]).bind().unwrap();
            println!("XIO:ready");
            m.run().unwrap();
        }
        "asks_then_exits" => asks_then_exits(&a[0], a[1].parse().unwrap(), &a[2]),
        r => panic!("unknown role {r}"),
    }
}

/// Child role: registers as a raw stack, waits for "go" on stdin, then
/// (when `how` is "cut": sends a bad message that gets it cut off, and
/// waits for "go" again) asks for a channel to `addr` and a binding of
/// `addr`'s port + 1, and exits without waiting for the answers.
fn asks_then_exits(prefix: &str, addr: std::net::SocketAddr, how: &str) {
    let s = raw_conn(prefix);
    let hello = Msg::Hello {
        pid: 1,
        name: "asks-then-exits".into(),
    };
    ctrl::send(s.as_fd(), &hello, &[]).unwrap();
    let (m, _fds) = ctrl::recv(s.as_fd(), false).unwrap();
    let Msg::Welcome { stack_id, .. } = m else {
        panic!("expected Welcome, got {m:?}");
    };
    println!("XIO:ready {stack_id}");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    if how == "cut" {
        send_lying_connect(&s);
        println!("XIO:cut");
        std::io::stdin().read_line(&mut line).unwrap();
    }
    ctrl::send(s.as_fd(), &Msg::Connect { addr }, &[]).unwrap();
    let other = std::net::SocketAddr::new(addr.ip(), addr.port() + 1);
    ctrl::send(s.as_fd(), &Msg::Bind { addr: other }, &[]).unwrap();
    std::process::exit(0);
}

fn raw_conn(prefix: &str) -> std::os::fd::OwnedFd {
    ctrl::connect(&xio_core::paths::socket_path(prefix)).unwrap()
}

/// Sends raw bytes; returns the reply (None if the socket was closed).
fn exchange(prefix: &str, bytes: &[u8]) -> Option<Msg> {
    let s = raw_conn(prefix);
    let n = rustix::net::send(&s, bytes, rustix::net::SendFlags::NOSIGNAL).unwrap();
    assert_eq!(n, bytes.len());
    match ctrl::recv(s.as_fd(), false) {
        Ok((m, _)) => Some(m),
        Err(_) => None,
    }
}

/// The protocol version this side speaks.
const V: u8 = xio_core::proto::PROTO_VERSION;

fn header(version: u8, ty: u8, len: u32) -> Vec<u8> {
    let mut h = b"XI".to_vec();
    h.push(version);
    h.push(ty);
    h.extend_from_slice(&len.to_le_bytes());
    h
}

/// From a registered stack's socket `s`: a Connect whose length field
/// lies. The manager answers with an error (and reads no more from it).
fn send_lying_connect(s: &std::os::fd::OwnedFd) {
    rustix::net::send(s, &header(V, 5, u32::MAX), rustix::net::SendFlags::NOSIGNAL).unwrap();
    assert!(matches!(
        ctrl::recv(s.as_fd(), false),
        Ok((Msg::Error { .. }, _))
    ));
}

#[test]
fn malformed_control_messages_get_errors_and_the_manager_survives() {
    setup();
    let p = prefix("malformed");
    let mgr = Manager::builder(&p).spawn().unwrap();

    let mut oversized = header(V, 1, 9000);
    oversized.resize(8 + 9000, 0xAB);
    let mut long_name = header(V, 1, 4 + 2 + 200);
    long_name.extend_from_slice(&1u32.to_le_bytes());
    long_name.extend_from_slice(&200u16.to_le_bytes());
    long_name.extend(std::iter::repeat_n(b'a', 200));
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", b"hello manager, please crash".to_vec()),
        ("one byte", vec![0]),
        ("wrong version", header(9, 1, 0)),
        // A client of version 1, which had no status report in a memfd.
        ("old version", header(1, 11, 0)),
        ("unknown type", header(V, 250, 0)),
        ("length mismatch", header(V, 1, 100)),
        ("truncated hello", {
            let mut h = header(V, 1, 3);
            h.extend_from_slice(&[1, 2, 3]);
            h
        }),
        ("oversized", oversized),
        ("name too long", long_name),
        (
            "bind before hello",
            Msg::Bind {
                addr: "1.2.3.4:5".parse().unwrap(),
            }
            .encode(),
        ),
        (
            "reply type from a client",
            Msg::Welcome {
                stack_id: 1,
                generation: 1,
            }
            .encode(),
        ),
        (
            "status reply from a client",
            Msg::StatusReplyFd { len: 5 }.encode(),
        ),
    ];
    for (what, bytes) in &cases {
        match exchange(&p, bytes) {
            Some(Msg::Error { .. }) | None => {}
            Some(other) => panic!("{what}: expected an error, got {other:?}"),
        }
    }
    // A registered stack that then sends garbage is cut off (its resources
    // reclaimed once it closes) without disturbing others.
    let mut good = Stack::attach(&p).unwrap();
    good.bind("10.1.1.1:1".parse().unwrap()).unwrap();
    {
        let s = raw_conn(&p);
        ctrl::send(
            s.as_fd(),
            &Msg::Hello {
                pid: 1,
                name: "evil".into(),
            },
            &[],
        )
        .unwrap();
        let (m, fds) = ctrl::recv(s.as_fd(), false).unwrap();
        assert!(matches!(m, Msg::Welcome { .. }));
        assert_eq!(fds.len(), 2);
        send_lying_connect(&s);
    }
    let snap = mgr.snapshot();
    assert!(snap.bad_messages >= cases.len() as u64, "{snap:?}");
    // Still serving: a new client connects to the good stack and talks.
    let mut c = Stack::attach(&p).unwrap();
    let peer = c.connect("10.1.1.1:1".parse().unwrap()).unwrap();
    let mut b = c.alloc(3).unwrap();
    b.copy_from(b"abc");
    c.send(peer, b).unwrap();
    assert_eq!(&good.recv_timeout(WATCHDOG).unwrap().buf[..], b"abc");
    let status = xio_core::manager::query_status(&p).unwrap();
    assert!(status.contains("10.1.1.1:1"), "{status}");
    drop((c, good));
    wait_pool_whole(&mgr);
}

/// A registered stack that sends a malformed message is cut off, but its
/// process lives on and may hold buffers, and be inside a free-list
/// operation: what it holds must not go back to the pool (to be handed to
/// another stack while it still writes them) before its socket closes.
#[test]
fn a_stack_cut_off_for_a_bad_message_keeps_its_buffers_until_it_exits() {
    use xio_core::layout::bufword;
    use xio_core::pool::{PoolView, StackPool};
    use xio_core::segment::{Region, Segment};
    setup();
    let p = prefix("cut-off");
    let mgr = Manager::builder(&p).spawn().unwrap();
    let s = raw_conn(&p);
    let hello = Msg::Hello {
        pid: 1,
        name: "buggy".into(),
    };
    ctrl::send(s.as_fd(), &hello, &[]).unwrap();
    let (m, mut fds) = ctrl::recv(s.as_fd(), false).unwrap();
    let Msg::Welcome { stack_id, .. } = m else {
        panic!("expected Welcome, got {m:?}");
    };
    let _bell = fds.pop().unwrap();
    let seg = Segment::open(Region::map_fd(fds.pop().unwrap()).unwrap()).unwrap();
    let pool = StackPool::new(PoolView::new(seg.clone()), stack_id);
    // The 1 MiB class: not cached, so nothing but this buffer is ours.
    let held = pool.alloc(1 << 20, true).unwrap();
    send_lying_connect(&s);
    // Answered after the bad message was handled. The report says the
    // stack was cut off, and why (it read as a stack that left of its
    // own accord).
    let status = xio_core::manager::query_status(&p).unwrap();
    let line = status
        .lines()
        .skip_while(|l| !l.trim_start().starts_with(&format!("stack {stack_id} ")))
        .nth(1)
        .unwrap_or_default();
    assert!(
        line.contains("cut off") && line.contains("bad control message"),
        "{status}"
    );
    let w = seg
        .buf_header(held.class as usize, held.index)
        .unwrap()
        .word
        .load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        (bufword::state(w), bufword::owner(w)),
        (bufword::ALLOCATED, stack_id),
        "a buffer still in use went back to the pool"
    );
    pool.free(held);
    drop(pool);
    drop(s);
    wait_pool_whole(&mgr);
}

#[test]
fn second_manager_on_a_prefix_is_refused() {
    setup();
    let p = prefix("second");
    let _m = Manager::builder(&p).spawn().unwrap();
    let e = Manager::builder(&p).bind().unwrap_err();
    assert!(e.to_string().contains("already running"), "{e}");
    let e = Manager::builder("bad/prefix").bind().unwrap_err();
    assert!(e.to_string().contains("invalid pool prefix"), "{e}");
}

/// A manager stopped cleanly leaves nothing in the run dir: its lock file
/// went with its socket. It stayed before, so every prefix ever run left
/// a `<prefix>.lock` behind. Removing it must not weaken the lock: while
/// a manager runs a second is still refused, and start/stop cycles on one
/// prefix keep working.
#[test]
fn a_clean_stop_leaves_neither_socket_nor_lock() {
    setup();
    let p = prefix("tidy");
    let sock = xio_core::paths::socket_path(&p);
    let lock = xio_core::paths::lock_path(&p);
    for round in 0..3 {
        let m = Manager::builder(&p).spawn().unwrap();
        assert!(sock.exists() && lock.exists(), "round {round}: running");
        let e = Manager::builder(&p).bind().unwrap_err();
        assert!(e.to_string().contains("already running"), "{e}");
        m.stop();
        assert!(!sock.exists(), "round {round}: socket left");
        assert!(!lock.exists(), "round {round}: lock file left");
    }
    // A manager bound, never run, and dropped leaves no lock either.
    drop(Manager::builder(&p).bind().unwrap());
    assert!(!lock.exists(), "lock file left by a dropped manager");
}

/// A manager bound and dropped without `run` (a program that failed
/// between `bind` and `run`) leaves nothing in the run dir: its socket
/// stayed before, a file nobody listens on, which whoever waits for the
/// socket to appear (a script, a test) takes for a running manager. It
/// removes only the socket it made: a file put at that path since is
/// someone else's.
#[test]
fn a_manager_dropped_without_running_leaves_nothing() {
    setup();
    let p = prefix("unrun");
    let sock = xio_core::paths::socket_path(&p);
    let lock = xio_core::paths::lock_path(&p);
    let staged = sock.with_extension("sock.new");
    let m = Manager::builder(&p).bind().unwrap();
    assert!(sock.exists() && lock.exists(), "bound");
    drop(m);
    assert!(!sock.exists(), "socket left by a manager never run");
    assert!(!lock.exists(), "lock file left by a manager never run");
    assert!(
        !staged.exists(),
        "staged socket left by a manager never run"
    );
    // Its socket replaced by another file: that one stays.
    let m = Manager::builder(&p).bind().unwrap();
    std::fs::remove_file(&sock).unwrap();
    std::fs::write(&sock, b"not the manager's").unwrap();
    drop(m);
    assert!(sock.exists(), "a file the manager did not make was removed");
    std::fs::remove_file(&sock).unwrap();
}

/// A test process's own dir (`<kind>-<pid>` in the temp dir) removes
/// those of its kind whose process is gone, and nothing else: each run
/// left one behind before (hundreds piled up).
#[test]
fn a_process_dir_removes_only_dead_processes_dirs_of_its_kind() {
    let tmp = std::env::temp_dir();
    let kind = format!("xio-tidy-check-{}", std::process::id());
    let mut child = std::process::Command::new("true").spawn().unwrap();
    child.wait().unwrap();
    let dead = child.id();
    let keep = [
        format!("{kind}-1"),                                       // alive (init)
        format!("{kind}-{}", std::os::unix::process::parent_id()), // alive
        format!("{kind}-{dead}x"),                                 // not the pattern
        format!("{kind}x-{dead}"),                                 // another kind
    ];
    let gone = format!("{kind}-{dead}");
    for d in keep.iter().chain([&gone]) {
        std::fs::create_dir_all(tmp.join(d).join("inside")).unwrap();
    }
    let own = process_dir(&kind);
    assert_eq!(own, tmp.join(format!("{kind}-{}", std::process::id())));
    assert!(own.is_dir());
    assert!(!tmp.join(&gone).exists(), "a dead process's dir stayed");
    for d in &keep {
        assert!(tmp.join(d).join("inside").is_dir(), "{d} removed");
        std::fs::remove_dir_all(tmp.join(d)).unwrap();
    }
    std::fs::remove_dir_all(own).unwrap();
}

/// A stack that leaves does not hand its id to the next one at once (ids
/// are given round-robin, as pids are): a peer still holding news of the
/// old one, a reset queued for its `recv`, must not take the newcomer for
/// it.
#[test]
fn a_departed_stacks_id_is_not_given_to_the_next_one() {
    setup();
    let p = prefix("idreuse");
    let mgr = manager_builder(&p).spawn().unwrap();
    let addr: std::net::SocketAddr = "10.62.0.1:9".parse().unwrap();
    let mut first = Stack::attach(&p).unwrap();
    first.bind(addr).unwrap();
    let mut client = Stack::attach(&p).unwrap();
    let old = client.connect(addr).unwrap();
    drop(first);
    // The client hears of the departure at a send (and its recv will too).
    wait_until("the departure reaches the client", || {
        let b = client.alloc(8).unwrap();
        matches!(client.send(old, b), Err(Error::Reset(p)) if p == old)
    });
    // Its slot is free again once the client let go of the channel.
    wait_until("the manager frees the slot", || {
        let s = mgr.snapshot();
        s.stacks.len() == 1 && s.channels.is_empty()
    });
    let mut second = Stack::attach(&p).unwrap();
    second.bind(addr).unwrap();
    let new = client.connect(addr).unwrap();
    assert_ne!(new, old, "the newcomer got the departed stack's id");
    // The reset still queued is the old peer's, and names it.
    match client.recv_timeout(std::time::Duration::from_secs(5)) {
        Err(Error::Reset(p)) => assert_eq!(p, old),
        other => panic!("expected the old peer's reset, got {other:?}"),
    }
    drop((client, second));
}

/// Answering a message whose sender has left since is `Reset`, as a send
/// to a peer that died is, also once the receiver has heard of the
/// departure and holds the reset behind that peer's last messages. It
/// was `NotConnected` then, and the C echo example (`l2fwd_echo`), which
/// carries on after a reset, took that for fatal and exited when the
/// README's program sent its last buffer and closed.
#[test]
fn answering_a_peer_that_left_is_a_reset_while_its_reset_is_queued() {
    setup();
    let p = prefix("answerleft");
    let mgr = manager_builder(&p).spawn().unwrap();
    let addr: std::net::SocketAddr = "10.62.0.2:9".parse().unwrap();
    let mut server = Stack::attach(&p).unwrap();
    server.bind(addr).unwrap();
    let mut client = Stack::attach(&p).unwrap();
    let peer = client.connect(addr).unwrap();
    for _ in 0..2 {
        let b = client.alloc(8).unwrap();
        client.send(peer, b).unwrap();
    }
    drop(client);
    // The manager has told the server (its next receive reads that first).
    wait_until("the manager sees the client gone", || {
        mgr.snapshot().stacks.len() == 1
    });
    let mut from = None;
    for _ in 0..2 {
        let m = server.recv().unwrap();
        from = Some(m.from);
        match server.send(m.from, m.buf.into_mut()) {
            Err(Error::Reset(p)) => assert_eq!(p, m.from),
            other => panic!("answering a peer that left: {other:?}"),
        }
    }
    // And the receive still reports the reset, once.
    match server.recv_timeout(std::time::Duration::from_secs(5)) {
        Err(Error::Reset(p)) => assert_eq!(Some(p), from),
        other => panic!("expected the reset, got {other:?}"),
    }
    drop(server);
}

/// A raw client registered as a stack ("deaf": the tests decide when it
/// reads); its socket and stack id.
fn deaf_stack(prefix: &str) -> (std::os::fd::OwnedFd, u16) {
    raw_stack(prefix, "deaf")
}

/// A raw client registered as stack `name` (the test speaks the protocol
/// from there); its socket and stack id.
fn raw_stack(prefix: &str, name: &str) -> (std::os::fd::OwnedFd, u16) {
    let s = raw_conn(prefix);
    let hello = Msg::Hello {
        pid: 1,
        name: name.into(),
    };
    ctrl::send(s.as_fd(), &hello, &[]).unwrap();
    let (m, _fds) = ctrl::recv(s.as_fd(), false).unwrap();
    let Msg::Welcome { stack_id, .. } = m else {
        panic!("expected Welcome, got {m:?}")
    };
    (s, stack_id)
}

/// The control messages the manager holds for stack `id` (None: not
/// registered).
fn queued_for(mgr: &xio_core::manager::ManagerHandle, id: u16) -> Option<usize> {
    let s = mgr.snapshot();
    s.stacks.iter().find(|s| s.id == id).map(|s| s.queued)
}

/// Asks for the status on `deaf` without reading, until the manager holds
/// replies its socket has no room for. Returns how many were asked.
fn fill_until_queued(mgr: &xio_core::manager::ManagerHandle, deaf: &impl AsFd, id: u16) -> usize {
    let mut asked = 0usize;
    wait_until("the manager queues replies for the deaf stack", || {
        loop {
            match ctrl::send_nowait(deaf.as_fd(), &Msg::Status, &[]) {
                Ok(()) => asked += 1,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("send: {e}"),
            }
        }
        queued_for(mgr, id).unwrap_or(0) > 0
    });
    asked
}

/// A stack that stops reading its control socket (stopped, stuck, or
/// hostile) does not stop the manager: what does not fit in its socket
/// waits in the manager, which takes no more of its requests meanwhile and
/// goes on serving everyone else; once it reads again, every reply arrives,
/// in order.
#[test]
fn a_stack_that_does_not_read_its_replies_does_not_stall_the_manager() {
    setup();
    let p = prefix("deaf");
    let mgr = Manager::builder(&p).spawn().unwrap();
    let (deaf, stack_id) = deaf_stack(&p);
    let asked = fill_until_queued(&mgr, &deaf, stack_id);
    // Everyone else is still served.
    let status = xio_core::manager::query_status(&p).unwrap();
    assert!(
        status.contains("not reading its control socket"),
        "{status}"
    );
    let mut other = Stack::attach(&p).unwrap();
    other.bind("10.63.0.1:1".parse().unwrap()).unwrap();
    // Every request gets its reply once the deaf stack reads, nothing
    // more; the manager then has nothing left waiting.
    for i in 0..asked {
        match ctrl::recv_until(deaf.as_fd(), Some(std::time::Instant::now() + WATCHDOG)) {
            Ok((Msg::StatusReply { .. } | Msg::StatusReplyFd { .. }, _)) => {}
            other => panic!("reply {i} of {asked}: {other:?}"),
        }
    }
    wait_until("the queue empties", || {
        queued_for(&mgr, stack_id) == Some(0)
    });
    assert!(matches!(
        ctrl::recv(deaf.as_fd(), true),
        Err(ctrl::RecvError::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock
    ));
    drop((deaf, other));
    wait_pool_whole(&mgr);
}

/// A stack that does not read its control socket while ever more peers
/// open channels to it (each hands it two fds, which the manager holds
/// for it) gets no new channel once those fds reach the manager's limit:
/// connecting to it is refused, and it is not dropped (it may only be
/// stopped, and dropping a live process's stack would hand its buffers to
/// others). Once it reads, it gets every message, and new channels again.
#[test]
fn connects_to_a_stack_that_does_not_read_are_refused_past_the_fd_limit() {
    setup();
    // ~130 stacks in this process with the manager: more fds than the
    // usual soft limit of 1024.
    let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let want = lim.maximum.map_or(1 << 16, |h| h.min(1 << 16));
    let _ = rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: Some(want),
            maximum: lim.maximum,
        },
    );
    let p = prefix("deaffds");
    let mgr = Manager::builder(&p)
        .pool(PoolConfig {
            classes: vec![(2 << 10, 256)],
            max_stacks: 300,
            max_channels: 300,
            ring_capacity: 16,
            quotas: Vec::new(),
        })
        .spawn()
        .unwrap();
    let (deaf, stack_id) = deaf_stack(&p);
    let addr: std::net::SocketAddr = "10.64.0.1:1".parse().unwrap();
    ctrl::send(deaf.as_fd(), &Msg::Bind { addr }, &[]).unwrap();
    assert!(matches!(
        ctrl::recv(deaf.as_fd(), false).unwrap().0,
        Msg::Ok
    ));
    // A peer with a channel already (raw: a stack answers a second
    // connect from its own routes without asking).
    let (early, _) = deaf_stack(&p);
    let connect = |s: &std::os::fd::OwnedFd| {
        ctrl::send(s.as_fd(), &Msg::Connect { addr }, &[]).unwrap();
        let deadline = Some(std::time::Instant::now() + WATCHDOG);
        ctrl::recv_until(s.as_fd(), deadline).unwrap().0
    };
    assert!(matches!(
        connect(&early),
        Msg::Connected {
            existing: false,
            ..
        }
    ));
    // Its socket full of unread status replies, so what follows queues.
    let asked = fill_until_queued(&mgr, &deaf, stack_id);
    // Peers connect: each new channel queues two fds for it, until the
    // manager refuses.
    // (One fd each where the kernel has no pidfds.)
    let mut peers = Vec::new();
    let refusal = loop {
        assert!(peers.len() < 290, "connections were never refused");
        let mut s = Stack::attach(&p).unwrap();
        match s.connect(addr) {
            Ok(_) => peers.push(s),
            Err(
                e @ Error::Refused {
                    code: xio_core::proto::ErrorCode::Busy,
                    ..
                },
            ) => break e,
            Err(e) => panic!("connect {}: {e}", peers.len()),
        }
    };
    assert!(
        refusal
            .to_string()
            .contains("not reading its control socket"),
        "{refusal}"
    );
    assert!(peers.len() > 64, "refused after {} peers", peers.len());
    assert!(
        queued_for(&mgr, stack_id).is_some(),
        "the stack was dropped"
    );
    // A peer whose channel exists still gets it.
    assert!(matches!(
        connect(&early),
        Msg::Connected { existing: true, .. }
    ));
    // It reads: every reply, and a channel per peer (the early one's
    // too), with its fds.
    let (mut replies, mut channels) = (0, 0);
    while replies < asked || channels < peers.len() + 1 {
        let deadline = Some(std::time::Instant::now() + WATCHDOG);
        match ctrl::recv_until(deaf.as_fd(), deadline).unwrap() {
            // Long once the peers are there: read after they came.
            (Msg::StatusReply { .. } | Msg::StatusReplyFd { .. }, _) => replies += 1,
            (Msg::ChannelUp { .. }, fds) => {
                assert!(!fds.is_empty(), "a channel without its fds");
                channels += 1;
            }
            (other, _) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((replies, channels), (asked, peers.len() + 1));
    wait_until("the queue empties", || {
        queued_for(&mgr, stack_id) == Some(0)
    });
    // A new peer gets its channel again.
    let mut late = Stack::attach(&p).unwrap();
    late.connect(addr).unwrap();
    let deadline = Some(std::time::Instant::now() + WATCHDOG);
    assert!(matches!(
        ctrl::recv_until(deaf.as_fd(), deadline).unwrap().0,
        Msg::ChannelUp { .. }
    ));
    drop((deaf, early, late, peers));
    wait_pool_whole(&mgr);
}

/// A connect to an address that another process's stack binds exactly,
/// refused because that stack does not read its control socket, was
/// taken for the manager's refusal of an address that only our own
/// wildcard binding covers: a net listening on `0.0.0.0:port` connected
/// to itself, where `127.0.0.1:port` belongs to someone else. The
/// manager now refuses it with its own code (`ErrorCode::Busy`), which
/// the net passes on as a refusal.
#[test]
fn a_connect_refused_for_a_stack_that_does_not_read_does_not_reach_our_own_wildcard() {
    setup();
    raise_fd_limit();
    let p = prefix("deafwild");
    let mgr = Manager::builder(&p)
        .pool(PoolConfig {
            classes: vec![(2 << 10, 256)],
            max_stacks: 300,
            max_channels: 300,
            ring_capacity: 16,
            quotas: Vec::new(),
        })
        .spawn()
        .unwrap();
    let port = 40000 + (std::process::id() % 20000) as u16;
    let exact: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    // A stack that binds the exact address, then stops reading.
    let (deaf, stack_id) = deaf_stack(&p);
    ctrl::send(deaf.as_fd(), &Msg::Bind { addr: exact }, &[]).unwrap();
    assert!(matches!(
        ctrl::recv(deaf.as_fd(), false).unwrap().0,
        Msg::Ok
    ));
    fill_until_queued(&mgr, &deaf, stack_id);
    // Peers' new channels fill what the manager may hold for it.
    let mut peers = Vec::new();
    loop {
        assert!(peers.len() < 290, "connections were never refused");
        let (s, _) = deaf_stack(&p);
        ctrl::send(s.as_fd(), &Msg::Connect { addr: exact }, &[]).unwrap();
        let deadline = Some(std::time::Instant::now() + WATCHDOG);
        match ctrl::recv_until(s.as_fd(), deadline).unwrap().0 {
            Msg::Connected { .. } => peers.push(s),
            Msg::Error { message, .. } => {
                assert!(
                    message.contains("not reading its control socket"),
                    "{message}"
                );
                break;
            }
            other => panic!("connect {}: {other:?}", peers.len()),
        }
    }
    // A net of ours listening on the port's wildcard connects to the
    // exact address.
    let net = xio_core::net::Net::attach(&p).unwrap();
    net.set_control_timeout(WATCHDOG);
    let wild = net.listen(format!("0.0.0.0:{port}")).unwrap();
    let r = net.connect(exact);
    wild.set_nonblocking(true).unwrap();
    let accepted = wild.accept();
    assert!(
        accepted.is_err(),
        "the connect to {exact} reached our own wildcard listener"
    );
    let err = r.map(drop).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
    assert!(
        err.to_string().contains("not reading its control socket"),
        "{err}"
    );
    drop((wild, net, peers, deaf));
}

/// A status report longer than a control packet (here 50 services with
/// two addresses each and 100 channels: about 12 KB) arrives whole, to a
/// client that only asks for it and to a registered stack: every service,
/// every channel, and the buffers. It used to be cut at 4 KB, mid-line,
/// without a sign, the channels and buffers gone.
#[test]
fn a_status_report_longer_than_a_packet_arrives_whole() {
    setup();
    raise_fd_limit();
    let p = prefix("longstatus");
    let mgr = Manager::builder(&p)
        .pool(PoolConfig {
            classes: vec![(2 << 10, 256)],
            max_stacks: 64,
            max_channels: 256,
            ring_capacity: 16,
            quotas: Vec::new(),
        })
        .spawn()
        .unwrap();
    const N: usize = 50;
    let addr = |i: usize, port: u16| -> std::net::SocketAddr {
        format!("10.66.{}.{}:{port}", i / 200, i % 200 + 1)
            .parse()
            .unwrap()
    };
    let mut stacks: Vec<Stack> = (0..N)
        .map(|i| {
            let mut s = Stack::builder(&p)
                .name(format!("service-{i:02}"))
                .attach()
                .unwrap();
            s.bind(addr(i, 80)).unwrap();
            s.bind(addr(i, 8443)).unwrap();
            s
        })
        .collect();
    // Each stack opens channels to the next two: 2N channels.
    for (i, s) in stacks.iter_mut().enumerate() {
        for d in 1..=2 {
            s.connect(addr((i + d) % N, 80)).unwrap();
        }
    }
    wait_until("the manager has every channel", || {
        mgr.snapshot().channels.len() == 2 * N
    });
    let check = |text: &str| {
        assert!(
            text.len() > xio_core::proto::MAX_MSG,
            "{} bytes",
            text.len()
        );
        for i in 0..N {
            assert!(
                text.contains(&format!("service-{i:02}")),
                "service {i}:\n{text}"
            );
            assert!(
                text.contains(&addr(i, 8443).to_string()),
                "address {i}:\n{text}"
            );
        }
        let (_, rest) = text
            .split_once("\nchannels:\n")
            .expect("no channels section");
        let (chans, bufs) = rest.split_once("buffers:\n").expect("no buffers section");
        assert_eq!(chans.lines().count(), 2 * N, "{chans}");
        assert!(bufs.contains("2048 B:"), "{bufs}");
        assert!(
            text.lines().last().unwrap().starts_with("  class"),
            "{text}"
        );
    };
    // A client that only asks.
    check(&xio_core::manager::query_status(&p).unwrap());
    // A registered stack (its reply is delivered as a stack's are).
    let (raw, _) = deaf_stack(&p);
    ctrl::send(raw.as_fd(), &Msg::Status, &[]).unwrap();
    let deadline = Some(std::time::Instant::now() + WATCHDOG);
    let (m, fds) = ctrl::recv_until(raw.as_fd(), deadline).unwrap();
    check(&xio_core::manager::status_from_reply(m, fds).unwrap());
    drop((raw, stacks));
    wait_pool_whole(&mgr);
}

/// Lifts this process's soft fd limit to the hard one (at most 65536):
/// tests with many stacks here hold more fds than the usual 1024.
fn raise_fd_limit() {
    let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let want = lim.maximum.map_or(1 << 16, |h| h.min(1 << 16));
    let _ = rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: Some(want.max(lim.current.unwrap_or(0))),
            maximum: lim.maximum,
        },
    );
}

/// A client that only connects to the manager's socket and leaves, as
/// fast as it can, does not keep others from attaching: the connections
/// it left are not what a newcomer's is dropped for. (The manager holds
/// at most 256 connections that have not said Hello yet and dropped the
/// oldest for each new one: in a flood of connections already closed,
/// a stack's attach was dropped before its Hello was read, and failed
/// with "the manager went away".)
#[test]
fn a_flood_of_connections_that_leave_does_not_keep_others_from_attaching() {
    use std::sync::atomic::{AtomicBool, Ordering};
    setup();
    let p = prefix("connect-flood");
    let mgr = Manager::builder(&p).spawn().unwrap();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let path = xio_core::paths::socket_path(&p);
    let flood: Vec<_> = (0..3)
        .map(|_| {
            let (stop, path) = (stop.clone(), path.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    drop(ctrl::connect(&path));
                }
            })
        })
        .collect();
    let mut failed = Vec::new();
    for i in 0..20u8 {
        match Stack::attach(&p) {
            Ok(mut s) => s
                .bind(format!("10.64.0.{}:1", i + 1).parse().unwrap())
                .unwrap(),
            Err(e) => failed.push(e.to_string()),
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in flood {
        t.join().unwrap();
    }
    assert!(
        failed.is_empty(),
        "{} of 20 attaches failed: {failed:?}",
        failed.len()
    );
    wait_pool_whole(&mgr);
}

/// The number after `key` on the status line of the one stack.
fn status_count(prefix: &str, key: &str) -> u64 {
    let text = xio_core::manager::query_status(prefix).unwrap();
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("stack ") && l.contains(key))
        .unwrap_or_else(|| panic!("no stack line in {text}"));
    let after = &line[line.find(key).unwrap() + key.len()..];
    after.split_whitespace().next().unwrap().parse().unwrap()
}

/// A stack given a departed one's id (here the only one there is) starts
/// with counters of its own: the status report must not say the newcomer
/// slept or rejected descriptors because the stack before it did.
#[test]
fn a_reused_ids_status_counts_are_the_newcomers_own() {
    setup();
    let p = prefix("idcounts");
    let cfg = PoolConfig {
        classes: vec![(2048, 64)],
        max_stacks: 1,
        ..PoolConfig::default()
    };
    let mgr = manager_builder(&p).pool(cfg).spawn().unwrap();
    let mut first = Stack::builder(&p)
        .wait_mode(WaitMode::Blocking)
        .attach()
        .unwrap();
    // Its waiter goes to sleep (nothing comes; a thread descheduled past
    // the wait's end does not sleep, so it waits again).
    wait_until("the first stack sleeps", || {
        let _ = first.recv_timeout(std::time::Duration::from_millis(20));
        status_count(&p, "sleeps") > 0
    });
    drop(first);
    wait_until("the manager frees the slot", || {
        mgr.snapshot().stacks.is_empty()
    });
    let second = Stack::attach(&p).unwrap();
    assert_eq!(
        status_count(&p, "sleeps"),
        0,
        "the newcomer is reported with the departed stack's sleeps"
    );
    drop(second);
}

/// Sends `msg` on a raw stack's socket and returns the manager's answer.
fn ask(s: &impl AsFd, msg: &Msg) -> Msg {
    ctrl::send(s.as_fd(), msg, &[]).unwrap();
    ctrl::recv_until(s.as_fd(), Some(std::time::Instant::now() + WATCHDOG))
        .unwrap()
        .0
}

/// A stack cannot make the manager hold an unbounded number of addresses
/// for it (every pass of the manager's loop, and every status report,
/// goes over them all): past its share, a bind of a new address is
/// refused, while what it holds stays bound and others still bind.
#[test]
fn a_stacks_bindings_are_bounded() {
    setup();
    let p = prefix("manybinds");
    let mgr = Manager::builder(&p).spawn().unwrap();
    let (hog, _) = deaf_stack(&p);
    let max = xio_core::manager::MAX_BINDINGS_PER_STACK;
    let addr = |i: usize| -> std::net::SocketAddr {
        std::net::SocketAddr::new([10, 65, (i >> 8) as u8, i as u8].into(), 1000)
    };
    for i in 0..max {
        assert_eq!(ask(&hog, &Msg::Bind { addr: addr(i) }), Msg::Ok, "bind {i}");
    }
    match ask(&hog, &Msg::Bind { addr: addr(max) }) {
        Msg::Error {
            code: xio_core::proto::ErrorCode::NoSpace,
            ..
        } => {}
        other => panic!("bind {max}: expected NoSpace, got {other:?}"),
    }
    // What it holds it may bind again; what it gives back makes room.
    assert_eq!(ask(&hog, &Msg::Bind { addr: addr(0) }), Msg::Ok);
    assert_eq!(ask(&hog, &Msg::Unbind { addr: addr(0) }), Msg::Ok);
    assert_eq!(ask(&hog, &Msg::Bind { addr: addr(max) }), Msg::Ok);
    // Others are served as before.
    let mut other = Stack::attach(&p).unwrap();
    other.bind(addr(0)).unwrap();
    drop((hog, other));
    wait_until("the manager lets both go", || {
        mgr.snapshot().stacks.is_empty()
    });
}

/// A stand-in manager for tests that play the manager's side by hand: a
/// real segment and a listening socket, no loop. Its thread accepts one
/// stack and welcomes it as stack 1 (the segment and a doorbell).
struct StandIn {
    path: std::path::PathBuf,
    seg: xio_core::segment::Segment,
    _pool: xio_core::pool::ManagerPool,
    accept: Option<std::thread::JoinHandle<(OwnedFd, OwnedFd)>>,
}

impl StandIn {
    fn start(p: &str) -> StandIn {
        use xio_core::segment::{Region, Segment};
        let path = xio_core::paths::socket_path(p);
        let _ = std::fs::remove_file(&path);
        let cfg = PoolConfig {
            classes: vec![(2048, 16)],
            max_stacks: 4,
            max_channels: 4,
            ring_capacity: 16,
            quotas: Vec::new(),
        };
        let geo = cfg.geometry().unwrap();
        let region = Region::create_memfd(p, geo.total_len as usize).unwrap();
        let seg = Segment::init(region, &cfg, &geo).unwrap();
        let pool = xio_core::pool::ManagerPool::init(seg.clone());
        let listener = ctrl::listen(&path).unwrap();
        let seg_fd = seg.region().fd().unwrap().try_clone_to_owned().unwrap();
        let accept = std::thread::spawn(move || {
            let s = ctrl::accept(listener.as_fd()).unwrap();
            let (m, _) = ctrl::recv(s.as_fd(), false).unwrap();
            assert!(matches!(m, Msg::Hello { .. }), "{m:?}");
            let bell = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
            let welcome = Msg::Welcome {
                stack_id: 1,
                generation: 1,
            };
            ctrl::send(s.as_fd(), &welcome, &[seg_fd.as_fd(), bell.as_fd()]).unwrap();
            (s, bell)
        });
        StandIn {
            path,
            seg,
            _pool: pool,
            accept: Some(accept),
        }
    }

    /// A non-blocking stack attached to prefix `p` (this stand-in's),
    /// the stand-in's end of its socket, and the doorbell sent to it.
    fn attach(&mut self, p: &str) -> (Stack, OwnedFd, OwnedFd) {
        let stack = Stack::builder(p)
            .wait_mode(WaitMode::NonBlocking)
            .attach()
            .unwrap();
        let accept = self.accept.take().expect("one stack per stand-in");
        let (s, bell) = accept.join().unwrap();
        (stack, s, bell)
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A control message the stack cannot act on (here a `ChannelUp` without
/// its doorbell, as a manager out of fds sends it) does not strand the
/// messages queued behind it: they came with the same wake-up, and the
/// stack looks at its socket again only at the next. A `PeerDown` left
/// unread would keep the dead peer's channel (and slot) for good.
#[test]
fn a_control_message_that_fails_does_not_strand_those_behind_it() {
    setup();
    let p = prefix("stranded");
    let mut fake = StandIn::start(&p);
    let (mut stack, s, _bell) = fake.attach(&p);
    let seg = &fake.seg;
    // Two channels come up with one wake-up: the first without its fd.
    seg.reset_channel_rings(0);
    seg.reset_channel_rings(1);
    let up = |channel, peer| Msg::ChannelUp {
        channel,
        dir: 1,
        peer,
        generation: 1,
    };
    ctrl::send(s.as_fd(), &up(0, 2), &[]).unwrap();
    let bell = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
    ctrl::send(s.as_fd(), &up(1, 3), &[bell.as_fd()]).unwrap();
    seg.stack_slot(1)
        .ctrl_seq
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    // Whatever the first receives say of the broken one, the second
    // channel is up after them.
    for _ in 0..3 {
        let _ = stack.try_recv();
    }
    assert_eq!(stack.peers(), vec![PeerId::new(3, 1)]);
    drop((stack, s));
}

/// A stack's name reaches the status report and the logs without its
/// control characters: a name holding a newline (or a terminal escape)
/// could otherwise forge a line of `xio-manager status`.
#[test]
fn a_stacks_name_cannot_forge_status_lines() {
    setup();
    let p = prefix("name");
    let _mgr = manager_builder(&p).spawn().unwrap();
    let s = raw_conn(&p);
    let hello = Msg::Hello {
        pid: 1,
        name: "x\n  stack 99   pid 1        forged\u{1b}[2J".into(),
    };
    ctrl::send(s.as_fd(), &hello, &[]).unwrap();
    let (m, _fds) = ctrl::recv(s.as_fd(), false).unwrap();
    assert!(matches!(m, Msg::Welcome { .. }), "{m:?}");
    let text = xio_core::manager::query_status(&p).unwrap();
    let stacks = text
        .lines()
        .filter(|l| l.trim_start().starts_with("stack "))
        .count();
    assert_eq!(stacks, 1, "{text}");
    assert!(!text.contains('\u{1b}'), "{text}");
    drop(s);
}

extern "C" fn ignore_signal(_: libc::c_int) {}

/// An attach waiting for room in a busy manager's listen queue is not
/// failed by a signal: with a send timeout on the socket even an
/// `SA_RESTART` handler's signal interrupts the connect, which is asked
/// again, so the wait ends in its own time-out (here: a queue that never
/// drains), not in `Interrupted`.
#[test]
fn a_signal_does_not_fail_a_connect_waiting_for_the_queue() {
    setup();
    let dir = std::env::temp_dir().join(format!("xio-t-intr-{}", std::process::id()));
    let _ = std::fs::remove_file(&dir);
    let l = ctrl::listen(&dir).unwrap();
    // A queue nobody accepts from, filled.
    let mut filled = Vec::new();
    loop {
        let s = rustix::net::socket_with(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::NONBLOCK | rustix::net::SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        match rustix::net::connect(&s, &rustix::net::SocketAddrUnix::new(&dir).unwrap()) {
            Ok(()) => filled.push(s),
            Err(rustix::io::Errno::AGAIN) => break,
            Err(e) => panic!("{e}"),
        }
    }
    // SAFETY: installs a handler that does nothing, for SIGUSR2, which
    // nothing else in this test process uses.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = ignore_signal as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        assert_eq!(libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut()), 0);
    }
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();
    let path = dir.clone();
    let d = done.clone();
    let t = std::thread::spawn(move || {
        // SAFETY: pthread_self has no preconditions.
        tx.send(unsafe { libc::pthread_self() }).unwrap();
        let r = ctrl::connect_within(&path, std::time::Duration::from_millis(500));
        d.store(true, std::sync::atomic::Ordering::SeqCst);
        r.map(drop)
    });
    let thread = rx.recv().unwrap();
    while !done.load(std::sync::atomic::Ordering::SeqCst) {
        // SAFETY: the thread is joined only after `done`, so it is alive.
        unsafe { libc::pthread_kill(thread, libc::SIGUSR2) };
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let e = t.join().unwrap().unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
    drop((l, filled));
    let _ = std::fs::remove_file(&dir);
}

/// A stack's requests still queued in its control socket when its process
/// is gone, or once the manager cut it off, are not acted on: the manager
/// opens no channel from a dead process to a live stack (which would get
/// a `ChannelUp` for a peer already gone, and its fds) and binds nothing
/// for it. Both ways: a stack cut off for a bad message whose process then
/// exits, and one whose process exits while the manager (a process of its
/// own here, stopped meanwhile) has not read its last requests.
#[test]
fn a_gone_stacks_queued_requests_are_not_acted_on() {
    setup();
    for how in ["cut", "dead"] {
        let p = prefix(&format!("gone-{how}"));
        let mut mgr = ChildProc::spawn("child_main", "manager", std::slice::from_ref(&p));
        mgr.expect("ready");
        let addr: std::net::SocketAddr = "10.66.0.1:7".parse().unwrap();
        let (live, _) = deaf_stack(&p);
        assert_eq!(ask(&live, &Msg::Bind { addr }), Msg::Ok, "{how}");
        let mut gone = ChildProc::spawn(
            "child_main",
            "asks_then_exits",
            &[p.clone(), addr.to_string(), how.into()],
        );
        let id: u16 = gone.expect("ready").parse().unwrap();
        if how == "dead" {
            mgr.signal(rustix::process::Signal::STOP);
        }
        gone.tell("go");
        if how == "cut" {
            gone.expect("cut");
            wait_until("the manager cuts the stack off", || {
                xio_core::manager::query_status(&p)
                    .unwrap()
                    .contains("cut off after a bad control message")
            });
            gone.tell("go");
        }
        gone.wait_success();
        if how == "dead" {
            mgr.signal(rustix::process::Signal::CONT);
        }
        wait_until("the manager lets the gone stack go", || {
            let text = xio_core::manager::query_status(&p).unwrap();
            let me = format!("stack {id} ");
            !text.lines().any(|l| l.trim_start().starts_with(&me))
        });
        // Nothing came to the live stack meanwhile: the first thing it
        // reads is the answer to what it asks now.
        match ask(&live, &Msg::Status) {
            Msg::StatusReply { .. } | Msg::StatusReplyFd { .. } => {}
            other => panic!("{how}: the live stack got {other:?} from a gone one"),
        }
        let text = xio_core::manager::query_status(&p).unwrap();
        assert!(text.contains(", 0/"), "{how}: no channel left open: {text}");
        assert!(!text.contains("10.66.0.1:8"), "{how}: {text}");
        drop(live);
        mgr.kill9();
    }
}

/// A connect to an address whose holder's process is gone, its hang-up
/// not handled yet (it died while the manager, a process of its own
/// here, was stopped), is refused: no channel to the dead stack, whose
/// `Connected` would hand the client its fds and then a reset, where a
/// refusal lets it try the next address or TCP. Several rounds, as the
/// manager goes over its stacks in no set order.
#[test]
fn a_connect_to_a_stack_that_just_died_is_refused() {
    setup();
    let p = prefix("just-died");
    let mut mgr = ChildProc::spawn("child_main", "manager", std::slice::from_ref(&p));
    mgr.expect("ready");
    let (client, _) = deaf_stack(&p);
    for i in 0..16u16 {
        let addr = std::net::SocketAddr::from(([10, 67, 0, 1], 1000 + i));
        let (holder, _) = deaf_stack(&p);
        assert_eq!(ask(&holder, &Msg::Bind { addr }), Msg::Ok);
        mgr.signal(rustix::process::Signal::STOP);
        drop(holder);
        ctrl::send(client.as_fd(), &Msg::Connect { addr }, &[]).unwrap();
        mgr.signal(rustix::process::Signal::CONT);
        match ctrl::recv_until(client.as_fd(), Some(std::time::Instant::now() + WATCHDOG)) {
            Ok((
                Msg::Error {
                    code: xio_core::proto::ErrorCode::ConnectionRefused,
                    ..
                },
                _,
            )) => {}
            other => panic!("round {i}: expected a refusal, got {other:?}"),
        }
    }
    drop(client);
    mgr.kill9();
}

/// A stack cut off for a bad message whose later, unread packet carries
/// a duplicate of its own control socket: once its process closes the
/// socket, the manager must still see it go. Found by the control fuzz
/// test (tests/control_fuzz.rs). The packet was never read (a cut-off
/// stack's socket was only watched for its hang-up), so the fd in it
/// kept the client's end open: the hang-up never came, and the stack's
/// slot (and any buffers) were held until the manager stopped.
#[test]
fn a_cut_off_stack_that_sent_its_own_socket_still_dies() {
    setup();
    let p = prefix("self-fd");
    let mgr = Manager::builder(&p).spawn().unwrap();
    let (s, _) = raw_stack(&p, "self-fd");
    send_lying_connect(&s);
    // Its own socket, in flight to the manager, in a packet it never reads.
    ctrl::send(s.as_fd(), &Msg::Status, &[s.as_fd()]).unwrap();
    drop(s);
    wait_until("the cut-off stack's death is seen", || {
        mgr.snapshot().stacks.is_empty()
    });
}

/// Whether status report `status` says stack `id` was cut off for a bad
/// control message (the line after the stack's own says so).
fn reported_cut_off(status: &str, id: u16) -> bool {
    let line = status
        .lines()
        .skip_while(|l| !l.trim_start().starts_with(&format!("stack {id} ")))
        .nth(1)
        .unwrap_or_default();
    line.contains("cut off") && line.contains("bad control message")
}

/// On a `SOCK_SEQPACKET` socket a zero-length read is either the end of
/// file or an empty packet, which any peer may send while it lives on.
/// A stack never sends one, so it is a bad message: answered with an
/// error and cut off (its buffers kept until its process lets go), not
/// taken for the stack leaving of its own accord, silently, with its
/// requests after it dropped unanswered.
#[test]
fn an_empty_packet_is_a_bad_message_not_a_stack_leaving() {
    setup();
    let p = prefix("empty-pkt");
    let mgr = Manager::builder(&p).spawn().unwrap();
    let (s, stack_id) = raw_stack(&p, "empty");
    let n = rustix::net::send(&s, &[], rustix::net::SendFlags::NOSIGNAL).unwrap();
    assert_eq!(n, 0);
    // Answered after the empty packet was handled.
    let status = xio_core::manager::query_status(&p).unwrap();
    assert!(reported_cut_off(&status, stack_id), "{status}");
    match ctrl::recv_until(s.as_fd(), Some(std::time::Instant::now() + WATCHDOG)) {
        Ok((
            Msg::Error {
                code: xio_core::proto::ErrorCode::BadMessage,
                ..
            },
            _,
        )) => {}
        other => panic!("expected a BadMessage error, got {other:?}"),
    }
    // Before registering, too: an error, not a silently closed socket.
    match exchange(&p, &[]) {
        Some(Msg::Error {
            code: xio_core::proto::ErrorCode::BadMessage,
            ..
        }) => {}
        other => panic!("an empty first packet: expected BadMessage, got {other:?}"),
    }
    drop(s);
    wait_until("the cut-off stack's death is seen", || {
        mgr.snapshot().stacks.is_empty()
    });
}

/// The stack's side of the same: an empty packet from the manager is a
/// malformed message, not the manager gone (which would make the stack
/// give up on a manager that still serves it).
#[test]
fn an_empty_packet_from_the_manager_does_not_read_as_its_end() {
    setup();
    let p = prefix("empty-from-mgr");
    let mut fake = StandIn::start(&p);
    let (mut stack, s, _bell) = fake.attach(&p);
    let seg = &fake.seg;
    rustix::net::send(&s, &[], rustix::net::SendFlags::NOSIGNAL).unwrap();
    seg.stack_slot(1)
        .ctrl_seq
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    for _ in 0..3 {
        let _ = stack.try_recv();
    }
    assert!(
        !stack.manager_gone(),
        "an empty packet read as the manager gone"
    );
    drop((stack, s));
}

/// A connection the manager answers with an error and then closes while
/// packets it did not read wait in it (here: a malformed first packet,
/// and a request after it, both queued while the manager, a process of
/// its own, was stopped) is reset by the kernel, which reports the reset
/// before the reply queued ahead of it. The client must still read why
/// it was turned away, not a bare "connection closed".
#[test]
fn an_error_reply_before_a_reset_is_still_read() {
    setup();
    let p = prefix("reset-reply");
    let mut mgr = ChildProc::spawn("child_main", "manager", std::slice::from_ref(&p));
    mgr.expect("ready");
    mgr.signal(rustix::process::Signal::STOP);
    let s = raw_conn(&p);
    let flags = rustix::net::SendFlags::NOSIGNAL;
    rustix::net::send(&s, b"not a message", flags).unwrap();
    rustix::net::send(&s, &Msg::Status.encode(), flags).unwrap();
    mgr.signal(rustix::process::Signal::CONT);
    match ctrl::recv_until(s.as_fd(), Some(std::time::Instant::now() + WATCHDOG)) {
        Ok((
            Msg::Error {
                code: xio_core::proto::ErrorCode::BadMessage,
                ..
            },
            _,
        )) => {}
        other => panic!("expected the BadMessage reply, got {other:?}"),
    }
    // Then the end of file.
    assert!(matches!(
        ctrl::recv_until(s.as_fd(), Some(std::time::Instant::now() + WATCHDOG)),
        Err(ctrl::RecvError::Closed)
    ));
    mgr.kill9();
}
