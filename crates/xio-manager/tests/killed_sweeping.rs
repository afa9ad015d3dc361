//! The `xio-manager` binary killed with -9 in the middle of a reclamation
//! sweep, while it holds the free lists' gates closed: the stacks that
//! live on must not spin for ever waiting for a gate nobody will open, nor
//! be told to retry an allocation that needs it.

mod support;

use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use xio_core::prelude::*;

use crate::support::{process_run_dir, wait_until, Reap, BIN, WATCHDOG};

#[test]
fn a_manager_killed_mid_sweep_leaves_no_stack_waiting_on_a_closed_gate() {
    use rustix::process::Signal;
    let dir = process_run_dir("xio-killed-sweep");
    let prefix = "killed-sweep";
    let sock = dir.join(format!("{prefix}.sock"));
    // Many small buffers: a sweep scans every header, gates closed, so
    // there is time to catch the manager in one.
    let m = Reap(
        Command::new(BIN)
            .args([
                "--prefix",
                prefix,
                "--class",
                "64:262144",
                "--class",
                "4K:64",
            ])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until("manager socket", || sock.exists());
    let survivor = Stack::builder(prefix).name("survivor").attach().unwrap();
    // Its cache of the small class is not empty (what it drops at the end
    // goes back to the shared list); of the 4K class it is.
    let held = survivor.alloc(10).unwrap();
    let seg = survivor.__segment().clone();
    let gate = || {
        seg.free_head(0)
            .gate
            .load(std::sync::atomic::Ordering::SeqCst)
    };

    // A stack leaves, the manager sweeps: stop it while its gates are
    // closed (and seen still closed once it is stopped), then kill it.
    let mut caught = false;
    for _ in 0..500 {
        let victim = Stack::builder(prefix).name("victim").attach().unwrap();
        drop(victim);
        // A bound on one try, not on the test: a missed sweep is tried again.
        let give_up = Instant::now() + Duration::from_millis(500);
        while gate() == 0 && Instant::now() < give_up {
            std::hint::spin_loop();
        }
        if gate() == 0 {
            continue;
        }
        m.signal(Signal::STOP);
        wait_until("manager stopped", || m.state() == 'T');
        if gate() != 0 {
            m.signal(Signal::KILL);
            caught = true;
            break;
        }
        m.signal(Signal::CONT);
    }
    assert!(caught, "never caught the manager inside a sweep");
    let mut m = m;
    m.0.wait().unwrap();
    assert_ne!(gate(), 0, "the dead manager left the gates closed");

    // One that may not wait (`try_alloc`, what the socket layer's writes
    // use, and a non-blocking stack's `alloc`) is told so too, not that
    // the pool is exhausted for now: its caller would retry for ever.
    let r = survivor.try_alloc(1000).map(drop);
    assert!(matches!(r, Err(Error::ManagerGone)), "{r:?}");

    // An allocation that needs the shared list, then the survivor's drop,
    // which gives its cache back to it: neither may wait for ever.
    let (alloc_tx, alloc_rx) = mpsc::channel();
    let (drop_tx, drop_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = survivor.alloc(1000).map(drop);
        let _ = alloc_tx.send(r);
        drop(held);
        drop(survivor);
        let _ = drop_tx.send(());
    });
    let r = alloc_rx
        .recv_timeout(WATCHDOG)
        .expect("watchdog: alloc waits for ever on a gate the dead manager left closed");
    assert!(matches!(r, Err(Error::ManagerGone)), "{r:?}");
    drop_rx
        .recv_timeout(WATCHDOG)
        .expect("watchdog: dropping the stack waits for ever on a closed gate");
    let _ = std::fs::remove_dir_all(&dir);
}
