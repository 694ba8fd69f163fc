//! Maps keyed by peer and tag on the data path, with a hasher that costs a few instructions
//! instead of SipHash's dozens (callgrind of a 2-rank 8 B allreduce over TCP: SipHash was 14 %
//! of all instructions). Keys are rank numbers and tags of authenticated peers only (a
//! stranger never gets past the handshake), so resistance to chosen-key flooding, what
//! SipHash buys, is not needed here.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Multiply-xorshift over the key's integers (the key types here are `usize`/`u64` tuples).
#[derive(Default, Clone, Copy, Debug)]
pub struct KeyHasher {
    state: u64,
}

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        let x = self.state;
        x ^ (x >> 29)
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.state = (self.state.rotate_left(5) ^ value).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn write_usize(&mut self, value: usize) {
        self.write_u64(value as u64);
    }
}

/// A `HashMap` with [`KeyHasher`].
pub type KeyMap<K, V> = HashMap<K, V, BuildHasherDefault<KeyHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_that_differ_in_one_part_hash_apart() {
        let mut m: KeyMap<(usize, u64), u32> = KeyMap::default();
        for peer in 0..64usize {
            for tag in 0..64u64 {
                m.insert((peer, tag << 32 | tag), (peer * 64) as u32 + tag as u32);
            }
        }
        assert_eq!(m.len(), 64 * 64);
        assert_eq!(m.get(&(3, 5 << 32 | 5)), Some(&(3 * 64 + 5)));
        let hash = |k: (usize, u64)| {
            let mut h = KeyHasher::default();
            std::hash::Hash::hash(&k, &mut h);
            h.finish()
        };
        assert_ne!(hash((0, 1)), hash((1, 0)));
        assert_ne!(hash((0, 1 << 32)), hash((0, 1)));
    }
}
