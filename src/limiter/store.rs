//! The in-process limiter's key store: one GCRA state per client IP.
//!
//! governor's own `DashMapStateStore` hashes keys with SipHash-1-3
//! (`std`'s `RandomState`). Client IPs are short, fixed-width keys, so this
//! store keeps the same `DashMap` of atomic states but hashes with
//! [`IpHashBuilder`]: a folded multiply keyed by 128 random bits per store.
//! Client IPs are chosen by the client, so the hash stays keyed (an attacker
//! who does not know the seed cannot aim many addresses at one bucket).
//!
//! The store also counts the keys it creates into the limiter's
//! [`SweepPacer`]: memory grows only by new keys, and every new key brings
//! the next idle-key sweep nearer at once.

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use governor::nanos::Nanos;
use governor::state::keyed::ShrinkableKeyedStateStore;
use governor::state::StateStore;
use std::cell::Cell;
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::net::IpAddr;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use super::CHECK_BATCH;

thread_local! {
    /// This thread's checks not yet counted towards a sweep. They may be any
    /// limiter's: a batch is credited to the limiter whose check completes
    /// it, which can only bring that limiter's sweep nearer. A check that
    /// created a key was counted at once and takes itself back out (so this
    /// may dip to -1).
    static UNCOUNTED: Cell<i32> = const { Cell::new(0) };
}

/// Counts checks down to the next idle-key sweep: a check that creates a key
/// at once, the others in per-thread batches of [`CHECK_BATCH`], so an
/// ordinary check writes no memory shared between threads.
#[derive(Debug)]
pub(super) struct SweepPacer {
    /// Checks left before the next sweep; about `i64::MAX` while one runs.
    until_sweep: AtomicI64,
}

impl SweepPacer {
    /// The first sweep is due after `first_after` checks.
    pub(super) fn new(first_after: u64) -> Self {
        Self {
            until_sweep: AtomicI64::new(clamp(first_after)),
        }
    }

    /// The check under way created a key: memory grew, so it counts now.
    fn key_created(&self) {
        UNCOUNTED.with(|uncounted| uncounted.set(uncounted.get() - 1));
        self.until_sweep.fetch_sub(1, Ordering::Relaxed);
    }

    /// Counts one check. True when a sweep is due and this caller is the
    /// one to run it (then it must call [`SweepPacer::swept`]).
    #[inline]
    pub(super) fn count_check(&self) -> bool {
        let batch_done = UNCOUNTED.with(|uncounted| {
            let n = uncounted.get() + 1;
            let done = n >= CHECK_BATCH as i32;
            uncounted.set(if done { 0 } else { n });
            done
        });
        let left = if batch_done {
            let batch = i64::from(CHECK_BATCH);
            self.until_sweep.fetch_sub(batch, Ordering::Relaxed) - batch
        } else {
            self.until_sweep.load(Ordering::Relaxed)
        };
        left <= 0
            && self
                .until_sweep
                .compare_exchange(left, i64::MAX, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// The sweep ran; the next is due after `gap` more checks.
    pub(super) fn swept(&self, gap: u64) {
        self.until_sweep.store(clamp(gap), Ordering::Relaxed);
    }

    /// Checks left before the next sweep (for tests).
    #[cfg(test)]
    fn left(&self) -> i64 {
        self.until_sweep.load(Ordering::Relaxed)
    }
}

fn clamp(checks: u64) -> i64 {
    checks.min(i64::MAX as u64 / 2) as i64
}

/// A client IP as the store's key. It hashes as one word for IPv4 (the
/// address, tagged above its 32 bits) and two for IPv6, where `IpAddr`'s own
/// `Hash` writes the variant first (one more multiply per hash).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ClientKey(pub(super) IpAddr);

impl Hash for ClientKey {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        match self.0 {
            IpAddr::V4(v4) => state.write_u64(u64::from(v4.to_bits()) | 1 << 32),
            IpAddr::V6(v6) => state.write_u128(v6.to_bits()),
        }
    }
}

/// governor's state per client IP, hashed with [`IpHashBuilder`].
pub(super) struct IpStore {
    map: DashMap<ClientKey, AtomicU64, IpHashBuilder>,
    pacer: Arc<SweepPacer>,
}

impl IpStore {
    /// An empty store with a fresh random seed; new keys count into `pacer`.
    pub(super) fn new(pacer: Arc<SweepPacer>) -> Self {
        Self {
            map: DashMap::with_hasher(IpHashBuilder::new()),
            pacer,
        }
    }
}

impl StateStore for IpStore {
    type Key = ClientKey;

    fn measure_and_replace<T, F, E>(&self, key: &ClientKey, f: F) -> Result<T, E>
    where
        F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
    {
        // The same two paths as governor's `DashMapStateStore`: a shared
        // lock for a known key, the shard's write lock to create one.
        if let Some(state) = self.map.get(key) {
            return measure_and_replace(&state, f);
        }
        let state = match self.map.entry(*key) {
            Entry::Occupied(known) => known.into_ref(),
            Entry::Vacant(new) => {
                self.pacer.key_created();
                new.insert(AtomicU64::new(0))
            }
        };
        measure_and_replace(&state, f)
    }
}

impl ShrinkableKeyedStateStore<ClientKey> for IpStore {
    fn retain_recent(&self, drop_below: Nanos) {
        // governor's rule: a state at or below `drop_below` is
        // indistinguishable from a fresh one.
        let drop_below = drop_below.as_u64();
        self.map.retain(|_, state| *state.get_mut() > drop_below);
    }

    fn shrink_to_fit(&self) {
        self.map.shrink_to_fit();
    }

    fn len(&self) -> usize {
        self.map.len()
    }

    fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// governor's `InMemoryState::measure_and_replace_one` (not public), on an
/// `AtomicU64` holding the theoretical arrival time in ns (0: fresh).
fn measure_and_replace<T, F, E>(state: &AtomicU64, f: F) -> Result<T, E>
where
    F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
{
    let mut prev = state.load(Ordering::Acquire);
    let mut decision = f(NonZeroU64::new(prev).map(|n| Nanos::from(n.get())));
    while let Ok((result, next)) = decision {
        match state.compare_exchange_weak(prev, next.as_u64(), Ordering::Release, Ordering::Relaxed)
        {
            Ok(_) => return Ok(result),
            Err(now) => prev = now,
        }
        decision = f(NonZeroU64::new(prev).map(|n| Nanos::from(n.get())));
    }
    decision.map(|(result, _)| result)
}

/// Builds [`IpHasher`]s keyed by 128 bits drawn from `std`'s `RandomState`
/// (a fresh seed per builder).
#[derive(Clone, Debug)]
pub(super) struct IpHashBuilder {
    seed: u64,
    multiplier: u64,
}

impl IpHashBuilder {
    /// A builder with a fresh random seed.
    pub(super) fn new() -> Self {
        // `RandomState` is SipHash under random keys: its hashes of two fixed
        // words are two secret, independent-looking 64-bit values.
        let random = RandomState::new();
        Self {
            seed: random.hash_one(0x243f_6a88_85a3_08d3_u64),
            multiplier: random.hash_one(0x1319_8a2e_0370_7344_u64) | 1,
        }
    }
}

impl BuildHasher for IpHashBuilder {
    type Hasher = IpHasher;

    fn build_hasher(&self) -> IpHasher {
        IpHasher {
            acc: self.seed,
            multiplier: self.multiplier,
        }
    }
}

/// A keyed folded-multiply hasher for short fixed-width keys: the state
/// starts at the seed, each word written is mixed in as
/// `fold(state ^ word, multiplier)`, where `fold` XORs the two halves of the
/// 128-bit product, and `finish` folds once more. An `IpAddr` is two words
/// (a [`ClientKey`]: one for IPv4, two for IPv6).
#[derive(Clone, Debug)]
pub(super) struct IpHasher {
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

impl IpHasher {
    #[inline]
    fn mix(&mut self, word: u64) {
        self.acc = fold(self.acc ^ word, self.multiplier);
    }
}

impl Hasher for IpHasher {
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
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn v4(n: u32) -> ClientKey {
        ClientKey(IpAddr::V4(Ipv4Addr::from(n)))
    }

    fn v6(n: u128) -> ClientKey {
        ClientKey(IpAddr::V6(Ipv6Addr::from(n)))
    }

    /// Counts of `hashes` in `buckets` buckets chosen by `bucket`, against
    /// a uniform spread: the chi-square statistic and every single count must
    /// stay within bounds a fair hash crosses with a chance below 1e-6.
    fn assert_even(hashes: &[u64], buckets: usize, bucket: impl Fn(u64) -> usize, what: &str) {
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
    fn assert_spread(hashes: &[u64], what: &str) {
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

    #[test]
    fn sequential_addresses_spread_over_buckets_control_bytes_and_shards() {
        let builder = IpHashBuilder::new();
        // What an attacker without the seed would try first: consecutive
        // addresses, a /16 of IPv4 and the bottom of one IPv6 /64, and
        // addresses differing only in their high bits.
        let v4s: Vec<u64> = (0..65_536u32)
            .map(|i| builder.hash_one(v4(0x0a00_0000 | i)))
            .collect();
        assert_spread(&v4s, "10.0.0.0/16");
        let v6s: Vec<u64> = (0..65_536u128)
            .map(|i| builder.hash_one(v6((0x2001_0db8_u128 << 96) | i)))
            .collect();
        assert_spread(&v6s, "2001:db8::/112");
        let high: Vec<u64> = (0..65_536u128)
            .map(|i| builder.hash_one(v6((i << 112) | 1)))
            .collect();
        assert_spread(&high, "top 16 bits of IPv6");
    }

    #[test]
    fn every_builder_has_its_own_seed_and_each_is_deterministic() {
        let (a, b) = (IpHashBuilder::new(), IpHashBuilder::new());
        let ips: Vec<ClientKey> = (0..256u32).map(v4).chain((0..256u128).map(v6)).collect();
        for ip in &ips {
            assert_eq!(a.hash_one(ip), a.hash_one(ip), "same builder, same hash");
            assert_ne!(
                a.hash_one(ip),
                b.hash_one(ip),
                "{ip:?}: two seeds, one hash"
            );
        }
        // `IpAddr`'s own `Hash` (variant, then address) works too.
        let ip = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
        assert_eq!(a.hash_one(ip), a.hash_one(ip));
        assert_ne!(a.hash_one(ip), b.hash_one(ip));
        assert_ne!((a.seed, a.multiplier), (b.seed, b.multiplier));
        assert_eq!(a.multiplier & 1, 1, "the multiplier is odd");
    }

    #[test]
    fn byte_strings_of_different_lengths_hash_apart() {
        let builder = IpHashBuilder::new();
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
    fn ipv4_and_its_mapped_ipv6_form_are_separate_keys() {
        let pacer = Arc::new(SweepPacer::new(100));
        let store = IpStore::new(pacer.clone());
        let ip = Ipv4Addr::new(192, 0, 2, 1);
        for key in [
            IpAddr::V4(ip),
            IpAddr::V6(ip.to_ipv6_mapped()),
            IpAddr::V4(ip),
        ]
        .map(ClientKey)
        {
            let _: Result<(), ()> =
                store.measure_and_replace(&key, |_| Ok(((), Nanos::from(1_000u64))));
        }
        assert_eq!(store.len(), 2);
        // Two new keys brought the sweep two nearer; the known one did not.
        assert_eq!(pacer.left(), 98);
    }

    #[test]
    fn retain_recent_drops_states_at_or_below_the_mark() {
        let store = IpStore::new(Arc::new(SweepPacer::new(100)));
        for (n, tat) in [(1u32, 10u64), (2, 20), (3, 30)] {
            let _: Result<(), ()> = store.measure_and_replace(&v4(n), |prev| {
                assert_eq!(prev, None, "a new key starts fresh");
                Ok(((), Nanos::from(tat)))
            });
        }
        let _: Result<(), ()> = store.measure_and_replace(&v4(3), |prev| {
            assert_eq!(prev, Some(Nanos::from(30u64)), "a known key's state");
            Ok(((), Nanos::from(31u64)))
        });
        store.retain_recent(Nanos::from(20u64));
        assert_eq!(store.len(), 1);
        assert!(store.map.contains_key(&v4(3)));
        store.shrink_to_fit();
        store.retain_recent(Nanos::from(31u64));
        assert!(store.is_empty());
    }
}
