//! The manager's liveness word: a robust futex that the kernel releases
//! when the manager dies, so a sleeping stack learns of it at once without
//! a timer armed on every sleep.
//!
//! # Why
//! A stack sleeps on the futex word in its slot until a peer rings it. A
//! sleeper must also notice a dead manager (to report
//! [`crate::stack::Error::ManagerGone`]), and nobody rings for the dead.
//! Sleeps used to carry a one-second timeout for that, and arming and
//! cancelling that timer on every sleep cost a large part of the
//! shared-memory round trip itself in blocking mode (measure it with
//! `benches/c/wake_pingpong.c`: `futex-timeout` against `futex-waitv`).
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
pub(crate) const TID_MASK: u32 = 0x3fff_ffff;

#[cfg(not(loom))]
pub(crate) use real::{died, died_value, sleep, watched};

#[cfg(not(loom))]
mod real {
    use std::sync::atomic::AtomicU8;
    use std::time::Duration;

    use rustix::thread::futex::{self, Wait, WaitFlags, WaitPtr, WaitvFlags, OWNER_DIED, WAITERS};
    use rustix::time::{ClockId, Timespec};

    use super::{sleep_with_tick, TID_MASK};
    use crate::sync::{futex_wake, AtomicU32, Ordering};

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
        died_value(alive.load(Ordering::Acquire))
    }

    /// Whether `w`, a value of the liveness word, is one a dead manager
    /// leaves. Only a hint: see [`crate::stack::Stack::manager_died`].
    pub(crate) fn died_value(w: u32) -> bool {
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

/// Under loom: no manager dies.
#[cfg(loom)]
pub(crate) fn died_value(_: u32) -> bool {
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
