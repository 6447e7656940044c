//! The router's randomness for the core's random decisions (`rondo_core::Entropy`): a
//! generator per worker thread, seeded once from the system's randomness, so that a draw takes
//! no lock (request ids, trace spans, weighted cluster splits, sampled filters).

use std::cell::RefCell;

use rondo_core::{Entropy, SplitMix64};

thread_local! {
    /// Each worker's generator, seeded once from the system's randomness.
    static RNG: RefCell<SplitMix64> = RefCell::new(SplitMix64::new(seed()));
}

fn seed() -> u64 {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 8];
    let _ = ring::rand::SystemRandom::new().fill(&mut bytes);
    // A failed fill (never on Linux) still gives workers different streams.
    u64::from_le_bytes(bytes) ^ (std::process::id() as u64) << 32
}

/// The calling thread's generator, as the core's `Entropy`.
pub(crate) struct Local;

impl Entropy for Local {
    fn next_u64(&mut self) -> u64 {
        RNG.with(|r| r.borrow_mut().next_u64())
    }
}

/// Whether this draw falls in a share of `ppm` parts per million (sampled filters).
pub(crate) fn chance(ppm: u32) -> bool {
    const PPM: u32 = rondo_core::traffic::PPM;
    ppm >= PPM || (ppm > 0 && Local.below(PPM as usize) < ppm as usize)
}

/// 64 random bits from the calling thread's generator.
pub(crate) fn random() -> u64 {
    Local.next_u64()
}

/// 128 random bits, as two halves, in one visit to the calling thread's generator (a request
/// id, a trace id).
pub(crate) fn random_pair() -> (u64, u64) {
    RNG.with(|r| {
        let mut r = r.borrow_mut();
        (r.next_u64(), r.next_u64())
    })
}
