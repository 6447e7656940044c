//! Randomness as an argument. Pickers that need chance take `&mut dyn Entropy`; the core has no
//! global generator, so a seeded [`SplitMix64`] replays every random decision exactly.
//!
//! We define our own one-method trait instead of depending on `rand`: the core needs 64 random
//! bits at a time and nothing else, and a stable, dependency-free generator is what makes the
//! shared golden vectors (router, naming service and client library must pick identically)
//! reproducible across crate upgrades.

/// A source of uniformly distributed 64-bit values.
pub trait Entropy {
    /// The next 64 random bits.
    fn next_u64(&mut self) -> u64;

    /// A uniform value in `0..n` (`n > 0`), by Lemire's multiply-shift; the bias is below
    /// `n / 2^64`, far under anything a balancer can observe.
    fn below(&mut self, n: usize) -> usize {
        debug_assert!(n > 0, "below(0)");
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// A uniform float in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

impl<E: Entropy + ?Sized> Entropy for &mut E {
    fn next_u64(&mut self) -> u64 {
        (**self).next_u64()
    }
}

/// Steele, Lea and Flood's SplitMix64 ("Fast splittable pseudorandom number generators",
/// OOPSLA 2014): tiny, fast, passes BigCrush, and fully determined by its seed.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose whole output is determined by `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }
}

impl Entropy for SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        crate::hash::mix64(self.state)
    }
}
