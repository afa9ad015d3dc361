//! A cheap clock for the event-loop clients' per-request time stamps.
//!
//! Section c's clients stamp every request and every reply. On a VM
//! `Instant::now()` costs tens of nanoseconds (the vDSO over the TSC
//! clocksource), and an X-IO client doing millions of requests a second
//! spent a noticeable share of its CPU reading it: the benchmark's
//! instrumentation, not the transport, and a cost the kernel sockets'
//! clients (microseconds a request) never notice. A bare `rdtsc` costs
//! about half as much. [`Clock`] stamps in TSC
//! ticks where the TSC is invariant (constant rate, not stopped in idle
//! states) and converts to nanoseconds with a rate measured against
//! `Instant` over the whole run; elsewhere it falls back to `Instant`.
//!
//! Stamps are only compared on the thread (and, pinned, the CPU) that took
//! them.

use std::time::{Duration, Instant};

/// Per-request time stamps in ticks; see the module docs.
pub struct Clock {
    t0: Instant,
    c0: u64,
    tsc: bool,
    /// Ticks per nanosecond, from a short calibration at [`Clock::start`]
    /// (for deadlines; [`Clock::ns_per_tick`] measures again at the end).
    ticks_per_ns: f64,
}

impl Clock {
    /// Starts the clock; with the TSC, calibrates it for 5 ms.
    pub fn start() -> Clock {
        let tsc = invariant_tsc();
        let t0 = Instant::now();
        let c0 = raw(tsc, t0);
        let mut clock = Clock {
            t0,
            c0,
            tsc,
            ticks_per_ns: 1.0,
        };
        if tsc {
            std::thread::sleep(Duration::from_millis(5));
            clock.ticks_per_ns = 1.0 / clock.ns_per_tick();
        }
        clock
    }

    /// Now, in ticks.
    #[inline]
    pub fn now(&self) -> u64 {
        raw(self.tsc, self.t0)
    }

    /// `d` in ticks (by the start's calibration: for deadlines).
    pub fn ticks(&self, d: Duration) -> u64 {
        (d.as_nanos() as f64 * self.ticks_per_ns) as u64
    }

    /// Nanoseconds per tick, measured from the start until now.
    pub fn ns_per_tick(&self) -> f64 {
        let ns = self.t0.elapsed().as_nanos() as f64;
        let ticks = self.now().wrapping_sub(self.c0) as f64;
        if ticks > 0.0 {
            ns / ticks
        } else {
            1.0
        }
    }
}

/// Converts tick samples to nanoseconds in place.
pub fn to_ns(samples: &mut [u64], ns_per_tick: f64) {
    if ns_per_tick != 1.0 {
        for s in samples {
            *s = (*s as f64 * ns_per_tick) as u64;
        }
    }
}

/// A sample vector with room for `n` samples, its pages already touched,
/// so growing it costs no page faults in the measured window (they showed
/// in the X-IO client's profile).
pub fn presized(n: usize) -> Vec<u64> {
    let mut v = vec![0u64; n];
    // `vec![0; n]` may hand out untouched zero pages: write them.
    for page in v.chunks_mut(512) {
        page[0] = 1;
    }
    v.clear();
    v
}

#[inline]
fn raw(tsc: bool, t0: Instant) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if tsc {
        // SAFETY: `rdtsc` has no preconditions on x86_64; it reads a
        // counter.
        return unsafe { core::arch::x86_64::_rdtsc() };
    }
    let _ = tsc;
    t0.elapsed().as_nanos() as u64
}

/// Whether the TSC runs at a constant rate in every state (CPUID
/// 0x8000_0007, EDX bit 8), as Linux's `constant_tsc` + `nonstop_tsc`.
fn invariant_tsc() -> bool {
    #[cfg(target_arch = "x86_64")]
    // `__cpuid` is safe from Rust 1.87 and unsafe before (the MSRV is 1.85).
    #[allow(unused_unsafe)]
    {
        use core::arch::x86_64::__cpuid;
        // SAFETY: `cpuid` exists on every x86_64 CPU; leaf 0x8000_0000
        // gives the highest extended leaf, checked before asking for it.
        let max = unsafe { __cpuid(0x8000_0000) }.eax;
        if max < 0x8000_0007 {
            return false;
        }
        // SAFETY: as above; the leaf is within the range just read.
        let edx = unsafe { __cpuid(0x8000_0007) }.edx;
        edx & (1 << 8) != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_become_the_time_that_passed() {
        let c = Clock::start();
        let a = c.now();
        std::thread::sleep(Duration::from_millis(20));
        let b = c.now();
        let ns = (b - a) as f64 * c.ns_per_tick();
        assert!(ns >= 19e6, "{ns} ns measured for a 20 ms sleep");
        let mut v = vec![b - a];
        to_ns(&mut v, c.ns_per_tick());
        assert!(v[0] >= 19_000_000, "{v:?}");
        assert!(c.ticks(Duration::from_millis(1)) > 0);
    }

    #[test]
    fn presized_is_empty_with_room() {
        let v = presized(10_000);
        assert!(v.is_empty());
        assert!(v.capacity() >= 10_000);
    }
}
