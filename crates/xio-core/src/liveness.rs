//! The manager's liveness word: a robust futex that the kernel releases
//! when the manager dies, so a sleeping stack learns of it at once without
//! a timer armed on every sleep.
//!
//! # Why
//! A stack sleeps on the futex word in its slot until a peer rings it. A
//! sleeper must also notice a dead manager (to report
//! [`crate::stack::Error::ManagerGone`]), and nobody rings for the dead.
//! Sleeps used to carry a one-second timeout for that, and arming and
//! cancelling that timer cost ~0.4-0.6 µs a round trip in blocking mode
//! (`benches/c/wake_pingpong.c`: `futex-timeout` against `futex-waitv`).
//!
//! # How
//! The thread serving the pool ([`crate::manager::Manager::run`]) stores
//! its thread id in the segment header's `manager_alive` word and makes
//! that word the one entry of its *robust futex list* (set_robust_list(2)).
//! However the thread ends (kill -9 included), the kernel walks the list
//! before tearing the process down: a word still holding the thread's id
//! gets `FUTEX_OWNER_DIED`, and if `FUTEX_WAITERS` is set, one waiter is
//! woken. A stack about to sleep sets `FUTEX_WAITERS` (once per manager)
//! and waits with futex_waitv(2) on its doorbell word and the liveness word
//! together, with no timeout; the sleeper the kernel wakes wakes the rest.
//! A manager that stops cleanly restores the thread's list and marks the
//! word the same way itself.
//!
//! Kernels before 5.16 have no futex_waitv; there, where a sandbox
//! refuses it (a seccomp filter answering EPERM), and while no manager has
//! registered the word, sleeps keep the one-second tick. Setting
//! `XIO_FUTEX_WAITV=0` in the environment chooses the tick from the start
//! (for a sandbox that would kill the process on an unknown system call
//! rather than refuse it).

use std::time::Duration;

use crate::sync::{futex_wait, AtomicU32};

/// Longest sleep without a deadline when the kernel cannot tell a sleeper
/// that the manager died: it then looks at its control socket once a
/// second.
pub(crate) const TICK: Duration = Duration::from_secs(1);

/// The plain sleep: on `word` while it holds `expected`, at most `timeout`
/// and at most a [`TICK`].
fn sleep_with_tick(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    futex_wait(word, expected, Some(timeout.map_or(TICK, |t| t.min(TICK))));
}

/// Thread-id bits of a robust futex word.
#[cfg(not(loom))]
const TID_MASK: u32 = 0x3fff_ffff;

#[cfg(not(loom))]
pub(crate) use real::{died, sleep, watched, Registration};

#[cfg(not(loom))]
mod real {
    use std::marker::PhantomData;
    use std::sync::atomic::AtomicU8;
    use std::time::Duration;

    use rustix::thread::futex::{self, Wait, WaitFlags, WaitPtr, WaitvFlags, OWNER_DIED, WAITERS};
    use rustix::time::{ClockId, Timespec};

    use super::{sleep_with_tick, TID_MASK};
    use crate::segment::Segment;
    use crate::sync::{fence, futex_wake, AtomicU32, Ordering};

    /// Whether sleeps may use futex_waitv: [`WAITV_UNKNOWN`] until the
    /// first sleep reads `XIO_FUTEX_WAITV`; cleared for good when the
    /// kernel (or a sandbox) refuses the call.
    static WAITV: AtomicU8 = AtomicU8::new(WAITV_UNKNOWN);
    const WAITV_UNKNOWN: u8 = 0;
    const WAITV_ON: u8 = 1;
    const WAITV_OFF: u8 = 2;

    /// Whether futex_waitv may be tried (reads the environment once).
    fn waitv_allowed() -> bool {
        match WAITV.load(Ordering::Relaxed) {
            WAITV_ON => true,
            WAITV_OFF => false,
            _ => {
                let off = std::env::var_os("XIO_FUTEX_WAITV")
                    .is_some_and(|v| matches!(v.to_str(), Some("0" | "off" | "no" | "false")));
                if off {
                    tracing::debug!("XIO_FUTEX_WAITV is off: sleeping with the tick");
                }
                // Only from unknown: a refusal meanwhile (OFF) stays.
                let want = if off { WAITV_OFF } else { WAITV_ON };
                match WAITV.compare_exchange(
                    WAITV_UNKNOWN,
                    want,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => !off,
                    Err(now) => now == WAITV_ON,
                }
            }
        }
    }

    /// `struct robust_list` of the kernel's ABI.
    #[repr(C)]
    struct RobustList {
        next: *const RobustList,
    }

    /// `struct robust_list_head` of the kernel's ABI.
    #[repr(C)]
    struct RobustListHead {
        list: RobustList,
        futex_offset: isize,
        list_op_pending: *const RobustList,
    }

    /// This thread's registration as the pool's live manager. Restores the
    /// thread's previous robust list and marks the manager gone when
    /// dropped; must be dropped on the thread that made it (it is not
    /// `Send`).
    pub(crate) struct Registration {
        /// Keeps the word mapped while the kernel may write it.
        seg: Segment,
        /// The list the kernel walks: its head and its one entry, boxed so
        /// the addresses the kernel holds never move.
        _head: Box<RobustListHead>,
        _entry: Box<RobustList>,
        /// The thread's list before (the C library's), restored on drop.
        previous: (usize, usize),
        _not_send: PhantomData<*const ()>,
    }

    impl Registration {
        /// Registers the calling thread as the live manager of `seg`.
        /// `None` (sleepers keep their tick) if the kernel refuses.
        pub(crate) fn register(seg: &Segment) -> Option<Self> {
            let word = seg.manager_alive();
            let tid = rustix::thread::gettid().as_raw_nonzero().get() as u32;
            if tid & !TID_MASK != 0 {
                return None;
            }
            let mut prev_head: usize = 0;
            let mut prev_len: usize = 0;
            // SAFETY: get_robust_list(0, ...) writes the calling thread's
            // list head pointer and its length into the two locals, which
            // are pointer-sized and writable.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_get_robust_list,
                    0,
                    &mut prev_head as *mut usize,
                    &mut prev_len as *mut usize,
                )
            };
            if r != 0 {
                return None;
            }
            let mut head = Box::new(RobustListHead {
                list: RobustList {
                    next: std::ptr::null(),
                },
                futex_offset: 0,
                list_op_pending: std::ptr::null(),
            });
            // A circular list of one: head -> entry -> head.
            let entry = Box::new(RobustList { next: &head.list });
            head.list.next = &*entry;
            // The kernel finds the word at `entry + futex_offset`.
            head.futex_offset = (word.as_ptr() as isize).wrapping_sub(&*entry as *const _ as isize);
            word.store(tid, Ordering::Release);
            // SAFETY: the head and the entry are heap allocations owned by
            // the returned registration, which gives the thread its
            // previous list back before freeing them; if the registration
            // is leaked they leak with it. The word they lead to stays
            // mapped as long as `seg` lives, also in the registration. The
            // kernel reads the list only when this thread exits or execs.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_set_robust_list,
                    &*head as *const RobustListHead,
                    std::mem::size_of::<RobustListHead>(),
                )
            };
            if r != 0 {
                word.store(0, Ordering::Release);
                return None;
            }
            Some(Self {
                seg: seg.clone(),
                _head: head,
                _entry: entry,
                previous: (prev_head, prev_len),
                _not_send: PhantomData,
            })
        }
    }

    impl Drop for Registration {
        fn drop(&mut self) {
            let (head, len) = self.previous;
            let len = if len == 0 {
                std::mem::size_of::<RobustListHead>()
            } else {
                len
            };
            // SAFETY: gives this thread (the registering one: the type is
            // not `Send`) the list it had before, which its owner (the C
            // library's thread descriptor) keeps alive; or none.
            unsafe { libc::syscall(libc::SYS_set_robust_list, head, len) };
            let word = self.seg.manager_alive();
            word.store(OWNER_DIED, Ordering::Release);
            futex_wake(word);
            // Stacks of this process do not wait on the word (see
            // `sleep`): ring every sleeping stack, so they look. The
            // Dekker half of their sleep (they publish `sleeping`, then
            // read the word): the store above before the loads below.
            // (The futex_wake system call orders them too; this does not
            // lean on that.)
            fence(Ordering::SeqCst);
            for id in 1..=self.seg.max_stacks() as u16 {
                let s = &self.seg.stack_slot(id).sleeping;
                if s.load(Ordering::Relaxed) == crate::layout::SLEEP_FUTEX
                    && s.swap(0, Ordering::AcqRel) == crate::layout::SLEEP_FUTEX
                {
                    futex_wake(s);
                }
            }
        }
    }

    /// Whether a manager ever registered `alive` (so [`died`] will say
    /// when it is gone).
    pub(crate) fn watched(alive: &AtomicU32) -> bool {
        alive.load(Ordering::Relaxed) != 0
    }

    /// Whether the manager that registered `alive` is gone (the kernel or
    /// its clean stop marked the word). Only the two values those leave
    /// count: the word is in memory every peer can write, and a stray
    /// write must not pass for the manager's death.
    pub(crate) fn died(alive: &AtomicU32) -> bool {
        let w = alive.load(Ordering::Acquire);
        w == OWNER_DIED || w == OWNER_DIED | WAITERS
    }

    /// Sleeps while `word` holds `expected`, until a wake-up, `timeout`, or
    /// the manager's death. True if the manager's liveness word ended the
    /// sleep: the caller looks at its control socket (as it does when a
    /// sleep with the tick ends unrung). `watch` false (the manager runs
    /// in this process, see `Stack`): the word is not waited on, so that
    /// the kernel's one wake-up at its death goes to another process; a
    /// manager stopped while this process lives wakes every sleeping stack
    /// itself (`Registration`'s drop), and later sleeps take the tick.
    pub(crate) fn sleep(
        word: &AtomicU32,
        expected: u32,
        alive: &AtomicU32,
        watch: bool,
        timeout: Option<Duration>,
    ) -> bool {
        if !watch && !died(alive) {
            crate::sync::futex_wait(word, expected, timeout);
            return false;
        }
        let seen = alive.load(Ordering::Acquire);
        if seen & TID_MASK == 0 || seen & OWNER_DIED != 0 || !waitv_allowed() {
            // No live manager registered (not yet, or gone), or an old
            // kernel: the tick.
            sleep_with_tick(word, expected, timeout);
            return false;
        }
        let seen = if seen & WAITERS == 0 {
            // Once per manager: ask the kernel to wake a waiter at its
            // death. A failed exchange means the word just changed.
            match alive.compare_exchange(seen, seen | WAITERS, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => seen | WAITERS,
                Err(_) => return true,
            }
        } else {
            seen
        };
        let deadline = timeout.map(|t| {
            let now = rustix::time::clock_gettime(ClockId::Monotonic);
            let ns = now.tv_nsec as u64 + u64::from(t.subsec_nanos());
            Timespec {
                tv_sec: now
                    .tv_sec
                    .saturating_add(t.as_secs().min(i64::MAX as u64) as i64)
                    .saturating_add((ns / 1_000_000_000) as i64),
                tv_nsec: (ns % 1_000_000_000) as _,
            }
        });
        let mut waits = [Wait::new(), Wait::new()];
        for (w, (a, v)) in waits.iter_mut().zip([(word, expected), (alive, seen)]) {
            w.val = u64::from(v);
            w.uaddr = WaitPtr::new(a.as_ptr().cast());
            w.flags = WaitFlags::SIZE_U32;
        }
        match futex::waitv(
            &waits,
            WaitvFlags::empty(),
            deadline.as_ref(),
            ClockId::Monotonic,
        ) {
            Ok(1) => {}
            Ok(_) | Err(rustix::io::Errno::TIMEDOUT | rustix::io::Errno::INTR) => return false,
            // A word differed: the doorbell was rung, or the manager died.
            Err(rustix::io::Errno::AGAIN) if alive.load(Ordering::Acquire) == seen => return false,
            Err(rustix::io::Errno::AGAIN) => {}
            Err(e) => {
                // No such call (before Linux 5.16), or a seccomp filter
                // refusing it: every later sleep would fail the same way.
                if matches!(e, rustix::io::Errno::NOSYS | rustix::io::Errno::PERM) {
                    WAITV.store(WAITV_OFF, Ordering::Relaxed);
                }
                tracing::debug!(error = %e, "futex_waitv failed; sleeping with the tick");
                sleep_with_tick(word, expected, timeout);
                return false;
            }
        }
        // The kernel wakes one waiter of a dead owner's word: pass it on.
        futex_wake(alive);
        true
    }
}

/// Under loom: nothing to register.
#[cfg(loom)]
pub(crate) struct Registration;

#[cfg(loom)]
impl Registration {
    pub(crate) fn register(_: &crate::segment::Segment) -> Option<Self> {
        None
    }
}

/// Under loom: no manager registers.
#[cfg(loom)]
pub(crate) fn watched(_: &AtomicU32) -> bool {
    false
}

/// Under loom: no manager dies.
#[cfg(loom)]
pub(crate) fn died(_: &AtomicU32) -> bool {
    false
}

/// Under loom: the plain futex wait (a yield).
#[cfg(loom)]
pub(crate) fn sleep(
    word: &AtomicU32,
    expected: u32,
    _alive: &AtomicU32,
    _watch: bool,
    timeout: Option<Duration>,
) -> bool {
    sleep_with_tick(word, expected, timeout);
    false
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::{Arc, Barrier};

    use rustix::thread::futex::OWNER_DIED;

    use super::*;
    use crate::layout::PoolConfig;
    use crate::segment::{Region, Segment};
    use crate::sync::Ordering;

    fn segment() -> Segment {
        let cfg = PoolConfig {
            classes: vec![(64, 4)],
            max_stacks: 4,
            max_channels: 2,
            ring_capacity: 8,
        };
        let geo = cfg.geometry().unwrap();
        let region = Region::create_memfd("xio-liveness-test", geo.total_len as usize).unwrap();
        Segment::init(region, &cfg, &geo).unwrap()
    }

    /// The system call thread `tid` of this process is blocked in, if any.
    fn blocked_in(tid: i32) -> Option<i64> {
        let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall")).ok()?;
        s.split_whitespace().next()?.parse().ok()
    }

    /// A "manager" thread dies while registered (it never drops its
    /// registration, as when killed): both sleepers wake through the
    /// liveness word, the second because the first passes the wake-up on.
    /// Without the robust list they would sleep out the one-second tick and
    /// report `false`; without the hand-off, the second would sleep on
    /// (the watchdog fails the test).
    #[test]
    fn a_dead_managers_thread_wakes_every_sleeper() {
        let seg = segment();
        let registered = Arc::new(Barrier::new(2));
        let die = Arc::new(Barrier::new(2));
        let manager = std::thread::spawn({
            let (seg, registered, die) = (seg.clone(), registered.clone(), die.clone());
            move || {
                let reg = Registration::register(&seg).expect("robust list registered");
                registered.wait();
                die.wait();
                // Ends like a killed thread: the kernel, not `Drop`,
                // releases the word.
                std::mem::forget(reg);
            }
        });
        registered.wait();
        let (done_tx, done) = std::sync::mpsc::channel();
        let tids: Vec<i32> = (1..=2u16)
            .map(|id| {
                let (seg, done_tx) = (seg.clone(), done_tx.clone());
                let (tx, rx) = std::sync::mpsc::channel();
                std::thread::spawn(move || {
                    tx.send(rustix::thread::gettid().as_raw_nonzero().get())
                        .unwrap();
                    let word = &seg.stack_slot(id).sleeping;
                    word.store(1, Ordering::SeqCst);
                    let _ = done_tx.send(sleep(word, 1, seg.manager_alive(), true, None));
                });
                rx.recv().unwrap()
            })
            .collect();
        // Both in futex_waitv (a sleeper that came late would see the word
        // released, take the tick path and report `false`).
        for &tid in &tids {
            while blocked_in(tid) != Some(libc::SYS_futex_waitv) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        die.wait();
        manager.join().unwrap();
        for _ in &tids {
            // A watchdog, not a time bound: a sleeper nobody wakes sleeps on.
            let woke = done
                .recv_timeout(Duration::from_secs(60))
                .expect("a sleeper was never woken");
            assert!(woke, "a sleeper was not woken by the liveness word");
        }
        let w = seg.manager_alive().load(Ordering::Relaxed);
        assert_ne!(w & OWNER_DIED, 0, "word {w:#x}");
    }

    /// A manager that stops cleanly marks the word too, and gives its
    /// thread its previous robust list back.
    #[test]
    fn a_clean_stop_marks_the_word_and_restores_the_list() {
        let seg = segment();
        let list = || {
            let (mut head, mut len) = (0usize, 0usize);
            // SAFETY: writes this thread's list head and length into the locals.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_get_robust_list,
                    0,
                    &mut head as *mut usize,
                    &mut len as *mut usize,
                )
            };
            assert_eq!(r, 0);
            (head, len)
        };
        let before = list();
        let reg = Registration::register(&seg).unwrap();
        assert_ne!(list(), before);
        let tid = rustix::thread::gettid().as_raw_nonzero().get() as u32;
        assert_eq!(seg.manager_alive().load(Ordering::Relaxed), tid);
        drop(reg);
        assert_eq!(list(), before);
        let w = seg.manager_alive().load(Ordering::Relaxed);
        assert_ne!(w & OWNER_DIED, 0, "word {w:#x}");
        assert!(died(seg.manager_alive()));
        // A stray write with the bit set is not a death.
        seg.manager_alive()
            .store(OWNER_DIED | 0x1234, Ordering::Relaxed);
        assert!(!died(seg.manager_alive()));
        seg.manager_alive().store(OWNER_DIED, Ordering::Relaxed);
        // Sleeps after the manager's end take the tick path: a word that
        // stays rung returns at once.
        let word = &seg.stack_slot(1).sleeping;
        assert!(!sleep(word, 1, seg.manager_alive(), true, None));
    }
}
