//! How a stack waits for descriptors: the waiting modes and the adaptive
//! spin-then-sleep policy.
//!
//! # Why adaptive
//! On the VMs this runs on, waking a sleeping process on another core costs
//! tens of microseconds (a halted vCPU must be resumed), while the cache
//! lines of a message cross between spinning cores in a fraction of one
//! (the first is in every kernel column of BENCHMARKS.md, the second is
//! the raw ring's rate there). So a waiter keeps the
//! shared-memory floor only while it spins; but a spinner sharing a core
//! with its peer burns a whole scheduler tick (milliseconds) per message,
//! because the peer cannot run to answer it. FABLE (§2.1.3) describes the
//! same trade-off between its mempipe-spin and mempipe-futex.
//!
//! The policy here:
//! 1. **Spin only while it can pay**: only if some peer is awake (not asleep
//!    on its own doorbell) *and* last ran on another CPU. A peer that is
//!    awake on our own CPU cannot run while we spin, so we sleep at once and
//!    let it; a peer that is asleep will not send until something wakes it.
//!    Both checks are re-made while spinning, so a peer going to sleep or
//!    migrating onto our core ends the spin early.
//! 2. **Spin for about what blocking costs** (the classic 2-competitive
//!    rule: never waste more than twice the optimum). The cost of a wake-up
//!    is *measured*: the waker stamps the time it rang the doorbell, the
//!    woken side takes the difference, and an EWMA tracks it.
//! 3. **Back off when spinning does not pay**: when a sleep turns out long
//!    (traffic is sparse), the budget halves, down to a token spin; when
//!    data arrives soon after giving up (we would have caught it), the
//!    budget returns to the measured target. Idle, a stack sleeps at once
//!    and uses no CPU.

use std::time::Duration;

/// How a blocking operation waits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WaitMode {
    /// Spin without ever sleeping: lowest latency, burns a core. For users
    /// who dedicate a core to the stack.
    BusyPoll,
    /// Spin while spinning pays, then sleep on the doorbell (the default).
    #[default]
    Adaptive,
    /// Sleep on the doorbell at once.
    Blocking,
    /// Never wait: return `WouldBlock`.
    NonBlocking,
}

/// Wake-up cost assumed before the first measurement (this machine class).
const INITIAL_WAKE_NS: u64 = 30_000;
/// The spin ceiling is this many wake-ups...
const MAX_WAKES: u64 = 8;
/// ...but at least this...
const MAX_BUDGET_FLOOR_NS: u64 = 20_000;
/// ...and never more than this.
const MAX_BUDGET_NS: u64 = 200_000;
/// The token spin left when traffic is sparse.
const MIN_BUDGET_NS: u64 = 500;
/// Ignore wake-up measurements above this (a stale stamp, or a stopped process).
const MAX_PLAUSIBLE_WAKE_NS: u64 = 5_000_000;

/// The adaptive policy's state (one per waiting stack).
#[derive(Clone, Debug)]
pub struct AdaptiveSpin {
    wake_ns: u64,
    budget_ns: u64,
    /// Waits that spun at all.
    pub spins: u64,
    /// Waits satisfied while spinning.
    pub spin_hits: u64,
    /// Waits that ended in a sleep.
    pub sleeps: u64,
}

impl Default for AdaptiveSpin {
    fn default() -> Self {
        let wake_ns = INITIAL_WAKE_NS;
        Self {
            wake_ns,
            budget_ns: Self::ceiling(wake_ns),
            spins: 0,
            spin_hits: 0,
            sleeps: 0,
        }
    }
}

impl AdaptiveSpin {
    /// The longest spin worth doing: a few wake-ups' worth. A gap longer
    /// than that is cheaper to sleep through.
    fn ceiling(wake_ns: u64) -> u64 {
        (MAX_WAKES * wake_ns).clamp(MAX_BUDGET_FLOOR_NS, MAX_BUDGET_NS)
    }

    /// Current spin budget.
    pub fn budget(&self) -> Duration {
        Duration::from_nanos(self.budget_ns)
    }

    /// Current estimate of a wake-up's cost.
    pub fn wake_cost(&self) -> Duration {
        Duration::from_nanos(self.wake_ns)
    }

    /// How long to spin now, given whether a peer could be sending.
    pub fn spin_for(&self, worth_spinning: bool) -> u64 {
        if worth_spinning {
            self.budget_ns
        } else {
            0
        }
    }

    /// A wait starts spinning.
    pub fn on_spin_start(&mut self) {
        self.spins += 1;
    }

    /// Data arrived while spinning.
    pub fn on_spin_hit(&mut self) {
        self.spin_hits += 1;
    }

    /// A spin found nothing and the traffic has stopped (nothing for
    /// longer than any gap worth spinning through): halve the budget, down
    /// to none (the next wake-up's gap grows it back).
    pub fn on_idle_watch(&mut self) {
        self.budget_ns /= 2;
        if self.budget_ns < MIN_BUDGET_NS {
            self.budget_ns = 0;
        }
    }

    /// We spun `spun_ns`, then slept `slept_ns` until data came; `wake_ns`
    /// is the measured doorbell-to-running latency, when a doorbell woke us.
    ///
    /// The gap we waited (`spun + slept`) is what spinning would have had
    /// to cover. A gap within the ceiling means the peer answers within a
    /// few wake-ups: spin twice that next time, so both sides stay awake and
    /// the exchange runs at memory speed instead of settling into two
    /// sleeping processes waking each other (the trap FABLE's mempipe
    /// discussion describes). A longer gap means traffic is sparse: halve
    /// the budget, down to a token spin, so an idle stack sleeps at once.
    pub fn on_sleep(&mut self, spun_ns: u64, slept_ns: u64, wake_ns: Option<u64>) {
        self.sleeps += 1;
        if let Some(w) = wake_ns.filter(|&w| w > 0 && w < MAX_PLAUSIBLE_WAKE_NS) {
            // EWMA with weight 1/4.
            self.wake_ns = (3 * self.wake_ns + w) / 4;
        }
        let ceiling = Self::ceiling(self.wake_ns);
        let gap = spun_ns + slept_ns;
        if gap <= ceiling {
            self.budget_ns = self.budget_ns.max(2 * gap).clamp(MIN_BUDGET_NS, ceiling);
        } else {
            self.budget_ns = (self.budget_ns / 2).max(MIN_BUDGET_NS);
        }
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds: comparable across processes.
pub fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_traffic_shrinks_dense_traffic_grows() {
        let mut a = AdaptiveSpin::default();
        assert_eq!(a.spin_for(false), 0, "never spin when no peer can send");
        assert_eq!(a.spin_for(true), 200_000);
        for _ in 0..20 {
            a.on_sleep(a.spin_for(true), 10_000_000, None); // 10 ms gaps
        }
        assert_eq!(a.spin_for(true), MIN_BUDGET_NS);
        // A peer that answers 4 us after we gave up: spin through that.
        a.on_sleep(MIN_BUDGET_NS, 4_000, Some(2_000));
        assert!(a.spin_for(true) >= 8_000, "{:?}", a.budget());
    }

    #[test]
    fn idle_watches_end_spinning_and_traffic_restores_it() {
        let mut a = AdaptiveSpin::default();
        for _ in 0..20 {
            a.on_idle_watch();
        }
        assert_eq!(a.spin_for(true), 0, "idle: no spinning at all");
        a.on_sleep(0, 3_000, Some(2_000)); // traffic again, 3 us gaps
        assert!(a.spin_for(true) >= 6_000, "{:?}", a.budget());
    }

    #[test]
    fn ceiling_follows_measured_wake_cost() {
        let mut a = AdaptiveSpin::default();
        for _ in 0..30 {
            a.on_sleep(0, 1_000_000, Some(1_500)); // cheap wake-ups, sparse traffic
        }
        assert!(a.wake_cost() < Duration::from_micros(3));
        // Gaps above 8 wake-ups (floored at 20 us) are not spun through.
        a.on_sleep(0, 30_000, None);
        assert!(a.budget() < Duration::from_micros(20));
        for _ in 0..30 {
            a.on_sleep(0, 1_000_000, Some(90_000_000)); // implausible: ignored
        }
        assert!(a.wake_cost() < Duration::from_micros(3));
    }
}
