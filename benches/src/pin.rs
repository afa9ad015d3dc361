//! CPU pinning helpers for the benchmark processes.
//!
//! Both the client (parent) and the server (child) pin the *calling thread*
//! to a single CPU so that cross-process latency numbers are not polluted by
//! scheduler migrations. Pinning is done with `sched_setaffinity(2)` via
//! rustix, so no external `taskset` is needed.

use std::io;

use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};

/// Pins the calling thread to exactly one CPU (`sched_setaffinity(0, {cpu})`).
///
/// Threads spawned afterwards (and processes spawned from this thread)
/// inherit the mask.
///
/// # Errors
///
/// Returns `InvalidInput` if `cpu` is not representable in a `cpu_set_t`,
/// and the OS error if the kernel rejects the mask (e.g. `EINVAL` when the CPU
/// is offline or outside the cgroup's cpuset).
pub fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    if cpu >= CpuSet::MAX_CPU {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("cpu {cpu} out of range (max {})", CpuSet::MAX_CPU - 1),
        ));
    }
    let mut set = CpuSet::new();
    set.set(cpu);
    sched_setaffinity(None, &set).map_err(io::Error::from)
}

/// Number of CPUs currently online on the machine.
///
/// Reads `/sys/devices/system/cpu/online` (e.g. `0-1` or `0,2-5`), which is
/// independent of this thread's affinity mask; falls back to
/// [`std::thread::available_parallelism`] and finally to 1.
pub fn online_cpus() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| parse_cpu_list(&s))
        .filter(|&n| n > 0)
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
        .unwrap_or(1)
}

/// Counts the CPUs in a kernel cpu-list string such as `0-3,6,8-9`.
fn parse_cpu_list(s: &str) -> Option<usize> {
    let mut count = 0usize;
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((lo, hi)) => {
                let lo: usize = lo.trim().parse().ok()?;
                let hi: usize = hi.trim().parse().ok()?;
                count += hi.checked_sub(lo)? + 1;
            }
            None => {
                part.trim().parse::<usize>().ok()?;
                count += 1;
            }
        }
    }
    Some(count)
}

/// Restores the calling thread's previous CPU affinity mask when dropped.
///
/// Returned by [`pin_scoped`]. Must be dropped on the thread that created it
/// (it is `!Send` for that reason).
#[derive(Debug)]
pub struct AffinityGuard {
    saved: Option<CpuSet>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for AffinityGuard {
    fn drop(&mut self) {
        if let Some(saved) = self.saved.take() {
            // Best effort: nothing useful can be done with an error in drop.
            let _ = sched_setaffinity(None, &saved);
        }
    }
}

/// Pins the calling thread to `cpu` (if `Some`) and returns a guard that
/// restores the previous affinity mask on drop. With `None` this is a no-op.
///
/// # Errors
///
/// Same as [`pin_to_cpu`], plus any error from reading the current mask.
pub fn pin_scoped(cpu: Option<usize>) -> io::Result<AffinityGuard> {
    let saved = match cpu {
        Some(cpu) => {
            let saved = sched_getaffinity(None).map_err(io::Error::from)?;
            pin_to_cpu(cpu)?;
            Some(saved)
        }
        None => None,
    };
    Ok(AffinityGuard {
        saved,
        _not_send: std::marker::PhantomData,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_list_parsing() {
        assert_eq!(parse_cpu_list("0-1\n"), Some(2));
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0,2-5,7"), Some(6));
        assert_eq!(parse_cpu_list("x"), None);
        assert!(online_cpus() >= 1);
    }

    #[test]
    fn pin_and_restore() {
        let before = sched_getaffinity(None).unwrap();
        {
            let _g = pin_scoped(Some(0)).unwrap();
            let now = sched_getaffinity(None).unwrap();
            assert_eq!(now.count(), 1);
            assert!(now.is_set(0));
        }
        let after = sched_getaffinity(None).unwrap();
        assert_eq!(before.count(), after.count());
        assert!(pin_to_cpu(CpuSet::MAX_CPU).is_err());
    }
}
