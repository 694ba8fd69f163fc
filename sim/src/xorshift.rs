//! A seeded xorshift generator for the randomized tests (no dependency, the same numbers on
//! every machine).

/// Numbers below `m`, from `seed` (not zero).
pub fn below(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut x = seed;
    move |m| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    }
}
