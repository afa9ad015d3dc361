//! Cross-process tests of the zero-copy interface: an embedded manager in
//! the test process, real child processes as services and clients.

mod common;

use common::*;
use std::net::SocketAddr;
use xio_core::manager::Backend;
use xio_core::prelude::*;

const MESSAGES: u64 = 100_000;

/// Entry point of child processes (a no-op when run as a normal test).
#[test]
fn child_main() {
    let Some((role, a)) = child_role() else {
        return;
    };
    match role.as_str() {
        "echo" => echo(&a[0], a[1].parse().unwrap()),
        "client" => client(&a[0], a[1].parse().unwrap(), a[2].parse().unwrap()),
        "sink" => sink(&a[0], a[1].parse().unwrap(), a[2].parse().unwrap()),
        "oneway" => oneway(&a[0], a[1].parse().unwrap(), a[2].parse().unwrap()),
        "hoarder" => hoarder(&a[0], a[1].parse().unwrap()),
        "forker" => forker(&a[0], a[1].parse().unwrap()),
        "manager_forker" => manager_forker(&a[0]),
        "forks_holding_locks" => forks_holding_locks(&a[0]),
        "forks_holding_a_nets_lock" => forks_holding_a_nets_lock(&a[0]),
        "echo_until_reset" => echo_until_reset(&a[0], a[1].parse().unwrap()),
        "bind_and_park" => bind_and_park(&a[0], a[1].parse().unwrap()),
        "attach_and_say" => attach_and_say(&a[0]),
        "forks_with_queued_messages" => forks_with_queued_messages(&a[0], a[1].parse().unwrap()),
        "burst_sink" => burst_sink(&a[0], a[1].parse().unwrap(), a[2].parse().unwrap()),
        "dies_mid_burst" => dies_mid_burst(&a[0], a[1].parse().unwrap(), a[2].parse().unwrap()),
        "out_of_fds" => out_of_fds(&a[0], a[1].parse().unwrap()),
        "echo_on_cpu0" => {
            let mut set = rustix::thread::CpuSet::new();
            set.set(0);
            rustix::thread::sched_setaffinity(None, &set).unwrap();
            echo_until_reset(&a[0], a[1].parse().unwrap())
        }
        r => panic!("unknown role {r}"),
    }
}

/// L2-forwarder-style echo: receive, flip nothing, send the same buffer back.
fn echo(prefix: &str, addr: SocketAddr) {
    let mut s = Stack::builder(prefix).name("echo").attach().unwrap();
    s.bind(addr).unwrap();
    println!("XIO:ready");
    loop {
        match s.recv() {
            Ok(m) => {
                let from = m.from;
                let b = m.buf.into_mut();
                if s.send(from, b).is_err() {
                    continue;
                }
            }
            Err(Error::Reset(_)) => continue,
            Err(e) => panic!("echo: {e}"),
        }
    }
}

/// Receives `n` messages with the burst API, checking order and content.
fn burst_sink(prefix: &str, addr: SocketAddr, n: u64) {
    let mut s = Stack::builder(prefix).name("burst-sink").attach().unwrap();
    s.bind(addr).unwrap();
    println!("XIO:ready");
    let mut next = 0u64;
    while next < n {
        s.recv_burst_with(64, |_, tag, payload| {
            assert_eq!(u64::from(tag), 0);
            assert!(
                (64..2048).contains(&payload.len()),
                "message {next}: {} bytes",
                payload.len()
            );
            assert!(verify(payload, next), "burst message {next} corrupted");
            next += 1;
        })
        .unwrap();
    }
    println!("XIO:done {next}");
}

/// Echoes until its client leaves, then exits.
fn echo_until_reset(prefix: &str, addr: SocketAddr) {
    let mut s = Stack::builder(prefix).name("echo-once").attach().unwrap();
    s.bind(addr).unwrap();
    println!("XIO:ready");
    loop {
        match s.recv() {
            Ok(m) => {
                let from = m.from;
                s.send(from, m.buf.into_mut()).unwrap();
            }
            Err(Error::Reset(_)) => break,
            Err(e) => panic!("echo: {e}"),
        }
    }
    println!("XIO:reset {}", s.spin_policy().sleeps);
}

/// Binds `addr`, says so, and waits to be killed, whatever happens to the
/// manager meanwhile.
fn bind_and_park(prefix: &str, addr: SocketAddr) {
    let mut s = Stack::builder(prefix).name("parked").attach().unwrap();
    s.bind(addr).unwrap();
    println!("XIO:ready");
    loop {
        std::thread::park();
    }
}

/// Binds `addr`, then lowers its fd limit to the fds it has, so that the
/// kernel drops every fd a control message brings (`MSG_CTRUNC`), says
/// so, and receives on, saying `XIO:err` for each error.
fn out_of_fds(prefix: &str, addr: SocketAddr) {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let mut s = Stack::builder(prefix).name("out-of-fds").attach().unwrap();
    s.bind(addr).unwrap();
    // The lowest free fd number: every new fd would be at least that.
    let lowest = rustix::io::dup(std::io::stdin()).unwrap();
    let limit = std::os::fd::AsRawFd::as_raw_fd(&lowest) as u64;
    drop(lowest);
    let max = getrlimit(Resource::Nofile).maximum;
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(limit),
            maximum: max,
        },
    )
    .unwrap();
    println!("XIO:ready");
    loop {
        match s.recv() {
            Ok(_) => {}
            Err(e) => println!("XIO:err {e}"),
        }
    }
}

/// Attaches with default options and says how that went: `XIO:attach
/// ok`, or the error's kind and message.
fn attach_and_say(prefix: &str) {
    match Stack::attach(prefix) {
        Ok(_) => println!("XIO:attach ok"),
        Err(e) => {
            let msg = e.to_string();
            let kind = std::io::Error::from(e).kind();
            println!("XIO:attach err {kind:?} {msg}");
        }
    }
}

/// Binds `addr` and takes three messages off its ring with a receive that
/// returns one (the other two wait in the stack's inbox), then forks: the
/// child's receives on the inherited stack must fail with `Forked`, not
/// hand out the parent's queued buffers a second time. Says the child's
/// verdict.
fn forks_with_queued_messages(prefix: &str, addr: SocketAddr) {
    let mut s = Stack::builder(prefix).name("forker").attach().unwrap();
    s.bind(addr).unwrap();
    println!("XIO:ready");
    let mut out = Vec::new();
    // The first message may come before the other two are in the ring.
    while out.is_empty() {
        s.recv_burst(&mut out, 1).unwrap();
    }
    let (rd, wr) = rustix::pipe::pipe().unwrap();
    // SAFETY: the child makes X-IO calls that must fail before taking any
    // lock (what is tested; on failure they touch only the stack's own
    // inbox), writes to a pipe and `_exit`s; the other thread of this
    // process (the test harness's) holds no lock we use.
    let pid = unsafe { fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        drop(rd);
        let got: Vec<String> = (0..2)
            .map(|_| match s.try_recv() {
                Err(Error::Forked) => "Forked".to_owned(),
                Ok(m) => format!("a message of {} bytes", m.buf.len()),
                Err(e) => e.to_string(),
            })
            .collect();
        std::mem::forget(s);
        let verdict = if got.iter().all(|g| g == "Forked") {
            "ok".to_owned()
        } else {
            format!("the child's receives gave {got:?}")
        };
        rustix::io::write(&wr, verdict.as_bytes()).unwrap();
        // SAFETY: ends the forked child without running the parent's
        // destructors or atexit handlers.
        unsafe { _exit(0) };
    }
    drop(wr);
    let mut verdict = [0u8; 256];
    let n = rustix::io::read(&rd, &mut verdict).unwrap();
    println!("XIO:verdict {}", String::from_utf8_lossy(&verdict[..n]));
    // The parent still has the two queued messages.
    for _ in 0..2 {
        drop(s.try_recv().unwrap());
    }
    drop(out);
    println!("XIO:done");
}

/// Sends `n` checksummed messages of varying size and checks each echo.
fn client(prefix: &str, addr: SocketAddr, n: u64) {
    let mut s = Stack::builder(prefix).name("client").attach().unwrap();
    let peer = s.connect(addr).unwrap();
    let mut bytes = 0u64;
    for i in 0..n {
        let len = size_of_msg(i);
        let mut b = s.alloc(len).unwrap();
        fill(&mut b, i);
        s.send(peer, b).unwrap();
        let m = s.recv().unwrap();
        assert_eq!(m.from, peer);
        assert_eq!(m.buf.len(), len, "message {i}");
        assert!(verify(&m.buf, i), "message {i} corrupted");
        bytes += len as u64;
    }
    println!("XIO:done {n} {bytes}");
}

/// Receives `n` one-way messages, checking order and content.
fn sink(prefix: &str, addr: SocketAddr, n: u64) {
    let mut s = Stack::builder(prefix).name("sink").attach().unwrap();
    s.bind(addr).unwrap();
    println!("XIO:ready");
    let mut out = Vec::new();
    let mut next = 0u64;
    while next < n {
        out.clear();
        s.recv_burst(&mut out, 64).unwrap();
        for m in out.drain(..) {
            assert_eq!(u64::from(m.tag), next & 0xffff_ffff);
            assert_eq!(m.buf.len(), size_of_msg(next));
            assert!(verify(&m.buf, next), "one-way message {next} corrupted");
            next += 1;
        }
    }
    println!("XIO:done {next}");
}

/// Sends `n` one-way messages as fast as the ring takes them.
fn oneway(prefix: &str, addr: SocketAddr, n: u64) {
    let mut s = Stack::builder(prefix).name("oneway").attach().unwrap();
    let peer = s.connect(addr).unwrap();
    for i in 0..n {
        let len = size_of_msg(i);
        let mut b = s.alloc(len).unwrap();
        fill(&mut b, i);
        s.send_tagged(peer, i as u32, b).unwrap();
    }
    println!("XIO:done");
}

/// Holds buffers and leaves descriptors in flight both ways, then waits to
/// be killed.
fn hoarder(prefix: &str, addr: SocketAddr) {
    let mut s = Stack::builder(prefix).name("hoarder").attach().unwrap();
    let peer = s.connect(addr).unwrap();
    let held: Vec<_> = (0..40)
        .map(|i| s.alloc(if i % 2 == 0 { 100 } else { 50_000 }).unwrap())
        .collect();
    for i in 0..25 {
        let mut b = s.alloc(64).unwrap();
        fill(&mut b, i);
        s.send(peer, b).unwrap();
    }
    // Receive a few so some buffers are held as received `Buf`s too.
    let mut got = Vec::new();
    for _ in 0..5 {
        got.push(s.recv().unwrap());
    }
    println!("XIO:ready {}", held.len() + got.len());
    loop {
        std::thread::park();
    }
}

extern "C" {
    fn fork() -> i32;
    fn _exit(status: i32) -> !;
}

/// Connects to `addr` and holds buffers (some received, some its own),
/// then forks. The forked child finds every call on the inherited stack
/// failing with `Forked`, drops the buffers (which must touch nothing
/// shared), attaches a stack of its own, reports through a pipe, and then
/// lives on holding the inherited stack and every fd it had until it is
/// killed (or for a watchdog's time). The parent then reports and waits
/// for its own death.
fn forker(prefix: &str, addr: SocketAddr) {
    let mut s = Stack::builder(prefix).name("forker").attach().unwrap();
    let peer = s.connect(addr).unwrap();
    let mut held: Vec<_> = (0..10).map(|_| s.alloc(100).unwrap()).collect();
    let b = s.alloc(64).unwrap();
    s.send(peer, b).unwrap();
    let got = s.recv().unwrap();
    let (rd, wr) = rustix::pipe::pipe().unwrap();
    let test_process = rustix::process::getppid().unwrap();
    // SAFETY: the child only makes X-IO calls that fail before taking any
    // lock (that is what is tested), attaches a fresh stack (new fds, new
    // mappings), writes to a pipe, sleeps and `_exit`s; the other thread of
    // this process (the test harness's) holds no lock we use.
    let pid = unsafe { fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        drop(rd);
        let forked = |r: Result<(), Error>| matches!(r, Err(Error::Forked));
        let checks = [
            forked(s.alloc(64).map(drop)),
            forked(s.send(peer, held.pop().unwrap())),
            forked(s.recv().map(drop)),
            forked(s.try_recv().map(drop)),
            forked(s.connect(addr).map(drop)),
            forked(s.bind(SocketAddr::from(([10, 0, 0, 1], 99)))),
        ];
        // The buffers go (their frees must touch nothing shared); the
        // stack stays, with its copy of the control socket, as in a child
        // that never touches what it inherited.
        drop((held, got.buf.into_mut()));
        std::mem::forget(s);
        let mut fresh = Stack::builder(prefix).name("forked").attach().unwrap();
        let fresh_ok = fresh.alloc(64).is_ok() && fresh.connect(addr).is_ok();
        drop(fresh);
        let verdict = if checks.iter().all(|&c| c) && fresh_ok {
            "ok".to_owned()
        } else {
            format!("forked calls {checks:?}, fresh stack {fresh_ok}")
        };
        rustix::io::write(&wr, verdict.as_bytes()).unwrap();
        linger_until_killed(test_process);
    }
    drop(wr);
    let mut verdict = [0u8; 128];
    let n = rustix::io::read(&rd, &mut verdict).unwrap();
    let verdict = String::from_utf8_lossy(&verdict[..n]);
    assert_eq!(verdict, "ok", "the forked child's checks (empty: it died)");
    println!("XIO:ready {pid}");
    let _keep = (s, held, got);
    loop {
        std::thread::park();
    }
}

/// Runs an embedded manager, and forks when told to (once the test has a
/// stack registered with it). The forked child drops its copy of the
/// manager's handle (which must not stop the parent's manager) and lives
/// on holding every fd it inherited, the manager's sockets and lock among
/// them, until killed (or its test is gone).
fn manager_forker(prefix: &str) {
    let mgr = manager_builder(prefix).spawn().unwrap();
    println!("XIO:up");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "fork");
    let (rd, wr) = rustix::pipe::pipe().unwrap();
    let test_process = rustix::process::getppid().unwrap();
    // SAFETY: the child drops a handle (which must only forget the
    // thread), writes to a pipe, sleeps and `_exit`s.
    let pid = unsafe { fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        drop(rd);
        drop(mgr);
        rustix::io::write(&wr, b"ok").unwrap();
        linger_until_killed(test_process);
    }
    drop(wr);
    let mut verdict = [0u8; 2];
    assert_eq!(rustix::io::read(&rd, &mut verdict).unwrap(), 2);
    println!("XIO:ready {pid}");
    let _keep = mgr;
    loop {
        std::thread::park();
    }
}

/// Forks while this thread holds X-IO's process-wide locks (as another
/// thread of a real program may at any moment). The child, where nothing
/// will ever release them, attaches a net and the global net, and reports
/// through a pipe; the parent waits for that report (or its watchdog).
fn forks_holding_locks(prefix: &str) {
    let _net = xio_core::net::Net::attach(prefix).unwrap();
    std::env::set_var("XIO_PREFIX", prefix);
    let held = xio_core::net::__hold_process_locks();
    // The child only attaches (new fds, new mappings).
    let verdict = fork_reporting(held, || {
        let attached = xio_core::net::Net::attach(prefix).is_ok();
        let global = xio_core::net::Net::global().is_ok();
        if attached && global {
            "ok"
        } else {
            "failed"
        }
    });
    assert_eq!(verdict, "ok", "the forked child's attach (empty: it died)");
    println!("XIO:ready");
}

/// Forks while this thread holds a net's lock, with a stream and a
/// listener of that net open. In the child, where nothing will ever
/// release it, dropping the inherited stream and listener returns, and a
/// call on the inherited net panics saying why instead of waiting for
/// ever.
fn forks_holding_a_nets_lock(prefix: &str) {
    let net = xio_core::net::Net::attach(prefix).unwrap();
    let a: SocketAddr = "10.0.9.1:80".parse().unwrap();
    let l = net.listen(a).unwrap();
    let c = net.connect(a).unwrap();
    let held = net.__hold_lock();
    // The child drops handles and catches a panic.
    let verdict = fork_reporting(held, || {
        drop(c);
        drop(l);
        // The panic is expected: no report of it in the test's output.
        std::panic::set_hook(Box::new(|_| {}));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| net.stack_id()));
        match r {
            Err(e) => {
                let m = e
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| e.downcast_ref::<&str>().copied())
                    .unwrap_or("");
                if m.contains("inherited across fork()") {
                    "panicked"
                } else {
                    "panicked otherwise"
                }
            }
            Ok(_) => "returned",
        }
    });
    assert_eq!(
        verdict, "panicked",
        "the forked child's call on the inherited net (empty: it died)"
    );
    println!("XIO:ready");
}

/// Forks; the child forgets `held` (a guard of locks this thread holds,
/// never released there), runs `child` and writes its verdict to a pipe,
/// dying with the parent if it hangs; the parent releases `held` and
/// returns the verdict (watchdog: the child hung; empty: it died).
/// `child` must only use what a forked child of a threaded process may
/// (new fds and mappings, X-IO's calls), and must not return to the test
/// harness.
fn fork_reporting<H>(held: H, child: impl FnOnce() -> &'static str) -> String {
    let (rd, wr) = rustix::pipe::pipe().unwrap();
    // SAFETY: the child runs `child` (see above), writes to a pipe and
    // `_exit`s; the other thread of this process (the test harness's)
    // holds no lock X-IO uses.
    let pid = unsafe { fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        drop(rd);
        std::mem::forget(held);
        let _ =
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
        let verdict = child();
        rustix::io::write(&wr, verdict.as_bytes()).unwrap();
        // SAFETY: ends the forked child without running the parent's exit
        // handlers a second time.
        unsafe { _exit(0) }
    }
    let _reap = Reap(pid);
    drop(wr);
    drop(held);
    wait_readable(&rd, "the forked child hung");
    let mut verdict = [0u8; 32];
    let n = rustix::io::read(&rd, &mut verdict).unwrap();
    String::from_utf8_lossy(&verdict[..n]).into_owned()
}

/// A forked child's wait: until killed, or until `test_process` is gone
/// (its test failed) or longer than its watchdog. Then `_exit`.
fn linger_until_killed(test_process: rustix::process::Pid) -> ! {
    let until = std::time::Instant::now() + 2 * WATCHDOG;
    while std::time::Instant::now() < until
        && rustix::process::test_kill_process(test_process).is_ok()
    {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // SAFETY: ends the forked child without running the parent's exit
    // handlers a second time.
    unsafe { _exit(0) }
}

/// Kills a forked grandchild when dropped (its parent cannot reap it).
struct Reap(i32);

impl Drop for Reap {
    fn drop(&mut self) {
        let pid = rustix::process::Pid::from_raw(self.0).unwrap();
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
}

/// Waits (watchdog) until `me` is the only stack holding buffers: what a
/// dead peer held has been reclaimed.
fn wait_sole_holder(mgr: &xio_core::manager::ManagerHandle, me: &Stack) {
    wait_until("only our stack holds buffers", || {
        mgr.usage()
            .iter()
            .all(|u| u.by_owner.iter().all(|(o, _)| *o == me.id().slot()))
    });
}

/// A process forked while another thread held X-IO's process-wide locks
/// (the nets' registry for the exit handler, the global net's) attaches
/// in the child: those locks are per process, so the child's are new.
/// Without that, the child's attach waits forever for a lock whose holder
/// does not exist there.
#[test]
fn a_child_forked_while_x_io_locks_are_held_attaches() {
    fork_role("forklocks", "forks_holding_locks");
}

/// Runs child role `role` (one that forks and checks its child itself)
/// on a pool of its own, and waits for it to succeed.
fn fork_role(name: &str, role: &str) {
    setup();
    let p = prefix(name);
    let _mgr = manager_builder(&p).spawn().unwrap();
    ChildProc::spawn("child_main", role, std::slice::from_ref(&p)).wait_success();
}

/// A process forked while one of its threads held a net's lock: in the
/// child, dropping the inherited stream and listener returns, and a call
/// on the inherited net panics with a message that says what happened
/// (its copy of the lock is never released; the call waited for ever).
#[test]
fn a_nets_lock_held_at_a_fork_is_an_error_in_the_child_not_a_hang() {
    fork_role("forknetlock", "forks_holding_a_nets_lock");
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, 1], port))
}

#[test]
fn echo_100k_checksummed_messages_64b_to_1mib() {
    setup();
    let p = prefix("echo100k");
    let mgr = manager_builder(&p).spawn().unwrap();
    let a = addr(7);
    let mut server = ChildProc::spawn("child_main", "echo", &[p.clone(), a.to_string()]);
    server.expect("ready");
    let mut client = ChildProc::spawn(
        "child_main",
        "client",
        &[p.clone(), a.to_string(), MESSAGES.to_string()],
    );
    let done = client.expect("done");
    assert!(done.starts_with(&MESSAGES.to_string()), "{done}");
    client.wait_success();
    // The client left: the server's channel is reset; the pool is whole
    // once the server goes too.
    server.kill9();
    wait_pool_whole(&mgr);
}

#[test]
fn oneway_stream_with_backpressure_loses_nothing() {
    setup();
    let p = prefix("oneway");
    // Small rings and few large buffers so the sender often waits on both.
    let cfg = PoolConfig {
        classes: vec![(2048, 256), (65536, 16), (1 << 20, 4)],
        ring_capacity: 64,
        ..PoolConfig::default()
    };
    let mgr = manager_builder(&p).pool(cfg).spawn().unwrap();
    let a = addr(9);
    let n = MESSAGES;
    let mut sink = ChildProc::spawn(
        "child_main",
        "sink",
        &[p.clone(), a.to_string(), n.to_string()],
    );
    sink.expect("ready");
    let mut src = ChildProc::spawn(
        "child_main",
        "oneway",
        &[p.clone(), a.to_string(), n.to_string()],
    );
    src.expect("done");
    assert_eq!(sink.expect("done"), n.to_string());
    sink.wait_success();
    src.wait_success();
    wait_pool_whole(&mgr);
}

#[test]
fn kill9_reclaims_everything_and_peer_sees_reset() {
    setup();
    let p = prefix("kill9");
    let mgr = manager_builder(&p).spawn().unwrap();
    let a = addr(80);
    let mut me = Stack::attach(&p).unwrap();
    me.bind(a).unwrap();
    let mut h = ChildProc::spawn("child_main", "hoarder", &[p.clone(), a.to_string()]);
    // Wait for the hoarder's channel, then leave descriptors in flight to it.
    let first = me.recv_timeout(WATCHDOG).unwrap();
    let peer = first.from;
    for _ in 0..30 {
        let b = me.alloc(64).unwrap();
        me.send(peer, b).unwrap();
    }
    assert_eq!(h.expect("ready"), "45");
    let before = mgr.usage();
    let in_use: u32 = before.iter().map(|u| u.total - u.free).sum();
    assert!(
        in_use >= 40 + 25 + 25,
        "buffers held/in flight before the kill: {in_use}"
    );
    let killed = std::time::Instant::now();
    h.kill9();
    // Not asserted (no time bounds in tests), reported for the record.
    wait_until("manager noticed the death", || mgr.snapshot().deaths == 1);
    eprintln!("kill -9 to buffers reclaimed: {:?}", killed.elapsed());
    // What the hoarder sent before dying is still delivered, then a reset.
    let mut delivered = 1;
    drop(first);
    let err = loop {
        match me.recv_timeout(WATCHDOG) {
            Ok(m) => {
                assert!(verify(&m.buf, delivered));
                delivered += 1;
            }
            Err(e) => break e,
        }
    };
    assert!(matches!(err, Error::Reset(p) if p == peer), "{err}");
    assert_eq!(delivered, 25);
    assert!(matches!(
        me.send(peer, me.alloc(1).unwrap()),
        Err(Error::Reset(_)) | Err(Error::NotConnected(_))
    ));
    // Everything the hoarder owned, cached or had in flight to it is back;
    // only our own private cache remains in use.
    wait_until("manager noticed the death", || mgr.snapshot().deaths == 1);
    wait_sole_holder(&mgr, &me);
    let snap = mgr.snapshot();
    // Held, and in flight to it; with shm also its private cache (DPDK
    // mempools here have none).
    let cache = if test_backend() == xio_core::manager::Backend::Shm {
        5
    } else {
        0
    };
    assert!(snap.reclaimed >= 40 + 30 + cache, "{snap:?}");
    drop(me);
    wait_pool_whole(&mgr);
}

/// A sender stamps a buffer in flight to its receiver (the receiver then
/// owns it) before it pushes the descriptor; `send_burst_with` stamps a
/// whole burst, running the caller's fill in between, before one push. A
/// sender killed in between left those buffers owned by a live receiver
/// but in no ring: reclamation (by owner) passed them over and the
/// receiver never saw them, lost until the receiver exited. The manager
/// now finds them by their sender once the receiver has drained and
/// released the dead one's channel, and leaves alone what is still in
/// the ring until then.
#[test]
fn a_sender_killed_mid_burst_leaks_nothing_to_its_receiver() {
    use std::sync::atomic::Ordering;
    use xio_core::layout::slot_state;
    setup();
    let p = prefix("midburst");
    let mgr = manager_builder(&p).spawn().unwrap();
    let a = addr(97);
    let mut rx = Stack::attach(&p).unwrap();
    rx.bind(a).unwrap();
    let in_flight_to_us = |rx: &Stack| rx.__in_flight_to_me();
    const AT: usize = 20;
    let mut c = ChildProc::spawn(
        "child_main",
        "dies_mid_burst",
        &[p.clone(), a.to_string(), AT.to_string()],
    );
    wait_until("the sender died", || mgr.snapshot().deaths == 1);
    let _ = c.child.wait();
    // Nothing read yet: the first burst is in the ring, AT more were
    // stamped for us and never pushed. The sweep at the death took none
    // of them (we may still read the ring).
    assert_eq!(in_flight_to_us(&rx), BURST + AT);
    // The whole first burst is delivered, intact (no descriptor refused
    // for a buffer taken back under it), then the reset.
    let mut got = 0u64;
    let dead = loop {
        match rx.recv_timeout(WATCHDOG) {
            Ok(m) => {
                assert!(verify(&m.buf, got), "message {got} corrupted");
                got += 1;
            }
            Err(Error::Reset(peer)) => break peer,
            Err(e) => panic!("{e}"),
        }
    };
    assert!(got >= BURST as u64, "received {got}");
    assert_eq!(rx.corrupt_descriptors(), 0);
    // The manager frees the dead stack's slot after its last sweep, the
    // one after we released its channel.
    wait_until("the dead sender's slot freed", || {
        rx.__segment()
            .stack_slot(dead.slot())
            .state
            .load(Ordering::Acquire)
            == slot_state::FREE
    });
    assert_eq!(
        in_flight_to_us(&rx),
        0,
        "buffers stamped for a live receiver by a dead sender were not reclaimed"
    );
    drop(rx);
    wait_pool_whole(&mgr);
}

/// A process that forked keeps, in its child, a copy of every fd it had,
/// its stack's control socket among them; the manager learns of a death
/// only when that socket closes. Killing the parent while the child lives
/// must still reclaim the parent and reset its peers, and the child must
/// not be able to use (or damage) the parent's stack.
#[test]
fn a_forked_child_neither_uses_nor_outlives_its_parents_stack() {
    setup();
    let p = prefix("fork");
    let mgr = manager_builder(&p).spawn().unwrap();
    let a = addr(81);
    let mut me = Stack::attach(&p).unwrap();
    me.bind(a).unwrap();
    let mut h = ChildProc::spawn("child_main", "forker", &[p.clone(), a.to_string()]);
    let first = me.recv_timeout(WATCHDOG).unwrap();
    let peer = first.from;
    me.send(peer, first.buf.into_mut()).unwrap();
    // The forked child connects too, to check a fresh stack works there.
    let grandchild: i32 = h.expect("ready").parse().unwrap();
    let _reap = Reap(grandchild);
    h.kill9();
    // Without the fork handler this waits forever: the child's copy of the
    // control socket kept it open.
    wait_until("manager noticed the death", || mgr.snapshot().deaths >= 1);
    // (The forked child's own stack connected and left: its reset first.)
    loop {
        match me.recv_timeout(WATCHDOG) {
            Err(Error::Reset(p)) if p == peer => break,
            Err(Error::Reset(_)) | Ok(_) => continue,
            Err(e) => panic!("{e}"),
        }
    }
    // The child lives on, and nothing of the parent's is left in use.
    assert!(rustix::process::test_kill_process(
        rustix::process::Pid::from_raw(grandchild).unwrap()
    )
    .is_ok());
    wait_sole_holder(&mgr, &me);
    drop(me);
    wait_pool_whole(&mgr);
}

/// An embedded manager's process forks: the child's copy of the handle
/// must not stop the manager, and once the parent dies its child's copies
/// of the manager's sockets and lock must not hide the death from the
/// stacks or keep a new manager from starting.
#[test]
fn a_forked_child_neither_stops_nor_outlives_its_parents_manager() {
    setup();
    let p = prefix("mgrfork");
    let mut h = ChildProc::spawn("child_main", "manager_forker", std::slice::from_ref(&p));
    h.expect("up");
    let mut st = Stack::attach(&p).unwrap();
    h.tell("fork");
    let grandchild: i32 = h.expect("ready").parse().unwrap();
    let _reap = Reap(grandchild);
    // Still serving after the forked child dropped its handle.
    st.bind(addr(90)).unwrap();
    let mut late = Stack::attach(&p).unwrap();
    late.bind(addr(91)).unwrap();
    h.kill9();
    // Without the fork handler the child's copy of the manager's end of
    // this stack's socket hides the death until the watchdog.
    for s in [&mut st, &mut late] {
        let e = s.recv_timeout(WATCHDOG).unwrap_err();
        assert!(matches!(e, Error::ManagerGone), "{e}");
    }
    // And the lock is free: a new manager starts on the prefix. Not in
    // this process on DPDK: it is already a secondary of the prefix (its
    // stacks), and DPDK's EAL takes one role per process.
    if test_backend() == Backend::Dpdk {
        return;
    }
    let mgr = manager_builder(&p).spawn().unwrap();
    let mut again = Stack::attach(&p).unwrap();
    again.bind(addr(90)).unwrap();
    drop((again, st, late));
    wait_pool_whole(&mgr);
}

#[test]
fn corrupt_descriptors_are_counted_and_rejected() {
    let (mgr, mut rx, mut tx, peer) = manager_and_pair("corrupt", addr(1));
    let good = tx.alloc(10).unwrap();
    // A real descriptor to copy fields from.
    let base = xio_core::layout::Descriptor {
        index: 0,
        len: 10,
        conn: 0,
        class: 0,
        kind: 0,
        gen: 0,
    };
    let forged = [
        xio_core::layout::Descriptor { class: 9, ..base }, // no such class
        xio_core::layout::Descriptor {
            index: 1 << 30,
            ..base
        }, // beyond the class
        xio_core::layout::Descriptor {
            len: 1 << 30,
            ..base
        }, // longer than the buffer
        xio_core::layout::Descriptor {
            index: 4000,
            ..base
        }, // a free buffer: not in flight to rx
        xio_core::layout::Descriptor { kind: 77, ..base }, // unknown kind
    ];
    for d in forged {
        assert!(tx.__push_raw(peer, d).unwrap());
    }
    tx.send(peer, good).unwrap();
    // The receiver skips all five and gets the real one.
    let m = rx.recv_timeout(WATCHDOG).unwrap();
    assert_eq!(m.buf.len(), 10);
    assert_eq!(rx.corrupt_descriptors(), 5);
    // The stream goes on normally afterwards (replays of accepted
    // descriptors are covered by the pool's unit tests).
    let mut b = tx.alloc(20).unwrap();
    b[0] = 42;
    tx.send(peer, b).unwrap();
    let m2 = rx.recv_timeout(WATCHDOG).unwrap();
    assert_eq!(m2.buf[0], 42);
    drop((m, m2));
    assert_eq!(rx.corrupt_descriptors(), 5);
    drop((rx, tx));
    wait_pool_whole(&mgr);
}

/// A descriptor naming a buffer that another peer has in flight to the
/// receiver (its header says so: a hostile stack reads it from the
/// segment, a broken one replays a stale descriptor) is refused when it
/// comes through the wrong peer's ring: taken, it handed the other peer's
/// message out as this one's, and the real descriptor was then refused
/// as corrupt, the message lost to its real sender.
#[test]
fn a_buffer_in_flight_from_another_peer_is_refused() {
    use std::sync::atomic::Ordering;
    use xio_core::layout::{bufword, Descriptor};
    if test_backend() == Backend::Dpdk {
        return; // DPDK's buffer headers do not name the sender
    }
    let (mgr, mut rx, mut good, to) = manager_and_pair("wrongsender", addr(96));
    let mut evil = Stack::attach(mgr.prefix()).unwrap();
    let evil_to = evil.connect(addr(96)).unwrap();
    let seg = evil.__segment().clone();
    // The receiver reads its rings in turn, starting at another each
    // time: over a few rounds the forgery is read before the real one.
    for round in 0..4u32 {
        let mut b = good.alloc(10).unwrap();
        b.copy_from(b"good bytes");
        good.send_tagged(to, round, b).unwrap();
        // The good message's buffer, as its header shows it.
        let (index, w) = (0..seg.classes()[0].count)
            .map(|i| {
                (
                    i,
                    seg.buf_header(0, i).unwrap().word.load(Ordering::Acquire),
                )
            })
            .find(|&(_, w)| {
                bufword::state(w) == bufword::INFLIGHT && bufword::owner(w) == to.slot()
            })
            .expect("the good message in flight");
        let forged = Descriptor {
            index,
            len: 10,
            conn: 99,
            class: 0,
            kind: 0,
            gen: bufword::gen(w) as u16,
        };
        assert!(evil.__push_raw(evil_to, forged).unwrap());
        let m = rx.recv_timeout(WATCHDOG).unwrap();
        assert_eq!(
            (m.from, m.tag, &m.buf[..]),
            (good.id(), round, &b"good bytes"[..]),
            "round {round}: the good peer's message came as the hostile one's"
        );
        // Both descriptors read: the forgery is counted.
        assert!(matches!(
            rx.recv_timeout(std::time::Duration::from_millis(20)),
            Err(Error::TimedOut)
        ));
        assert_eq!(rx.corrupt_descriptors(), u64::from(round) + 1);
    }
    drop((rx, good, evil));
    wait_pool_whole(&mgr);
}

/// A ring slot that claims an impossible number of descriptors (slots
/// carry one to three) makes the ring corrupt: the receiver delivers what
/// came before it, counts it, reports the peer reset and gives the channel
/// up; the manager closes it for the sender too, whose sends are reset
/// instead of filling a ring nobody reads. Other peers are served as
/// before, and the two may connect again on a fresh channel.
#[test]
fn a_ring_slot_with_an_impossible_count_breaks_only_its_channel() {
    if test_backend() == Backend::Dpdk {
        return; // DPDK rings carry one descriptor a slot and no count
    }
    let (mgr, mut rx, mut tx, peer) = manager_and_pair("slotcount", addr(95));
    let mut good = tx.alloc(10).unwrap();
    good[0] = 7;
    tx.send(peer, good).unwrap();
    assert!(tx.__push_slot_count(peer, 9).unwrap());
    let m = rx.recv_timeout(WATCHDOG).unwrap();
    assert_eq!(m.buf[0], 7);
    let from = m.from;
    drop(m);
    let e = rx.recv_timeout(WATCHDOG).unwrap_err();
    assert!(matches!(e, Error::Reset(p) if p == from), "{e}");
    assert_eq!(rx.corrupt_descriptors(), 1);
    // The sender is told (through the manager) and its sends are reset.
    // Until the manager's word arrives they still land in the ring, which
    // holds 1024: fewer tries than that, never a wait on a full ring.
    let mut tries = 0;
    loop {
        let b = tx.alloc(10).unwrap();
        match tx.send(peer, b) {
            Err(Error::Reset(p)) if p == peer => break,
            Ok(()) if tries < 1000 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            other => panic!("the sender was not reset: {other:?}"),
        }
    }
    // `from` connects to the receiver afresh and a message gets through.
    let gets_through = |from: &mut Stack, rx: &mut Stack, tag: u8| {
        let to = from.connect(addr(95)).unwrap();
        let mut b = from.alloc(10).unwrap();
        b[0] = tag;
        from.send(to, b).unwrap();
        let m = rx.recv_timeout(WATCHDOG).unwrap();
        assert_eq!(m.buf[0], tag);
    };
    // A new connection between the two works; another peer is served as
    // before.
    gets_through(&mut tx, &mut rx, 9);
    let mut other = Stack::attach(mgr.prefix()).unwrap();
    gets_through(&mut other, &mut rx, 8);
    drop((rx, tx, other));
    wait_pool_whole(&mgr);
}

#[test]
fn connect_to_unbound_address_is_refused_and_bind_conflicts() {
    setup();
    let p = prefix("refused");
    let _mgr = manager_builder(&p).spawn().unwrap();
    let mut a = Stack::attach(&p).unwrap();
    let mut b = Stack::attach(&p).unwrap();
    // A stack that requires the other backend is refused, clearly.
    let other = match test_backend() {
        Backend::Shm => Backend::Dpdk,
        Backend::Dpdk => Backend::Shm,
    };
    let e = Stack::builder(&p)
        .require_backend(other)
        .attach()
        .unwrap_err();
    assert!(e.to_string().contains("backend, not"), "{e}");
    Stack::builder(&p)
        .require_backend(test_backend())
        .attach()
        .unwrap();
    let e = a.connect(addr(5)).unwrap_err();
    assert_eq!(
        std::io::Error::from(e).kind(),
        std::io::ErrorKind::ConnectionRefused
    );
    a.bind(addr(5)).unwrap();
    let e = b.bind(addr(5)).unwrap_err();
    // The message names the process holding it.
    assert!(
        e.to_string()
            .contains(&format!("bound by process {}", std::process::id())),
        "{e}"
    );
    assert_eq!(
        std::io::Error::from(e).kind(),
        std::io::ErrorKind::AddrInUse
    );
    assert!(Stack::attach("no-such-pool-here").is_err());
}

#[test]
fn waiting_modes_all_deliver() {
    setup();
    let p = prefix("modes");
    let mgr = manager_builder(&p).spawn().unwrap();
    let mut server = Stack::attach(&p).unwrap();
    server.bind(addr(3)).unwrap();
    let pp = p.clone();
    let t = std::thread::spawn(move || {
        for mode in [
            WaitMode::Adaptive,
            WaitMode::Blocking,
            WaitMode::BusyPoll,
            WaitMode::NonBlocking,
        ] {
            let mut c = Stack::builder(&pp).wait_mode(mode).attach().unwrap();
            let peer = c.connect(addr(3)).unwrap();
            for i in 0..2000u64 {
                // Non-blocking, an allocation may find the shared lists
                // closed for a moment (the manager reclaiming the stack
                // before this one): try again, as with a receive.
                let mut b = loop {
                    match c.alloc(8) {
                        Ok(b) => break b,
                        Err(Error::WouldBlock) if mode == WaitMode::NonBlocking => {
                            std::hint::spin_loop()
                        }
                        Err(e) => panic!("{mode:?}: alloc: {e}"),
                    }
                };
                b.copy_from(&i.to_le_bytes());
                c.send(peer, b).unwrap();
                let m = loop {
                    match c.recv() {
                        Ok(m) => break m,
                        Err(Error::WouldBlock) => std::hint::spin_loop(),
                        Err(e) => panic!("{mode:?}: {e}"),
                    }
                };
                assert_eq!(&m.buf[..], &i.to_le_bytes());
            }
            assert!(matches!(c.try_recv(), Err(Error::WouldBlock)));
            assert!(matches!(
                c.recv_timeout(std::time::Duration::from_millis(5)),
                Err(Error::TimedOut)
            ));
        }
    });
    let mut served = 0;
    while served < 8000 {
        match server.recv_timeout(WATCHDOG) {
            Ok(m) => {
                let from = m.from;
                server.send(from, m.buf.into_mut()).unwrap();
                served += 1;
            }
            Err(Error::Reset(_)) => {}
            Err(e) => panic!("{e}"),
        }
    }
    t.join().unwrap();
    drop(server);
    wait_pool_whole(&mgr);
}

/// Waits until stack `peer` (seen from `s`, which shares its segment)
/// sleeps: its slot's `sleeping` word is set only on the way into a sleep.
fn wait_asleep(s: &Stack, peer: PeerId, what: &str) {
    let slot = s.__segment().stack_slot(peer.slot());
    wait_until(what, || {
        slot.sleeping.load(std::sync::atomic::Ordering::Relaxed) != 0
    });
}

#[test]
fn a_sleeping_stack_is_woken_by_its_peer_leaving() {
    let (mgr, mut server, mut client, peer) = manager_and_pair("sleepreset", addr(11));
    let b = client.alloc(8).unwrap();
    client.send(peer, b).unwrap();
    let t = std::thread::spawn(move || {
        let m = server.recv().unwrap();
        drop(m);
        // Now idle long past any spin budget: the stack sleeps.
        let r = server.recv();
        (r.map(|_| ()), server.spin_policy().sleeps)
    });
    // Leave only once the server sleeps (not merely "after a while": a
    // starved thread may still be spinning then).
    wait_asleep(&client, peer, "the server sleeps");
    drop(client);
    wait_until("the sleeping server returned", || t.is_finished());
    let (r, sleeps) = t.join().unwrap();
    assert!(matches!(r, Err(Error::Reset(_))), "{r:?}");
    assert!(sleeps >= 1, "the server did go to sleep");
    wait_pool_whole(&mgr);
}

#[test]
fn an_idle_service_process_exits_when_its_client_leaves() {
    setup();
    let p = prefix("idleexit");
    let mgr = manager_builder(&p).spawn().unwrap();
    let a = addr(12);
    let mut server = ChildProc::spawn(
        "child_main",
        "echo_until_reset",
        &[p.clone(), a.to_string()],
    );
    server.expect("ready");
    let mut c = Stack::attach(&p).unwrap();
    let peer = c.connect(a).unwrap();
    for _ in 0..1000 {
        let b = c.alloc(64).unwrap();
        c.send(peer, b).unwrap();
        drop(c.recv_timeout(WATCHDOG).unwrap());
    }
    // Leave only once the service sleeps.
    wait_asleep(&c, peer, "the service sleeps");
    drop(c);
    let sleeps: u64 = server.expect("reset").parse().unwrap();
    assert!(sleeps >= 1);
    server.wait_success();
    wait_pool_whole(&mgr);
}

#[test]
fn a_dead_manager_is_reported_once_and_channels_keep_working() {
    let (mgr, mut server, mut client, peer) = manager_and_pair("mgrgone", addr(13));
    mgr.stop();
    // Within a liveness tick the server notices; then the data path still works.
    let e = server.recv_timeout(WATCHDOG).unwrap_err();
    assert!(matches!(e, Error::ManagerGone), "{e}");
    let mut b = client.alloc(4).unwrap();
    b.copy_from(b"ping");
    client.send(peer, b).unwrap();
    assert_eq!(&server.recv_timeout(WATCHDOG).unwrap().buf[..], b"ping");
    assert!(matches!(
        client.connect(addr(14)),
        Err(Error::ManagerGone) | Err(Error::Io(_))
    ));
}

/// `recv_burst` that meets the manager's end after it has messages in hand
/// returns them, and the error at the next call: an `Err` never comes with
/// messages a caller would drop unread.
#[test]
fn recv_burst_returns_its_messages_before_an_error() {
    let (mgr, mut server, mut client, peer) = manager_and_pair("burstgone", addr(15));
    for i in 0..3u8 {
        let mut b = client.alloc(1).unwrap();
        b.copy_from(&[i]);
        client.send(peer, b).unwrap();
    }
    // The first takes all three off the ring and returns one.
    let mut out = Vec::new();
    assert_eq!(server.recv_burst(&mut out, 1).unwrap(), 1);
    // News for the server (a new channel), then the manager's end: the
    // next look at the control socket finds it closed.
    let mut late = Stack::attach(mgr.prefix()).unwrap();
    late.connect(addr(15)).unwrap();
    mgr.stop();
    out.clear();
    assert_eq!(server.recv_burst(&mut out, 10).unwrap(), 2);
    let got: Vec<u8> = out.iter().map(|m| m.buf[0]).collect();
    assert_eq!(got, [1, 2]);
    let e = server.recv_burst(&mut out, 10).unwrap_err();
    assert!(matches!(e, Error::ManagerGone), "{e}");
    assert_eq!(out.len(), 2);
}

/// Two processes on one core: the adaptive waiter must see its peer on its
/// own CPU and sleep instead of spinning (a spinner there costs the peer a
/// whole scheduler tick per message).
#[test]
fn adaptive_waiters_sharing_one_core_do_not_spin() {
    setup();
    let p = prefix("onecore");
    let mgr = manager_builder(&p).spawn().unwrap();
    let a = addr(15);
    let mut server = ChildProc::spawn("child_main", "echo_on_cpu0", &[p.clone(), a.to_string()]);
    server.expect("ready");
    let t = std::thread::spawn(move || {
        let mut set = rustix::thread::CpuSet::new();
        set.set(0);
        rustix::thread::sched_setaffinity(None, &set).unwrap();
        let mut c = Stack::attach(&p).unwrap();
        let peer = c.connect(a).unwrap();
        // Start once the server sleeps: it has published its CPU then,
        // however late the scheduler ran it.
        wait_asleep(&c, peer, "the server sleeps");
        for i in 0..2000u32 {
            let mut b = c.alloc(4).unwrap();
            b.copy_from(&i.to_le_bytes());
            c.send(peer, b).unwrap();
            assert_eq!(&c.recv().unwrap().buf[..], &i.to_le_bytes());
        }
        c.spin_policy().clone()
    });
    wait_until("client finished", || t.is_finished());
    let policy = t.join().unwrap();
    // The very first wait may start before the server has published its
    // CPU; every later one must sleep at once. (Many waits find the reply
    // already there: waking the server on our core often runs it at once.)
    assert!(policy.spins <= 1, "{policy:?}");
    assert!(policy.sleeps >= 100, "{policy:?}");
    let _server_sleeps: u64 = server.expect("reset").parse().unwrap();
    server.wait_success();
    wait_pool_whole(&mgr);
}

#[test]
fn burst_apis_stream_checksummed_messages_between_processes() {
    setup();
    let p = prefix("burstapi");
    let cfg = PoolConfig {
        classes: vec![(2048, 512)],
        ring_capacity: 64,
        ..PoolConfig::default()
    };
    let mgr = manager_builder(&p).pool(cfg).spawn().unwrap();
    let a = addr(16);
    let n = 200_000u64;
    let mut sink = ChildProc::spawn(
        "child_main",
        "burst_sink",
        &[p.clone(), a.to_string(), n.to_string()],
    );
    sink.expect("ready");
    let mut s = Stack::attach(&p).unwrap();
    let peer = s.connect(a).unwrap();
    let mut sent = 0u64;
    while sent < n {
        // Bursts of varying length and message size.
        let k = (1 + sent % 40).min(n - sent);
        let len = 64 + (sent as usize * 13) % 1900;
        s.send_burst_with(peer, k as usize, len, |i, payload| {
            fill(payload, sent + i as u64)
        })
        .unwrap();
        sent += k;
    }
    assert_eq!(sink.expect("done"), n.to_string());
    sink.wait_success();
    drop(s);
    wait_pool_whole(&mgr);
}

#[test]
fn a_buffer_of_another_pool_is_refused_and_both_pools_stay_whole() {
    // Two pools in one process (a bridge between two prefixes, say). A
    // buffer's (class, index) means nothing in the other pool: sending it
    // there would hand the peer a buffer that may be someone else's.
    let a = addr(9301);
    let (mgr1, mut s1, mut c1, p1) = manager_and_pair("foreign-1", a);
    // Pool 2 is shm even when the suite runs on DPDK: a process can join
    // one DPDK prefix only, so a DPDK pool's foreign buffers come from shm
    // pools (and the check is exercised both ways).
    let pre2 = prefix("foreign-2");
    let mgr2 = xio_core::manager::Manager::builder(&pre2)
        .backend(Backend::Shm)
        .spawn()
        .unwrap();
    let mut s2 = Stack::attach(&pre2).unwrap();
    s2.bind(a).unwrap();
    let mut c2 = Stack::attach(&pre2).unwrap();
    let p2 = c2.connect(a).unwrap();

    // Allocated in pool 1, sent through pool 2: refused, handed back.
    let mut b = c1.alloc(64).unwrap();
    b.copy_from(&[7u8; 64]);
    let (e, back) = c2.try_send(p2, b).unwrap_err();
    assert!(matches!(e, xio_core::stack::Error::ForeignBuffer), "{e}");
    let back = back.expect("the buffer comes back");
    assert_eq!(&back[..], &[7u8; 64]);
    assert!(matches!(
        c2.send(p2, back),
        Err(xio_core::stack::Error::ForeignBuffer)
    ));
    let mut burst = vec![c2.alloc(64).unwrap(), c1.alloc(64).unwrap()];
    assert!(matches!(
        c2.send_burst(p2, &mut burst),
        Err(xio_core::stack::Error::ForeignBuffer)
    ));
    assert_eq!(burst.len(), 2, "nothing of a refused burst is sent");
    drop(burst);

    // Received in pool 1 and forwarded in place through pool 2 (the
    // L2-forwarder pattern across prefixes): refused too.
    let b = c1.alloc(64).unwrap();
    c1.send(p1, b).unwrap();
    let m = s1.recv().unwrap();
    let from1 = m.from;
    assert!(matches!(
        c2.send(p2, m.buf.into_mut()),
        Err(xio_core::stack::Error::ForeignBuffer)
    ));

    // Another stack of the same pool may send it: same segment, the
    // ownership protocol does not care which of our stacks allocated it.
    let mut b = c1.alloc(64).unwrap();
    b.copy_from(&[9u8; 64]);
    s1.send(from1, b).unwrap();
    let m = c1.recv().unwrap();
    assert_eq!(&m.buf[..], &[9u8; 64]);
    drop(m);

    // Pool 2 still works, and each pool gets every buffer back.
    let b = c2.alloc(64).unwrap();
    c2.send(p2, b).unwrap();
    drop(s2.recv().unwrap());
    drop((s1, c1, s2, c2));
    wait_pool_whole(&mgr1);
    wait_pool_whole(&mgr2);
}
/// A receive "waiting at most" an unbounded timeout (`Duration::MAX`, as
/// one writes "forever") receives; it does not panic on the deadline's
/// arithmetic.
#[test]
fn recv_timeout_of_duration_max_receives() {
    let (mgr, mut server, mut client, peer) = manager_and_pair("maxtimeout", addr(9401));
    let mut b = client.alloc(4).unwrap();
    b.copy_from(b"ping");
    client.send(peer, b).unwrap();
    let m = server
        .recv_timeout(std::time::Duration::MAX)
        .expect("the message that is there");
    assert_eq!(&m.buf[..], b"ping");
    drop(m);
    drop((server, client));
    wait_pool_whole(&mgr);
}

/// A manager whose rings hold 4 slots, and a server bound to `a` with a
/// client connected to it: rings fill after four lone sends.
fn manager_and_small_rings(
    test: &str,
    a: SocketAddr,
) -> (xio_core::manager::ManagerHandle, Stack, Stack, PeerId) {
    setup();
    let p = prefix(test);
    let cfg = PoolConfig {
        ring_capacity: 4,
        ..PoolConfig::default()
    };
    let mgr = manager_builder(&p).pool(cfg).spawn().unwrap();
    let mut server = Stack::attach(&p).unwrap();
    server.bind(a).unwrap();
    let mut client = Stack::attach(&p).unwrap();
    let peer = client.connect(a).unwrap();
    (mgr, server, client, peer)
}

/// Fills the ring from `s` to `peer` with lone sends.
fn fill_ring(s: &mut Stack, peer: PeerId) {
    loop {
        let b = s.alloc(8).unwrap();
        match s.try_send(peer, b) {
            Ok(()) => {}
            Err((Error::WouldBlock, _)) => return,
            Err((e, _)) => panic!("{e}"),
        }
    }
}

/// A send waiting for room in the ring of a peer that leaves meanwhile
/// fails with `Reset` (as a send that finds it gone does), not with
/// `NotConnected`.
#[test]
fn a_send_waiting_on_a_full_ring_is_reset_when_its_peer_leaves() {
    let (mgr, server, mut client, peer) = manager_and_small_rings("fullreset", addr(9402));
    fill_ring(&mut client, peer);
    let t = std::thread::spawn(move || {
        let b = client.alloc(8).unwrap();
        let r = client.send(peer, b);
        (r, client)
    });
    // Let the sender get into its wait for room (if it has not, it finds
    // the channel closed at once: the test passes without telling).
    std::thread::sleep(std::time::Duration::from_millis(100));
    drop(server);
    wait_until("the waiting send returned", || t.is_finished());
    let (r, mut client) = t.join().unwrap();
    assert!(matches!(r, Err(Error::Reset(p)) if p == peer), "{r:?}");
    // The reset is not reported twice as something else either.
    let again = client.alloc(8).unwrap();
    let r2 = client.send(peer, again);
    assert!(r2.is_err(), "{r2:?}");
    drop(client);
    wait_pool_whole(&mgr);
}
/// `send_burst` in non-blocking mode does not wait for room: with the
/// ring full it fails with `WouldBlock` and hands back what it did not
/// send, as `send` and `send_burst_with` do.
#[test]
fn a_non_blocking_send_burst_on_a_full_ring_would_block() {
    let (mgr, mut server, mut client, peer) = manager_and_small_rings("nbburst", addr(9403));
    client.set_wait_mode(WaitMode::NonBlocking);
    fill_ring(&mut client, peer);
    let t = std::thread::spawn(move || {
        let mut bufs = vec![client.alloc(8).unwrap(), client.alloc(8).unwrap()];
        let r = client.send_burst(peer, &mut bufs);
        (r, bufs.len(), client)
    });
    // Watchdog: on a full ring that nobody drains, a wait never ends.
    let deadline = std::time::Instant::now() + WATCHDOG;
    while !t.is_finished() {
        if std::time::Instant::now() >= deadline {
            // Unblock the sender so the process can end cleanly.
            while server.try_recv().is_ok() {}
            panic!("watchdog: a non-blocking send_burst waited for room");
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let (r, left, client) = t.join().unwrap();
    assert!(matches!(r, Err(Error::WouldBlock)), "{r:?}");
    assert_eq!(left, 2, "nothing was sent, both buffers handed back");
    drop((server, client));
    wait_pool_whole(&mgr);
}

/// `send_burst_with` in non-blocking mode does not wait for buffers
/// either: with the pool exhausted it fails with `WouldBlock`. On the
/// DPDK backend the pool answered "none" as `Ok(0)` where the shm pool
/// says `Exhausted`, and `send_burst_with` took that for a burst of
/// nothing and went round again: it never returned while the buffers
/// were held, here by the caller itself.
#[test]
fn a_non_blocking_send_burst_with_on_an_exhausted_pool_would_block() {
    setup();
    let p = prefix("nbexhaust");
    let cfg = PoolConfig {
        classes: vec![(64, 16)],
        ..PoolConfig::default()
    };
    let mgr = manager_builder(&p).pool(cfg).spawn().unwrap();
    let a = addr(9407);
    let mut server = Stack::attach(&p).unwrap();
    server.bind(a).unwrap();
    let mut client = Stack::attach(&p).unwrap();
    let peer = client.connect(a).unwrap();
    client.set_wait_mode(WaitMode::NonBlocking);
    let mut held = Vec::new();
    while let Ok(b) = client.try_alloc(8) {
        held.push(b);
    }
    let t = std::thread::spawn(move || {
        let r = client.send_burst_with(peer, 1, 8, |_, p| p.fill(1));
        (r, client)
    });
    // Watchdog: a wait for buffers the caller holds never ends.
    let deadline = std::time::Instant::now() + WATCHDOG;
    while !t.is_finished() {
        if std::time::Instant::now() >= deadline {
            // Let the sender go so the process can end cleanly.
            drop(held);
            panic!("watchdog: a non-blocking send_burst_with waited for buffers");
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let (r, client) = t.join().unwrap();
    assert!(matches!(r, Err(Error::WouldBlock)), "{r:?}");
    drop((held, server, client));
    wait_pool_whole(&mgr);
}

/// An `alloc_burst` of more buffers than its class holds can never be
/// met: it waited for ever (even in non-blocking mode it only said
/// `WouldBlock`, as if a retry could succeed). It is refused at once,
/// taking nothing.
#[test]
fn an_alloc_burst_larger_than_its_class_is_refused_at_once() {
    setup();
    let p = prefix("burstbig");
    // No quota: one stack may take a whole class (past its quota, a burst
    // is refused the same way; see the pool's quota tests).
    let cfg = PoolConfig {
        classes: vec![(64, 8), (256, 4)],
        quotas: vec![(64, 8), (256, 4)],
        ..PoolConfig::default()
    };
    let mgr = manager_builder(&p).pool(cfg).spawn().unwrap();
    let a = Stack::attach(&p).unwrap();
    let r = std::thread::spawn(move || {
        let mut out = Vec::new();
        // 100-byte buffers come from the class of 4.
        let r = a.alloc_burst(100, 5, &mut out);
        (r, out, a)
    });
    let deadline = std::time::Instant::now() + WATCHDOG;
    while !r.is_finished() {
        assert!(
            std::time::Instant::now() < deadline,
            "watchdog: an alloc_burst larger than its class waited"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let (r, out, a) = r.join().unwrap();
    let e = r.unwrap_err();
    assert_eq!(
        std::io::Error::from(e).kind(),
        std::io::ErrorKind::InvalidInput
    );
    assert!(out.is_empty());
    // The whole class still comes at once.
    let mut out = Vec::new();
    a.alloc_burst(100, 4, &mut out).unwrap();
    assert_eq!(out.len(), 4);
    drop((out, a));
    wait_pool_whole(&mgr);
}

/// `alloc_burst` kept the buffers it had while it waited for the rest: a
/// stack that needed one more before it could free its own (another burst
/// waiting the same way, or a writer finishing a message) waited for
/// ever. Here `a` wants the whole class of 8 while `m` holds 4 and wants
/// a fifth: `a` must give back what it took while it waits.
#[test]
fn a_waiting_alloc_burst_holds_no_buffers() {
    use std::sync::atomic::Ordering;
    use xio_core::layout::bufword;
    setup();
    if test_backend() == Backend::Dpdk {
        eprintln!("skipped on the DPDK backend: it watches the shm buffer headers");
        return;
    }
    let p = prefix("burstwait");
    // No quota: `a` asks for the whole class.
    let cfg = PoolConfig {
        classes: vec![(64, 8)],
        quotas: vec![(64, 8)],
        ..PoolConfig::default()
    };
    let mgr = manager_builder(&p).pool(cfg).spawn().unwrap();
    let m = Stack::attach(&p).unwrap();
    let a = Stack::attach(&p).unwrap();
    let held: Vec<_> = (0..4).map(|_| m.try_alloc(8).unwrap()).collect();
    let seg = m.__segment().clone();
    let gens = || -> Vec<u32> {
        (0..8)
            .map(|i| bufword::gen(seg.buf_header(0, i).unwrap().word.load(Ordering::SeqCst)))
            .collect()
    };
    let before = gens();
    let burst = std::thread::spawn(move || {
        let mut out = Vec::new();
        let r = a.alloc_burst(8, 8, &mut out);
        (r, out, a)
    });
    // Every allocation bumps a buffer's generation: once four changed,
    // `a` has taken the four free buffers (at least once).
    wait_until("the burst took the free buffers", || {
        gens().iter().zip(&before).filter(|(x, y)| x != y).count() >= 4
    });
    let fifth = std::thread::spawn(move || {
        let b = m.alloc(8);
        (b, m)
    });
    let deadline = std::time::Instant::now() + WATCHDOG;
    while !fifth.is_finished() {
        if std::time::Instant::now() >= deadline {
            drop(held);
            panic!("watchdog: an alloc waited while a waiting alloc_burst held the pool");
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let (b, m) = fifth.join().unwrap();
    drop((b.unwrap(), held));
    let (r, out, a) = burst.join().unwrap();
    r.unwrap();
    assert_eq!(out.len(), 8);
    drop((out, a, m));
    wait_pool_whole(&mgr);
}

/// A busy-polling stack never sleeps, so no liveness tick tells it of a
/// dead manager: it must still report the manager gone, and then a peer
/// process that dies afterwards (no manager left to say so) as a reset,
/// as the sleeping modes do, instead of polling its ring for ever.
#[test]
fn a_busy_polling_stack_learns_of_a_dead_manager_and_then_a_dead_peer() {
    setup();
    let p = prefix("busydead");
    let mgr = manager_builder(&p).spawn().unwrap();
    let a = addr(9404);
    let mut server = ChildProc::spawn("child_main", "bind_and_park", &[p.clone(), a.to_string()]);
    server.expect("ready");
    let mut c = Stack::builder(&p)
        .wait_mode(WaitMode::BusyPoll)
        .attach()
        .unwrap();
    let peer = c.connect(a).unwrap();
    mgr.stop();
    // Bounded waits (a timeout is a failure, not a hang).
    let limit = WATCHDOG;
    let e = c.recv_timeout(limit).unwrap_err();
    assert!(matches!(e, Error::ManagerGone), "{e}");
    server.kill9();
    let e = c.recv_timeout(limit).unwrap_err();
    assert!(matches!(e, Error::Reset(x) if x == peer), "{e}");
}

/// With no manager left, a send waiting for room in the ring of a peer
/// process that dies is reset (the peer's pidfd says so, as it does for a
/// receive), in each of the send paths, instead of waiting for ever.
#[test]
fn with_the_manager_gone_sends_waiting_on_a_dead_peers_full_ring_are_reset() {
    setup();
    let p = prefix("sendnomgr");
    let cfg = PoolConfig {
        ring_capacity: 4,
        ..PoolConfig::default()
    };
    let mgr = manager_builder(&p).pool(cfg).spawn().unwrap();
    let mut children = Vec::new();
    let mut stacks = Vec::new();
    for (k, mode) in [WaitMode::Adaptive, WaitMode::Blocking, WaitMode::BusyPoll]
        .into_iter()
        .enumerate()
    {
        let a = addr(9410 + k as u16);
        let mut child =
            ChildProc::spawn("child_main", "bind_and_park", &[p.clone(), a.to_string()]);
        child.expect("ready");
        let mut c = Stack::builder(&p).wait_mode(mode).attach().unwrap();
        let peer = c.connect(a).unwrap();
        fill_ring(&mut c, peer);
        children.push(child);
        stacks.push((c, peer));
    }
    mgr.stop();
    for child in &mut children {
        child.kill9();
    }
    let mut threads = Vec::new();
    for (k, (mut c, peer)) in stacks.into_iter().enumerate() {
        threads.push(std::thread::spawn(move || {
            // Every error, in order: of the sends (the manager's end is
            // reported once, by whichever call finds it, and a send that
            // reports it may be tried again), then of two receives.
            let mut errs = Vec::new();
            for _ in 0..2 {
                let r = match k {
                    0 => {
                        let b = c.alloc(8).unwrap();
                        c.send(peer, b)
                    }
                    1 => {
                        let mut bufs = vec![c.alloc(8).unwrap()];
                        c.send_burst(peer, &mut bufs)
                    }
                    _ => c.send_burst_with(peer, 1, 8, |_, _| {}),
                };
                let e = r.expect_err("a send to a dead peer's full ring");
                let again = matches!(e, Error::ManagerGone);
                errs.push(e);
                if !again {
                    break;
                }
            }
            let wait = std::time::Duration::from_secs(5);
            for _ in 0..2 {
                match c.recv_timeout(wait) {
                    Err(Error::TimedOut) => break,
                    Err(e) => errs.push(e),
                    Ok(m) => panic!("no message was sent to us: {m:?}"),
                }
            }
            (k, peer, errs)
        }));
    }
    // Watchdog: on main these waited for ever.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    for t in threads {
        while !t.is_finished() {
            assert!(
                std::time::Instant::now() < deadline,
                "watchdog: a send waited for room in a dead peer's ring"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let (k, peer, errs) = t.join().unwrap();
        let gone = errs
            .iter()
            .filter(|e| matches!(e, Error::ManagerGone))
            .count();
        let resets: Vec<_> = errs
            .iter()
            .filter_map(|e| match e {
                Error::ManagerGone => None,
                Error::Reset(p) => Some(*p),
                other => panic!("send path {k}: {other} in {errs:?}"),
            })
            .collect();
        // The send ends in the reset, the receive reports it too, and the
        // manager's end is reported exactly once.
        assert_eq!(gone, 1, "send path {k}: {errs:?}");
        assert_eq!(resets, [peer, peer], "send path {k}: {errs:?}");
    }
}

/// A receive on a stack inherited across fork() fails with `Forked` even
/// when messages wait in the stack's inbox (taken off the ring by the
/// parent before the fork): handing them out in the child would give two
/// processes the same buffers.
#[test]
fn a_forked_child_gets_none_of_its_parents_queued_messages() {
    setup();
    let p = prefix("forkinbox");
    let mgr = manager_builder(&p).spawn().unwrap();
    let a = addr(9420);
    let mut h = ChildProc::spawn(
        "child_main",
        "forks_with_queued_messages",
        &[p.clone(), a.to_string()],
    );
    h.expect("ready");
    let mut me = Stack::attach(&p).unwrap();
    let peer = me.connect(a).unwrap();
    let mut bufs: Vec<_> = (0..3).map(|_| me.alloc(16).unwrap()).collect();
    me.send_burst(peer, &mut bufs).unwrap();
    assert_eq!(h.expect("verdict"), "ok");
    h.expect("done");
    h.wait_success();
    drop(me);
    wait_pool_whole(&mgr);
}

/// `recv_burst_with` of at most 0 messages shows none and returns 0; it
/// does not wait (for ever: however many messages are ready, it may take
/// none of them).
#[test]
fn recv_burst_with_of_at_most_zero_messages_returns_zero() {
    let (mgr, server, mut client, peer) = manager_and_pair("burstzero", addr(9421));
    let b = client.alloc(8).unwrap();
    client.send(peer, b).unwrap();
    let t = std::thread::spawn(move || {
        let mut server = server;
        let mut shown = 0;
        let r = server.recv_burst_with(0, |_, _, _| shown += 1);
        (r, shown, server)
    });
    // Watchdog (short: on main the call spins on the ready ring).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !t.is_finished() {
        assert!(
            std::time::Instant::now() < deadline,
            "watchdog: recv_burst_with(0) did not return"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let (r, shown, mut server) = t.join().unwrap();
    assert_eq!(r.unwrap(), 0);
    assert_eq!(shown, 0);
    // The message is still there for the next receive.
    assert_eq!(server.recv_timeout(WATCHDOG).unwrap().buf.len(), 8);
    drop((server, client));
    wait_pool_whole(&mgr);
}

/// `recv_burst_with` that meets a broken ring after showing messages of
/// another channel returns how many it showed; the broken channel's reset
/// comes at the next call. It used to return the result of a receive
/// made for the broken ring instead: an error with messages shown (a
/// caller counting from the result loses them), or a count of 1.
#[test]
fn recv_burst_with_counts_what_it_showed_before_a_broken_ring() {
    if test_backend() == Backend::Dpdk {
        return; // DPDK rings carry one descriptor a slot and no count
    }
    // The channel tried first rotates: run it with each first.
    for extra in 0..2 {
        setup();
        let p = prefix(&format!("burstbroken{extra}"));
        let mgr = manager_builder(&p).spawn().unwrap();
        let a = addr(9430);
        let mut server = Stack::attach(&p).unwrap();
        server.bind(a).unwrap();
        let mut good = Stack::attach(&p).unwrap();
        let gp = good.connect(a).unwrap();
        let mut bad = Stack::attach(&p).unwrap();
        let bp = bad.connect(a).unwrap();
        // Everything is in the rings before the receives: none waits.
        server.set_wait_mode(WaitMode::NonBlocking);
        // Both channels up at the server; then turn the rotation.
        for _ in 0..1 + extra {
            assert!(matches!(server.try_recv(), Err(Error::WouldBlock)));
        }
        for i in 0..3u8 {
            let mut b = good.alloc(1).unwrap();
            b.copy_from(&[i]);
            good.send(gp, b).unwrap();
        }
        assert!(bad.__push_slot_count(bp, 9).unwrap());
        let mut shown = 0;
        let mut total = 0;
        let mut resets = 0;
        while resets == 0 || total < 3 {
            let mut calls = 0;
            match server.recv_burst_with(64, |_, _, _| calls += 1) {
                Ok(n) => assert_eq!(n, calls, "round {extra}: returned {n}, showed {calls}"),
                Err(Error::Reset(_)) => {
                    assert_eq!(calls, 0, "round {extra}: an error after {calls} shown");
                    resets += 1;
                }
                Err(e) => panic!("{e}"),
            }
            total += calls;
            shown += 1;
            assert!(
                shown < 10,
                "round {extra}: {total} messages, {resets} resets"
            );
        }
        assert_eq!((total, resets), (3, 1));
        drop((server, good, bad));
        wait_pool_whole(&mgr);
    }
}

/// A non-blocking stack never waits, so no liveness tick tells it of a
/// dead manager either: polled with `try_recv`, it must still report the
/// manager gone, and then a peer process that dies afterwards as a reset,
/// instead of `WouldBlock` for ever.
#[test]
fn a_non_blocking_stack_learns_of_a_dead_manager_and_then_a_dead_peer() {
    setup();
    let p = prefix("nbdead");
    let mgr = manager_builder(&p).spawn().unwrap();
    let a = addr(9440);
    let mut server = ChildProc::spawn("child_main", "bind_and_park", &[p.clone(), a.to_string()]);
    server.expect("ready");
    let mut c = Stack::builder(&p)
        .wait_mode(WaitMode::NonBlocking)
        .attach()
        .unwrap();
    let peer = c.connect(a).unwrap();
    // Polls until something other than WouldBlock (watchdog: 20 s).
    let poll = |c: &mut Stack| {
        let deadline = std::time::Instant::now() + WATCHDOG;
        loop {
            match c.try_recv() {
                Err(Error::WouldBlock) => {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "watchdog: only WouldBlock"
                    );
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                r => return r,
            }
        }
    };
    mgr.stop();
    let e = poll(&mut c).unwrap_err();
    assert!(matches!(e, Error::ManagerGone), "{e}");
    server.kill9();
    let e = poll(&mut c).unwrap_err();
    assert!(matches!(e, Error::Reset(x) if x == peer), "{e}");
}

/// The socket layer's descriptors reaching a zero-copy receiver (a
/// stream's bytes, a FIN) are not messages: `recv_burst_with` shows only
/// data messages, as `recv` returns only those, and counts neither kind
/// as corrupt; the stream's buffer goes back to the pool.
#[test]
fn recv_burst_with_shows_only_data_messages() {
    use xio_core::layout::{kind, Descriptor};
    let (mgr, mut server, mut client, peer) = manager_and_pair("burstkinds", addr(9441));
    for round in 0..2 {
        let mut s = client.alloc(5).unwrap();
        s.copy_from(b"bytes");
        assert!(client
            .__push_buf_raw(peer, kind::STREAM, 7, s)
            .unwrap()
            .is_none());
        let fin = Descriptor {
            kind: kind::FIN,
            conn: 7,
            ..Descriptor::default()
        };
        assert!(client.__push_raw(peer, fin).unwrap());
        let mut b = client.alloc(4).unwrap();
        b.copy_from(b"data");
        client.send_tagged(peer, 3, b).unwrap();
        let mut got = Vec::new();
        if round == 0 {
            while got.is_empty() {
                server
                    .recv_burst_with(64, |_, tag, p| got.push((tag, p.to_vec())))
                    .unwrap();
            }
        } else {
            let m = server.recv_timeout(WATCHDOG).unwrap();
            got.push((m.tag, m.buf.to_vec()));
        }
        assert_eq!(got, [(3, b"data".to_vec())], "round {round}");
        assert_eq!(server.corrupt_descriptors(), 0, "round {round}");
    }
    drop((server, client));
    wait_pool_whole(&mgr);
}

/// A real buffer sent under a kind no version knows (a buffer kind with
/// the `EARLY` flag, which only a stream's bytes, a FIN and a RST carry)
/// is a corrupt descriptor, counted and refused like a control descriptor
/// of unknown kind, by `recv` and by `recv_burst_with` alike; the real
/// message behind it arrives.
#[test]
fn a_buffer_under_an_unknown_kind_is_counted_corrupt() {
    use xio_core::layout::kind;
    let (mgr, mut server, mut client, peer) = manager_and_pair("bufkind", addr(9443));
    let unknown = [kind::DATA | kind::EARLY, kind::SYN | kind::EARLY];
    for (round, k) in unknown.into_iter().enumerate() {
        let mut s = client.alloc(5).unwrap();
        s.copy_from(b"bytes");
        assert!(client.__push_buf_raw(peer, k, 7, s).unwrap().is_none());
        let mut b = client.alloc(4).unwrap();
        b.copy_from(b"data");
        client.send_tagged(peer, 3, b).unwrap();
        let mut got = Vec::new();
        if round == 0 {
            let m = server.recv_timeout(WATCHDOG).unwrap();
            got.push((m.tag, m.buf.to_vec()));
        } else {
            while got.is_empty() {
                server
                    .recv_burst_with(64, |_, tag, p| got.push((tag, p.to_vec())))
                    .unwrap();
            }
        }
        assert_eq!(got, [(3, b"data".to_vec())], "kind {k:#x}");
        assert_eq!(
            server.corrupt_descriptors(),
            round as u64 + 1,
            "kind {k:#x} not counted as corrupt"
        );
    }
    drop((server, client));
    wait_pool_whole(&mgr);
}

/// A stack that cannot take a channel a peer opened to it (it is out of
/// fds: the kernel drops the doorbell that comes with the manager's
/// `ChannelUp`) gives the channel back, as one it found corrupt: the peer
/// is reset, instead of filling a ring nobody reads and then waiting on it
/// for ever, and the channel does not stay taken.
#[test]
fn a_channel_a_stack_cannot_take_is_given_back_and_its_peer_reset() {
    setup();
    let p = prefix("nofds");
    let mgr = manager_builder(&p).spawn().unwrap();
    let a = addr(9444);
    let mut starved = ChildProc::spawn("child_main", "out_of_fds", &[p.clone(), a.to_string()]);
    starved.expect("ready");
    let mut client = Stack::builder(&p)
        .wait_mode(WaitMode::NonBlocking)
        .attach()
        .unwrap();
    let peer = client.connect(a).unwrap();
    let err = starved.expect("err");
    assert!(err.contains("without doorbell"), "{err}");
    // Sends go into the ring until it is full; then they would block for
    // good, were the channel not given back.
    wait_until(
        "the client's sends to a stack without the channel reset",
        || {
            let b = client.alloc(8).unwrap();
            match client.try_send(peer, b) {
                Err((Error::Reset(p), _)) if p == peer => true,
                Ok(()) | Err((Error::WouldBlock, _)) => false,
                Err((e, _)) => panic!("{e}"),
            }
        },
    );
    // The client released it in turn (its reset): no channel is left.
    wait_until("the channel freed", || {
        !xio_core::manager::query_status(&p).unwrap().contains("<->")
    });
    starved.kill9();
    drop(client);
    wait_pool_whole(&mgr);
}

/// A panic in the caller's closure of a burst call (caught by the
/// application, as a server's worker or a runtime's task does) loses no
/// buffer and, but for the message it was shown, no message: the messages
/// `send_burst_with` filled before it go out and the rest of its buffers go
/// back; `recv_burst_with` gives back the buffers it took and keeps the
/// messages after it for the next receive.
#[test]
fn a_panic_in_a_burst_closure_loses_no_buffer() {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use xio_core::layout::bufword;
    if test_backend() == Backend::Dpdk {
        return; // the check reads the shm pool's buffer headers
    }
    let (mgr, mut server, mut client, peer) = manager_and_pair("burstpanic", addr(9445));
    let value = |p: &[u8]| u64::from_le_bytes(p.try_into().unwrap());
    let seg = client.__segment().clone();
    let panicked = catch_unwind(AssertUnwindSafe(|| {
        client.send_burst_with(peer, 10, 8, |i, p| {
            assert!(i != 5, "the fill of message 5 fails");
            p.copy_from_slice(&(i as u64).to_le_bytes());
        })
    }));
    assert!(panicked.is_err());
    assert_eq!(
        owned_in_state(&seg, client.id().slot(), bufword::ALLOCATED),
        0,
        "buffers left allocated to the sender, with no handle"
    );
    let mut got = Vec::new();
    while got.len() < 5 {
        let m = server.recv_timeout(WATCHDOG).unwrap();
        got.push(value(&m.buf));
    }
    assert_eq!(got, [0, 1, 2, 3, 4]);

    client
        .send_burst_with(peer, 6, 8, |i, p| {
            p.copy_from_slice(&(i as u64).to_le_bytes())
        })
        .unwrap();
    let mut shown = Vec::new();
    let panicked = catch_unwind(AssertUnwindSafe(|| {
        server.recv_burst_with(64, |_, _, p| {
            shown.push(value(p));
            assert!(value(p) != 2, "showing message 2 fails");
        })
    }));
    assert!(panicked.is_err());
    assert_eq!(shown, [0, 1, 2]);
    // The burst's messages after it are off the ring, and taken.
    assert_eq!(
        server.__in_flight_to_me(),
        0,
        "messages of the burst left in flight, off the ring"
    );
    let rest: Vec<u64> = (0..3)
        .map(|_| value(&server.recv_timeout(WATCHDOG).unwrap().buf))
        .collect();
    assert_eq!(rest, [3, 4, 5], "the messages after the failed one");
    // Every message was shown and is gone: none is held, none in flight.
    assert_eq!(
        owned_in_state(&seg, server.id().slot(), bufword::HELD),
        0,
        "buffers left held by the receiver, with no handle"
    );
    assert_eq!(server.__in_flight_to_me(), 0);
    drop((server, client));
    wait_pool_whole(&mgr);
}

/// `recv_burst` of at most 0 messages takes none (it took, and returned,
/// one); the message stays for the next receive.
#[test]
fn recv_burst_of_at_most_zero_messages_takes_none() {
    let (mgr, mut server, mut client, peer) = manager_and_pair("burstvec0", addr(9442));
    let b = client.alloc(8).unwrap();
    client.send(peer, b).unwrap();
    let mut out = Vec::new();
    assert_eq!(server.recv_burst(&mut out, 0).unwrap(), 0);
    assert!(out.is_empty());
    assert_eq!(server.recv_timeout(WATCHDOG).unwrap().buf.len(), 8);
    drop((server, client));
    wait_pool_whole(&mgr);
}

/// `$XIO_CONTROL_TIMEOUT_MS` that cannot be used is an error naming the
/// variable: 0 would time every request out at once, and a typo would
/// quietly give the default. A good value attaches.
#[test]
fn a_bad_control_timeout_in_the_environment_is_an_error() {
    setup();
    let p = prefix("badenv");
    let _mgr = manager_builder(&p).spawn().unwrap();
    for (value, ok) in [
        ("abc", false),
        ("0", false),
        ("-5", false),
        ("", false),
        (" 250 ", true),
    ] {
        let mut child = ChildProc::spawn_env(
            "child_main",
            "attach_and_say",
            std::slice::from_ref(&p),
            &[("XIO_CONTROL_TIMEOUT_MS", value)],
        );
        let said = child.expect("attach");
        if ok {
            assert_eq!(said, "ok", "{value:?}");
        } else {
            assert!(
                said.starts_with("err InvalidInput $XIO_CONTROL_TIMEOUT_MS="),
                "{value:?}: {said}"
            );
        }
        child.wait_success();
    }
}

/// A stack dropped while the application still holds a buffer it
/// received: the buffer keeps the registration open (the manager must not
/// reclaim what is still in use), but the stack is gone. Its peers must be
/// reset, not left sending into a ring nobody reads, and its address must
/// be free for a new stack.
#[test]
fn a_stack_dropped_while_its_buffer_lives_resets_its_peers() {
    let a = addr(91);
    let (mgr, mut server, mut client, peer) = manager_and_pair("dropped-held", a);
    client.send(peer, client.alloc(8).unwrap()).unwrap();
    let kept = server.recv_timeout(WATCHDOG).unwrap();
    let gone = server.id().slot();
    drop(server);
    let mut err = None;
    wait_until("the client learns its peer is gone", || {
        match client.try_send(peer, client.alloc(8).unwrap()) {
            Ok(()) | Err((Error::WouldBlock, _)) => {}
            Err((e, _)) => err = Some(e),
        }
        match client.recv_timeout(std::time::Duration::ZERO) {
            Ok(_) | Err(Error::TimedOut) | Err(Error::WouldBlock) => {}
            Err(e) => err = err.take().or(Some(e)),
        }
        err.is_some()
    });
    let err = err.unwrap();
    assert!(matches!(err, Error::Reset(p) if p == peer), "{err}");
    let mut again = Stack::attach(mgr.prefix()).unwrap();
    again.bind(a).expect("the dropped stack's address is free");
    // The buffer still held is not reclaimed from under us.
    let held = |mgr: &xio_core::manager::ManagerHandle| -> u32 {
        mgr.usage()
            .iter()
            .flat_map(|u| u.by_owner.iter())
            .filter(|(o, _)| *o == gone)
            .map(|(_, n)| n)
            .sum()
    };
    assert!(held(&mgr) >= 1, "{:?}", mgr.usage());
    assert_eq!(mgr.snapshot().deaths, 0);
    assert_eq!(kept.buf.len(), 8);
    drop(kept);
    wait_until("the dropped stack's buffers back", || {
        mgr.snapshot().deaths == 1 && held(&mgr) == 0
    });
    drop((client, again));
    wait_pool_whole(&mgr);
}

/// A stack that left (dropped, a buffer of it kept) and then died before
/// its peer let go of their channel: its slot (its id) must stay taken
/// until the peer has, as for any dead stack, or a newcomer could get the
/// id while the peer may still stamp buffers for it.
#[test]
fn a_left_stacks_slot_waits_for_its_peers_release() {
    use std::sync::atomic::Ordering;
    use xio_core::layout::slot_state;
    let a = addr(92);
    let (mgr, mut server, mut client, peer) = manager_and_pair("left-slot", a);
    client.send(peer, client.alloc(8).unwrap()).unwrap();
    let kept = server.recv_timeout(WATCHDOG).unwrap();
    let gone = server.id().slot();
    let seg = client.__segment().clone();
    drop(server);
    // The client reads nothing meanwhile: its release waits.
    drop(kept);
    wait_until("the stack's death handled", || mgr.snapshot().deaths == 1);
    let state = &seg.stack_slot(gone).state;
    assert_ne!(
        state.load(Ordering::Acquire),
        slot_state::FREE,
        "the slot is free before the peer released the channel"
    );
    assert!(matches!(client.recv_timeout(WATCHDOG), Err(Error::Reset(p)) if p == peer));
    wait_until("the slot free once released", || {
        state.load(Ordering::Acquire) == slot_state::FREE
    });
    drop(client);
    wait_pool_whole(&mgr);
}

/// A stack hands the pool references of the buffers it sends to the
/// buffers it receives next. Received buffers must still read right and
/// go back to the pool when they outlive the stack, and the references
/// it keeps must not hold any buffer.
#[test]
fn received_buffers_outlive_their_stack_and_return_to_the_pool() {
    let (mgr, mut server, mut client, peer) = manager_and_pair("refsreuse", addr(17));
    let fill = |b: &mut [u8], seed: u8| {
        for (i, x) in b.iter_mut().enumerate() {
            *x = seed.wrapping_add(i as u8);
        }
    };
    let check = |b: &[u8], seed: u8| {
        b.iter()
            .enumerate()
            .all(|(i, &x)| x == seed.wrapping_add(i as u8))
    };
    // Round trips first, so both stacks keep references from their sends.
    for seed in 0..200u8 {
        let mut b = client.alloc(64).unwrap();
        fill(&mut b, seed);
        client.send(peer, b).unwrap();
        let m = server.recv().unwrap();
        assert!(check(&m.buf, seed));
        let mut back = m.buf.into_mut();
        fill(&mut back, seed ^ 0x5a);
        server.send(m.from, back).unwrap();
        let r = client.recv().unwrap();
        assert!(check(&r.buf, seed ^ 0x5a));
    }
    // Then more received buffers than any stack keeps references for,
    // held past the receiving stack's end.
    let held: Vec<_> = (0..100u8)
        .map(|seed| {
            let mut b = client.alloc(100).unwrap();
            fill(&mut b, seed);
            client.send(peer, b).unwrap();
            (seed, server.recv().unwrap().buf)
        })
        .collect();
    drop(server);
    for (seed, b) in &held {
        assert!(check(b, *seed), "buffer {seed} after its stack left");
    }
    drop(held);
    drop(client);
    wait_pool_whole(&mgr);
}
