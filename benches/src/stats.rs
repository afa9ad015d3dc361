//! Summary statistics over per-round-trip latency samples.

/// Summary of a set of round-trip latency samples, all in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// Median (nearest-rank 50th percentile).
    pub p50_ns: f64,
    /// Nearest-rank 99th percentile.
    pub p99_ns: f64,
    /// Arithmetic mean.
    pub mean_ns: f64,
    /// Number of samples.
    pub n: usize,
}

/// Summarizes per-round-trip samples (nanoseconds).
///
/// Sorts `samples` in place. Percentiles use the nearest-rank method (the
/// value at sorted index `ceil(p * n) - 1`), so they are always an observed
/// sample. An empty slice yields all-zero statistics with `n == 0`.
pub fn summarize(samples: &mut [u64]) -> Summary {
    let n = samples.len();
    if n == 0 {
        return Summary {
            p50_ns: 0.0,
            p99_ns: 0.0,
            mean_ns: 0.0,
            n: 0,
        };
    }
    samples.sort_unstable();
    let sum: u128 = samples.iter().map(|&s| u128::from(s)).sum();
    Summary {
        p50_ns: percentile_sorted(samples, 50) as f64,
        p99_ns: percentile_sorted(samples, 99) as f64,
        mean_ns: sum as f64 / n as f64,
        n,
    }
}

/// Nearest-rank percentile `pct` (0..=100) of a non-empty sorted slice.
fn percentile_sorted(sorted: &[u64], pct: usize) -> u64 {
    let n = sorted.len();
    // ceil(pct * n / 100), at least 1, at most n; then to a 0-based index.
    let rank = (pct * n).div_ceil(100).clamp(1, n);
    sorted[rank - 1]
}

/// Formats a nanosecond value as microseconds with two decimals (`"0.31"`),
/// or, from 1000 µs upwards, as milliseconds with one decimal and a unit
/// (`"8.1 ms"`).
pub fn fmt_us(ns: f64) -> String {
    let us = ns / 1_000.0;
    // Compare after rounding to 2 decimals so 999.996 µs prints as "1.0 ms"
    // rather than "1000.00".
    if (us * 100.0).round() >= 100_000.0 {
        format!("{:.1} ms", us / 1_000.0)
    } else {
        format!("{us:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_basic() {
        let mut v: Vec<u64> = (1..=100).rev().collect();
        let s = summarize(&mut v);
        assert_eq!(s.n, 100);
        assert_eq!(s.p50_ns, 50.0);
        assert_eq!(s.p99_ns, 99.0);
        assert_eq!(s.mean_ns, 50.5);
        assert_eq!(v[0], 1);
    }

    #[test]
    fn summary_small_and_empty() {
        let mut one = [7u64];
        let s = summarize(&mut one);
        assert_eq!((s.p50_ns, s.p99_ns, s.mean_ns, s.n), (7.0, 7.0, 7.0, 1));
        let s = summarize(&mut []);
        assert_eq!(s.n, 0);
        let mut three = [30u64, 10, 20];
        let s = summarize(&mut three);
        assert_eq!((s.p50_ns, s.p99_ns), (20.0, 30.0));
    }

    #[test]
    fn formatting() {
        assert_eq!(fmt_us(310.0), "0.31");
        assert_eq!(fmt_us(45_678.0), "45.68");
        assert_eq!(fmt_us(999_990.0), "999.99");
        assert_eq!(fmt_us(8_100_000.0), "8.1 ms");
        assert_eq!(fmt_us(1_000_000.0), "1.0 ms");
        assert_eq!(fmt_us(999_996.0), "1.0 ms");
    }
}
