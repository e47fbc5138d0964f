//! A keyed hash for the engine's own maps: fast, and not steerable by
//! whoever chooses the keys.
//!
//! The limiter's key store (client IPs), the de-duplication table (URLs) and
//! the host table (host names) are keyed by values that callers and
//! resolvers choose. `std`'s `RandomState` (SipHash-1-3) is the safe default
//! but costs more than the rest of a lookup for such short keys. This is a
//! folded multiply in the style of aHash/foldhash: every builder draws a seed
//! and an odd multiplier (128 bits) from `RandomState`, each 8-byte word is
//! mixed in as `fold(state ^ word, multiplier)` — `fold` XORs the two halves
//! of the 128-bit product — and `finish` folds once more by a constant.
//! Without the seed, an attacker cannot aim many keys at one bucket; it is
//! not a cryptographic MAC, and needs not be.

use std::hash::{BuildHasher, Hasher, RandomState};

/// Builds [`KeyedHasher`]s keyed by 128 bits drawn from `std`'s `RandomState`
/// (a fresh seed per builder).
#[derive(Clone, Debug)]
pub(crate) struct KeyedHashBuilder {
    seed: u64,
    multiplier: u64,
}

impl KeyedHashBuilder {
    /// A builder with a fresh random seed.
    pub(crate) fn new() -> Self {
        // `RandomState` is SipHash under random keys: its hashes of two fixed
        // words are two secret, independent-looking 64-bit values.
        let random = RandomState::new();
        Self {
            seed: random.hash_one(0x243f_6a88_85a3_08d3_u64),
            multiplier: random.hash_one(0x1319_8a2e_0370_7344_u64) | 1,
        }
    }
}

impl Default for KeyedHashBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl BuildHasher for KeyedHashBuilder {
    type Hasher = KeyedHasher;

    fn build_hasher(&self) -> KeyedHasher {
        KeyedHasher {
            acc: self.seed,
            multiplier: self.multiplier,
        }
    }
}

/// A keyed folded-multiply hasher for short fixed-width keys: the state
/// starts at the seed, each word written is mixed in as
/// `fold(state ^ word, multiplier)`, where `fold` XORs the two halves of the
/// 128-bit product, and `finish` folds once more. A byte string is its
/// 8-byte words, then its length.
#[derive(Clone, Debug)]
pub(crate) struct KeyedHasher {
    acc: u64,
    multiplier: u64,
}

/// `finish` folds the state once more by this (odd) constant: one fold
/// spreads a small difference in the last word poorly over the low bits.
const FINISH: u64 = 0x9e37_79b9_7f4a_7c15;

/// The 128-bit product of `a` and `b`, its halves XORed.
#[inline]
fn fold(a: u64, b: u64) -> u64 {
    let product = u128::from(a) * u128::from(b);
    (product as u64) ^ ((product >> 64) as u64)
}

impl KeyedHasher {
    #[inline]
    fn mix(&mut self, word: u64) {
        self.acc = fold(self.acc ^ word, self.multiplier);
    }
}

impl Hasher for KeyedHasher {
    #[inline]
    fn finish(&self) -> u64 {
        fold(self.acc, FINISH)
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            self.mix(u64::from_le_bytes(chunk.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.mix(u64::from_le_bytes(word));
        }
        // The length keeps `b"a"` and `b"a\0"` apart.
        self.mix(bytes.len() as u64);
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.mix(u64::from(i));
    }

    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.mix(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.mix(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.mix(i);
    }

    #[inline]
    fn write_u128(&mut self, i: u128) {
        self.mix(i as u64);
        self.mix((i >> 64) as u64);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.mix(i as u64);
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! Spread checks shared by the tests of the maps keyed with this hash.

    /// Counts of `hashes` in `buckets` buckets chosen by `bucket`, against
    /// a uniform spread: the chi-square statistic and every single count must
    /// stay within bounds a fair hash crosses with a chance below 1e-6.
    pub(crate) fn assert_even(
        hashes: &[u64],
        buckets: usize,
        bucket: impl Fn(u64) -> usize,
        what: &str,
    ) {
        let mut counts = vec![0usize; buckets];
        for &h in hashes {
            counts[bucket(h)] += 1;
        }
        let mean = hashes.len() as f64 / buckets as f64;
        let dof = (buckets - 1) as f64;
        let chi2: f64 = counts
            .iter()
            .map(|&c| (c as f64 - mean).powi(2) / mean)
            .sum();
        assert!(
            chi2 < dof + 8.0 * (2.0 * dof).sqrt(),
            "{what}: chi-square {chi2:.0} over {buckets} buckets (counts {:?}…)",
            &counts[..8]
        );
        let worst = counts
            .iter()
            .map(|&c| (c as f64 - mean).abs())
            .fold(0.0, f64::max);
        assert!(
            worst < 6.0 * mean.sqrt(),
            "{what}: a bucket {worst} away from the mean {mean}"
        );
    }

    /// The bits hashbrown and DashMap use: the low bits pick the bucket, the
    /// top 7 the control byte, the 3 below those the shard (8 shards).
    pub(crate) fn assert_spread(hashes: &[u64], what: &str) {
        assert_even(
            hashes,
            1024,
            |h| (h & 1023) as usize,
            &format!("{what}, low 10 bits"),
        );
        assert_even(
            hashes,
            128,
            |h| (h >> 57) as usize,
            &format!("{what}, top 7 bits"),
        );
        assert_even(
            hashes,
            8,
            |h| ((h << 7) >> 61) as usize,
            &format!("{what}, shard bits"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::testing::assert_spread;
    use super::*;

    #[test]
    fn every_builder_has_its_own_seed_and_each_is_deterministic() {
        let (a, b) = (KeyedHashBuilder::new(), KeyedHashBuilder::new());
        for n in 0..512u64 {
            assert_eq!(a.hash_one(n), a.hash_one(n), "same builder, same hash");
            assert_ne!(a.hash_one(n), b.hash_one(n), "{n}: two seeds, one hash");
        }
        assert_ne!((a.seed, a.multiplier), (b.seed, b.multiplier));
        assert_eq!(a.multiplier & 1, 1, "the multiplier is odd");
    }

    #[test]
    fn byte_strings_of_different_lengths_hash_apart() {
        let builder = KeyedHashBuilder::new();
        let hash = |bytes: &[u8]| {
            let mut h = builder.build_hasher();
            h.write(bytes);
            h.finish()
        };
        assert_ne!(hash(b"a"), hash(b"a\0"));
        assert_ne!(hash(b""), hash(&[0u8; 8]));
        assert_eq!(hash(b"0123456789"), hash(b"0123456789"));
    }

    #[test]
    fn urls_differing_in_one_place_spread() {
        let builder = KeyedHashBuilder::new();
        let hash = |url: String| {
            let mut h = builder.build_hasher();
            h.write(url.as_bytes());
            h.finish()
        };
        // Reads of one request: the same prefix, a counter in the path.
        let tags: Vec<u64> = (0..65_536)
            .map(|i| hash(format!("http://127.0.0.1:5000/v2/acme/app/manifests/t{i}")))
            .collect();
        assert_spread(&tags, "manifest URLs");
        let hosts: Vec<u64> = (0..65_536)
            .map(|i| hash(format!("registry-{i}.internal")))
            .collect();
        assert_spread(&hosts, "host names");
    }
}
