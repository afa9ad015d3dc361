//! Soak: the `xio-manager` binary, 4 server processes and 32 client
//! processes exchanging checksummed byte streams over `XioStream`s, while
//! the driver kills a random one of them with SIGKILL every second and
//! starts it again.
//!
//! What must hold: every byte a client reads back is the byte it wrote at
//! that offset of its stream (nothing lost, duplicated or reordered on a
//! connection that survives); a connection whose other end was killed
//! ends with a clean error (reset, broken pipe, end of file), never a
//! wrong byte or a hang (each client aborts itself if it makes no
//! progress for the watchdog, which the driver sees as a death it did not
//! cause); at the end, with every process gone, the pool is whole, no
//! stack is left, and the manager holds the fds it held before and about
//! the memory it held once warm.
//!
//! `XIO_SOAK_SECS` sets how long the kills go on (default 10, what CI
//! runs); `XIO_SOAK_SEED` replays a run's choices (not its timing). The
//! long form is documented in docs/operations.md.

mod support;

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use xio_core::ctrl;
use xio_core::net::Net;
use xio_core::proto::Msg;

use support::seeded::{env_u64, seed_from_env, Rng};
use support::{fds_of, process_run_dir, raw_conn, wait_until, Reap, BIN, WATCHDOG};

const SERVERS: usize = 4;
const CLIENTS: usize = 32;
const PREFIX: &str = "soak";
/// Largest piece a client writes before reading its echo back: less than
/// a connection's window both ways, so neither end waits on the other.
const MAX_PIECE: u64 = 16 << 10;

fn server_addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 5, 0, i as u8 + 1], 7))
}

/// Byte `off` of the stream of seed `seed`: what a client writes there,
/// and must read back there.
fn stream_byte(seed: u64, off: u64) -> u8 {
    let mut r = Rng(seed ^ (off / 8).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    (r.next() >> ((off % 8) * 8)) as u8
}

/// The end of a connection whose other side was killed, or of a connect
/// to a server being started again.
fn clean(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::UnexpectedEof
    )
}

// ---------------------------------------------------------------- children

/// Entry point of the server and client processes (a no-op as a test).
#[test]
fn soak_child() {
    let Ok(role) = std::env::var("XIO_SOAK_ROLE") else {
        return;
    };
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
    // Any failed check is the process's end, loudly: the driver sees a
    // death it did not cause.
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        std::process::abort();
    }));
    let idx: usize = std::env::var("XIO_SOAK_INDEX").unwrap().parse().unwrap();
    let seed: u64 = std::env::var("XIO_SOAK_CHILD_SEED")
        .unwrap()
        .parse()
        .unwrap();
    // Stdin closed or "stop": finish. Servers exit at once; clients after
    // the piece they are in, with their tally.
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        let server = role == "server";
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = io::stdin().read_line(&mut line);
            if server {
                std::process::exit(0);
            }
            stop.store(true, Ordering::Relaxed);
        });
    }
    match role.as_str() {
        "server" => server(idx),
        "client" => client(idx, seed, &stop),
        r => panic!("unknown role {r}"),
    }
}

fn server(idx: usize) {
    let net = Net::builder(PREFIX)
        .control_timeout(WATCHDOG)
        .attach()
        .unwrap();
    // The address of a server killed a moment ago may still be bound to
    // it until the manager has handled its death.
    let started = Instant::now();
    let lis = loop {
        match net.listen(server_addr(idx)) {
            Ok(l) => break l,
            Err(e) if e.kind() == io::ErrorKind::AddrInUse && started.elapsed() < WATCHDOG => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("server {idx}: listen: {e}"),
        }
    };
    println!("XIO:ready");
    loop {
        let (mut s, _) = match lis.accept() {
            Ok(c) => c,
            Err(e) if clean(&e) => continue,
            Err(e) => panic!("server {idx}: accept: {e}"),
        };
        std::thread::spawn(move || {
            s.set_read_timeout(Some(WATCHDOG)).unwrap();
            s.set_write_timeout(Some(WATCHDOG)).unwrap();
            let mut buf = vec![0u8; 64 << 10];
            loop {
                match s.read(&mut buf) {
                    Ok(0) => {
                        let _ = s.shutdown(std::net::Shutdown::Write);
                        return;
                    }
                    Ok(n) => {
                        if let Err(e) = s.write_all(&buf[..n]) {
                            assert!(clean(&e), "server {idx}: write: {e}");
                            return;
                        }
                    }
                    Err(e) => {
                        assert!(clean(&e), "server {idx}: read: {e}");
                        return;
                    }
                }
            }
        });
    }
}

fn client(idx: usize, seed: u64, stop: &AtomicBool) {
    let net = Net::builder(PREFIX)
        .control_timeout(WATCHDOG)
        .attach()
        .unwrap();
    // A hang guard, not a speed bound: a client that verifies nothing
    // for the watchdog is stuck.
    let progress = Arc::new(AtomicU64::new(0));
    {
        let progress = progress.clone();
        std::thread::spawn(move || {
            let mut last = u64::MAX;
            loop {
                std::thread::sleep(WATCHDOG);
                let now = progress.load(Ordering::Relaxed);
                if now == last {
                    eprintln!("client {idx}: no progress for {WATCHDOG:?}");
                    std::process::abort();
                }
                last = now;
            }
        });
    }
    println!("XIO:ready");
    let mut rng = Rng(seed);
    let (mut verified, mut conns, mut resets) = (0u64, 0u64, 0u64);
    while !stop.load(Ordering::Relaxed) {
        let i = rng.index(SERVERS);
        let mut s = match net.connect_timeout(&server_addr(i), WATCHDOG) {
            Ok(s) => s,
            Err(e) => {
                assert!(clean(&e), "client {idx}: connect to server {i}: {e}");
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
        };
        s.set_read_timeout(Some(WATCHDOG)).unwrap();
        s.set_write_timeout(Some(WATCHDOG)).unwrap();
        conns += 1;
        let sseed = rng.next();
        let mut off = 0u64;
        let r = (|| -> io::Result<()> {
            for _ in 0..rng.range(1, 40) {
                let len = match rng.range(0, 10) {
                    0..=6 => rng.range(1, 2048),
                    _ => rng.range(2048, MAX_PIECE),
                };
                let data: Vec<u8> = (off..off + len).map(|o| stream_byte(sseed, o)).collect();
                s.write_all(&data)?;
                let mut back = vec![0u8; len as usize];
                s.read_exact(&mut back)?;
                if let Some(k) = back.iter().zip(&data).position(|(a, b)| a != b) {
                    panic!(
                        "client {idx}: byte {} of its stream to server {i} came back wrong \
                         ({} for {}): lost, duplicated or reordered",
                        off + k as u64,
                        back[k],
                        data[k]
                    );
                }
                off += len;
                verified += len;
                progress.fetch_add(len, Ordering::Relaxed);
            }
            // A clean close: the server echoes nothing more and closes.
            s.shutdown(std::net::Shutdown::Write)?;
            let mut rest = [0u8; 1];
            match s.read(&mut rest)? {
                0 => Ok(()),
                _ => panic!("client {idx}: a byte past the end of its stream"),
            }
        })();
        if let Err(e) = r {
            assert!(clean(&e), "client {idx}: stream to server {i}: {e}");
            resets += 1;
        }
    }
    println!("XIO:done {verified} {conns} {resets}");
}

// ---------------------------------------------------------------- driver

struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    out: BufReader<ChildStdout>,
}

impl Proc {
    fn start(role: &str, idx: usize, seed: u64) -> Proc {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "soak_child", "--nocapture", "--test-threads=1"])
            .env("XIO_SOAK_ROLE", role)
            .env("XIO_SOAK_INDEX", idx.to_string())
            .env("XIO_SOAK_CHILD_SEED", seed.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let out = BufReader::new(child.stdout.take().unwrap());
        let mut p = Proc { child, stdin, out };
        p.expect("XIO:ready", &format!("{role} {idx} ready"));
        p
    }

    /// The rest of the first line of its output that starts with `tag`.
    fn expect(&mut self, tag: &str, what: &str) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.out.read_line(&mut line).unwrap();
            assert!(n > 0, "{what}: the process ended without saying so");
            // The test harness's "test soak_child ... " may come first.
            if let Some(i) = line.find(tag) {
                return line[i + tag.len()..].trim().to_owned();
            }
        }
    }
}

fn status() -> String {
    let dir = std::env::var("XIO_RUN_DIR").unwrap();
    let s = raw_conn(&std::path::Path::new(&dir).join(format!("{PREFIX}.sock")));
    ctrl::send(s.as_fd(), &Msg::Status, &[]).unwrap();
    let (m, fds) = ctrl::recv(s.as_fd(), false).unwrap();
    xio_core::manager::status_from_reply(m, fds).unwrap()
}

/// Resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

#[test]
fn soak_kill_a_random_process_every_second() {
    if std::env::var_os("XIO_SOAK_ROLE").is_some() {
        return;
    }
    let secs = env_u64("XIO_SOAK_SECS").unwrap_or(10);
    let seed = seed_from_env("XIO_SOAK_SEED");
    eprintln!("soak seed {seed}, {secs} s of kills (replay: XIO_SOAK_SEED={seed})");
    let mut rng = Rng(seed);
    let dir = process_run_dir("xio-soak");
    let sock = dir.join(format!("{PREFIX}.sock"));
    let m = Reap(
        Command::new(BIN)
            .args(["--prefix", PREFIX])
            .args(["--class", "2K:4096", "--class", "64K:1024"])
            .args(["--max-stacks", "64", "--max-channels", "256"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until("manager socket", || sock.exists());
    let mpid = m.0.id();
    let fds_before = fds_of(mpid);

    let mut procs: Vec<(String, usize, Proc)> = Vec::new();
    for i in 0..SERVERS {
        procs.push(("server".into(), i, Proc::start("server", i, rng.next())));
    }
    for i in 0..CLIENTS {
        procs.push(("client".into(), i, Proc::start("client", i, rng.next())));
    }
    // Warm: every client has connected and the manager's tables have
    // grown to what this load needs.
    std::thread::sleep(Duration::from_secs(2));
    let rss_warm = rss_kib(mpid);

    let mut kills = 0;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(Duration::from_secs(1));
        let k = rng.index(procs.len());
        let (role, idx, p) = &mut procs[k];
        let pid = p.child.id();
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid as i32).unwrap(),
            rustix::process::Signal::KILL,
        )
        .unwrap();
        let st = p.child.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&st),
            Some(libc::SIGKILL),
            "{role} {idx} ended by itself before the kill: {st:?}; seed {seed}"
        );
        kills += 1;
        // The others live on: a failed check or a hang aborts them.
        for (r, i, q) in procs
            .iter_mut()
            .enumerate()
            .filter(|(j, _)| *j != k)
            .map(|(_, p)| p)
        {
            if let Some(st) = q.child.try_wait().unwrap() {
                panic!("{r} {i} died ({st:?}) after {kills} kills; seed {seed}");
            }
        }
        let (role, idx, _) = &procs[k];
        let (role, idx) = (role.clone(), *idx);
        procs[k].2 = Proc::start(&role, idx, rng.next());
    }
    let rss_end = rss_kib(mpid);

    // Clients finish the piece they are in and tally; servers exit.
    let (mut verified, mut conns, mut resets) = (0u64, 0u64, 0u64);
    for (role, idx, p) in procs.iter_mut().filter(|(r, _, _)| r == "client") {
        writeln!(p.stdin.as_mut().unwrap(), "stop").unwrap();
        let done = p.expect("XIO:done", &format!("{role} {idx} done"));
        let n: Vec<u64> = done.split(' ').map(|x| x.parse().unwrap()).collect();
        verified += n[0];
        conns += n[1];
        resets += n[2];
    }
    for (role, idx, mut p) in procs {
        drop(p.stdin.take());
        let st = p.child.wait().unwrap();
        assert!(st.success(), "{role} {idx}: {st:?}");
    }
    eprintln!(
        "soak: {kills} kills; {conns} connections, {resets} ended by a kill; \
         {verified} bytes verified; manager RSS {rss_warm} KiB warm, {rss_end} KiB at the end"
    );
    assert!(verified > 0, "no traffic");

    // Everything back: no stack, no channel, every buffer free.
    wait_until("pool whole, nothing left", || {
        let s = status();
        s.contains("0/64 stacks, 0/256 channels")
            && s.lines()
                .filter(|l| l.trim_start().starts_with("class "))
                .all(|l| l.contains(" 0 in use"))
    });
    // The status queries' own connections close as the manager reads
    // their end: waited for, with the watchdog (a leak stays).
    wait_until("the manager's fds back to what it held before", || {
        fds_of(mpid) == fds_before
    });
    // Flat: what a warm manager holds, give or take what the allocator
    // keeps (not a growth per kill).
    assert!(
        rss_end <= rss_warm + rss_warm / 4 + 1024,
        "the manager's memory grew from {rss_warm} to {rss_end} KiB over {kills} kills"
    );
    drop(m);
    let _ = std::fs::remove_dir_all(&dir);
}
