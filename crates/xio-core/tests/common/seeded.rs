//! What the randomized tests share: a seeded generator, seeds and lengths
//! from the environment, and the checksummed byte pattern. Needs nothing
//! but std, so the xio-manager tests take it too (with `#[path]`).

/// splitmix64: small, and the same sequence for the same seed on every
/// machine (a printed seed replays a run's choices).
#[derive(Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// In `0..n` (0 for `n` 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// An index into something of length `n`.
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }
    /// In `lo..hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo)
    }
    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }
    /// True with probability `pct` percent.
    pub fn pct(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.index(xs.len())]
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
    /// A `u32` at a boundary, next to one of `near`, or anything.
    pub fn u32_near(&mut self, near: &[u32]) -> u32 {
        const EDGES: [u32; 13] = [
            0,
            1,
            2,
            0x7f,
            0x80,
            0xff,
            0x100,
            0xffff,
            0x1_0000,
            0x7fff_ffff,
            0x8000_0000,
            u32::MAX - 1,
            u32::MAX,
        ];
        match self.below(3) {
            0 => self.pick(&EDGES),
            1 if !near.is_empty() => {
                let n = self.pick(near);
                n.wrapping_add(self.below(3) as u32).wrapping_sub(1)
            }
            _ => self.next() as u32,
        }
    }
}

/// `$name` as a number (decimal, or hex after `0x`); `None` if unset. A
/// value that is not a number fails the test rather than being ignored.
pub fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let t = v.trim();
    let n = match t.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => t.parse().ok(),
    };
    Some(n.unwrap_or_else(|| panic!("{name}={v:?}: not a number")))
}

/// The seed `$name` gives (to replay a run), else one from the clock.
pub fn seed_from_env(name: &str) -> u64 {
    env_u64(name).unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    })
}

/// Fills `buf` with a pattern determined by `seed`.
pub fn fill(buf: &mut [u8], seed: u64) {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut chunks = buf.chunks_exact_mut(8);
    for c in &mut chunks {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes());
    }
    for b in chunks.into_remainder() {
        *b = seed as u8;
    }
}

/// Checks a buffer filled by [`fill`] with `seed`.
pub fn verify(buf: &[u8], seed: u64) -> bool {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut chunks = buf.chunks_exact(8);
    for c in &mut chunks {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if c != x.to_le_bytes() {
            return false;
        }
    }
    chunks.remainder().iter().all(|&b| b == seed as u8)
}
