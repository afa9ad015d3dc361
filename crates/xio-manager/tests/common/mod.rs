//! The scenario of `killed.rs` and `killed_tick.rs`: the `xio-manager`
//! binary killed with -9 while stacks sleep in a receive with no deadline.

use std::process::{Command, Stdio};
use std::sync::mpsc;

use xio_core::prelude::*;

use crate::support::{wait_until, BIN, WATCHDOG};

/// Whether this kernel has futex_waitv(2) (Linux 5.16+, not refused by a
/// sandbox): with no waiters it fails with EINVAL, without the call ENOSYS.
fn kernel_has_futex_waitv() -> bool {
    // SAFETY: futex_waitv with a NULL list of 0 waiters reads and writes
    // nothing; it only validates its arguments.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex_waitv,
            std::ptr::null::<u8>(),
            0u32,
            0u32,
            std::ptr::null::<u8>(),
            0,
        )
    };
    let err = std::io::Error::last_os_error().raw_os_error();
    !(r == -1 && matches!(err, Some(libc::ENOSYS | libc::EPERM)))
}

/// The system call thread `tid` of this process is blocked in, if any.
fn blocked_in(tid: i32) -> Option<i64> {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall")).ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// How a sleeping stack waits in the kernel.
#[derive(Clone, Copy, Debug)]
#[allow(dead_code)] // each test binary names one of them
pub enum Sleep {
    /// futex_waitv on its doorbell and the manager's liveness word.
    Waitv,
    /// futex on its doorbell with the one-second tick.
    Tick,
}

/// Two stacks sleep (in the system call `sleep` names) in a receive with
/// no deadline; the manager binary is killed with -9; both get
/// `Error::ManagerGone`, and their channel still carries data both ways.
/// The caller's test must be the only one of its process: this sets
/// `XIO_RUN_DIR`.
pub fn sleeping_stacks_learn_of_a_killed_manager(sleep: Sleep) {
    let waitv = kernel_has_futex_waitv();
    let dir = crate::support::process_dir("xio-killed-test");
    std::env::set_var("XIO_RUN_DIR", &dir);
    let prefix = "killed-test";
    let sock = dir.join(format!("{prefix}.sock"));
    let mut m = Command::new(BIN)
        .args(["--prefix", prefix, "--class", "2K:256"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("manager socket", || sock.exists());
    let attach = |name: &str| {
        Stack::builder(prefix)
            .name(name)
            .wait_mode(WaitMode::Blocking)
            .attach()
            .unwrap()
    };
    let a = "192.0.2.7:80".parse().unwrap();
    let mut server = attach("server");
    server.bind(a).unwrap();
    let mut client = attach("client");
    let peer = client.connect(a).unwrap();

    // Both sleep in a receive with no deadline.
    let (done_tx, done) = mpsc::channel();
    let tids: Vec<i32> = [server, client]
        .into_iter()
        .map(|mut s| {
            let (tid_tx, tid) = mpsc::channel();
            let done_tx = done_tx.clone();
            std::thread::spawn(move || {
                tid_tx
                    .send(rustix::thread::gettid().as_raw_nonzero().get())
                    .unwrap();
                let r = s.recv().map(|_| ());
                let _ = done_tx.send((s, r));
            });
            tid.recv().unwrap()
        })
        .collect();
    for &t in &tids {
        wait_until("stack asleep", || match sleep {
            Sleep::Waitv if waitv => blocked_in(t) == Some(libc::SYS_futex_waitv),
            // Without futex_waitv the stacks take the tick.
            Sleep::Waitv | Sleep::Tick => blocked_in(t) == Some(libc::SYS_futex),
        });
    }

    rustix::process::kill_process(
        rustix::process::Pid::from_raw(m.id() as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    m.wait().unwrap();

    let mut stacks = Vec::new();
    for _ in &tids {
        let (s, r) = done.recv_timeout(WATCHDOG).expect("a stack slept on");
        assert!(matches!(r, Err(Error::ManagerGone)), "{r:?}");
        stacks.push(s);
    }
    // Reported once; the channel still carries data both ways.
    let (mut client, mut server) = {
        let i = stacks
            .iter()
            .position(|s| s.peers().contains(&peer))
            .unwrap();
        let c = stacks.remove(i);
        (c, stacks.pop().unwrap())
    };
    let mut b = client.alloc(4).unwrap();
    b.copy_from(b"ping");
    client.send(peer, b).unwrap();
    let msg = server.recv().unwrap();
    assert_eq!(&msg.buf[..], b"ping");
    server.send(msg.from, msg.buf.into_mut()).unwrap();
    assert_eq!(&client.recv().unwrap().buf[..], b"ping");
    let _ = std::fs::remove_dir_all(&dir);
}
