//! The seeded source every random choice of a run comes from, so a run
//! is replayed from its seed.

/// A small deterministic generator (SplitMix64).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rng(u64);

impl Rng {
    /// A generator that starts from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next_u64() % (high - low + 1)
    }

    /// `true` with probability `percent` in 100.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }

    /// A generator for a part of the run (a process, a fault schedule),
    /// independent of how many numbers the parent drew.
    pub fn fork(&self, part: u64) -> Self {
        Self(self.0 ^ part.wrapping_mul(0xd6e8_feb8_6659_fd93)).skip()
    }

    fn skip(mut self) -> Self {
        self.next_u64();
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_seed_one_sequence() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        let first: Vec<u64> = (0..5).map(|_| a.between(3, 9)).collect();
        assert_eq!(first, (0..5).map(|_| b.between(3, 9)).collect::<Vec<_>>());
        assert!(first.iter().all(|n| (3..=9).contains(n)));
        assert_ne!(Rng::new(7).fork(1), Rng::new(7).fork(2));
    }
}
