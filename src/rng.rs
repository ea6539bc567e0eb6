//! Seeded pseudo-random numbers for what runs beside the core — the ager, the crash explorer,
//! the benchmarks — and for tests: one generator, so that a seed names the same sequence
//! everywhere (an aged pool or a crash run is reproduced from its seed). Not for anything an
//! adversary may see.

/// splitmix64 (Steele, Lea and Flood, 2014): each draw adds the golden-ratio increment to the
/// state and mixes it. The state is the tuple field, so a checkpoint can store and restore it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rng(pub u64);

impl Rng {
    /// The generator a seed names.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// In `0..n` (0 when `n` is 0); the modulo's bias is below 2^-40 for the counts used here.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// An index in `0..n` (0 when `n` is 0): the same draw as [`Rng::below`].
    pub fn pick(&mut self, n: usize) -> usize {
        usize::try_from(self.below(n as u64)).unwrap_or(0)
    }

    /// Uniform in [0, 1), from the draw's top 53 bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The published splitmix64 sequence: a changed generator would change every aged pool and
    /// crash run a seed names.
    #[test]
    fn draws_follow_splitmix64() {
        let mut r = Rng::new(0);
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(r.next_u64(), 0x06c4_5d18_8009_454f);
    }

    #[test]
    fn bounded_draws_stay_in_range() {
        let mut r = Rng::new(7);
        for n in [1u64, 2, 3, 10, 1 << 40] {
            for _ in 0..1000 {
                assert!(r.below(n) < n);
            }
        }
        assert_eq!(r.below(0), 0);
        assert_eq!(r.pick(0), 0);
        for _ in 0..1000 {
            let u = r.unit();
            assert!((0.0..1.0).contains(&u));
        }
    }
}
