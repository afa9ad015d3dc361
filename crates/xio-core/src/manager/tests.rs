//! Unit tests of the manager's lock file and hang-up check.

use super::session::hung_up_now;
use super::*;

/// Two starters racing for a lock a stopping manager lets go of (and
/// unlinks) never both hold it: the one that locked the unlinked file
/// sees that the path no longer names it and takes the new file's
/// lock instead. Without that check, a starter that opened the old
/// file just before the unlink and locked it just after ran beside
/// one that created the new file. A race: it shows only in some
/// rounds, so there are many; a pass is no proof, a failure is a bug.
#[test]
fn racing_starters_never_both_hold_a_lock_being_let_go() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let dir = std::env::temp_dir().join(format!("xio-lockrace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("race.lock");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    for round in 0..500 {
        let stopping = LockFile::acquire(&path)
            .unwrap()
            .expect("free between rounds");
        let holders = AtomicUsize::new(0);
        let go = AtomicBool::new(false);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    while !go.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                    let held = loop {
                        if let Some(l) = LockFile::acquire(&path).unwrap() {
                            break l;
                        }
                        assert!(std::time::Instant::now() < deadline, "hang guard");
                    };
                    let others = holders.fetch_add(1, Ordering::SeqCst);
                    assert_eq!(others, 0, "round {round}: two starters hold the lock");
                    std::thread::yield_now();
                    holders.fetch_sub(1, Ordering::SeqCst);
                    drop(held);
                });
            }
            go.store(true, Ordering::Relaxed);
            std::thread::yield_now();
            drop(stopping);
        });
        assert!(
            !path.exists(),
            "round {round}: the last holder left its file"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// What a sweep takes for "exited, end of file not read yet": the
/// peer's end closed, whether or not messages wait unread.
#[test]
fn hung_up_now_sees_a_closed_peer() {
    use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};
    let (ours, theirs) = socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    assert!(!hung_up_now(&ours));
    rustix::net::send(&theirs, b"unread", rustix::net::SendFlags::empty()).unwrap();
    assert!(!hung_up_now(&ours), "a message is not a hang-up");
    drop(theirs);
    assert!(hung_up_now(&ours));
}
