//! The in-process limiter's key store: one GCRA state per client IP.
//!
//! governor's own `DashMapStateStore` hashes keys with SipHash-1-3
//! (`std`'s `RandomState`). Client IPs are short, fixed-width keys, so this
//! store keeps the same `DashMap` of atomic states but hashes with
//! [`KeyedHashBuilder`]: a folded multiply keyed by 128 random bits per store.
//! Client IPs are chosen by the client, so the hash stays keyed (an attacker
//! who does not know the seed cannot aim many addresses at one bucket).
//!
//! The store also counts the keys it creates into the limiter's
//! [`SweepPacer`]: memory grows only by new keys, and every new key brings
//! the next idle-key sweep nearer at once.

use crate::hash::KeyedHashBuilder;
use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use governor::nanos::Nanos;
use governor::state::keyed::ShrinkableKeyedStateStore;
use governor::state::StateStore;
use std::cell::Cell;
use std::hash::{Hash, Hasher};
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

/// governor's state per client IP, hashed with [`KeyedHashBuilder`].
pub(super) struct IpStore {
    map: DashMap<ClientKey, AtomicU64, KeyedHashBuilder>,
    pacer: Arc<SweepPacer>,
}

impl IpStore {
    /// An empty store with a fresh random seed; new keys count into `pacer`.
    pub(super) fn new(pacer: Arc<SweepPacer>) -> Self {
        Self {
            map: DashMap::with_hasher(KeyedHashBuilder::new()),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::testing::assert_spread;
    use std::hash::BuildHasher;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn v4(n: u32) -> ClientKey {
        ClientKey(IpAddr::V4(Ipv4Addr::from(n)))
    }

    fn v6(n: u128) -> ClientKey {
        ClientKey(IpAddr::V6(Ipv6Addr::from(n)))
    }

    #[test]
    fn sequential_addresses_spread_over_buckets_control_bytes_and_shards() {
        let builder = KeyedHashBuilder::new();
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
    fn every_store_hashes_an_address_its_own_way() {
        let (a, b) = (KeyedHashBuilder::new(), KeyedHashBuilder::new());
        let ips: Vec<ClientKey> = (0..256u32).map(v4).chain((0..256u128).map(v6)).collect();
        for ip in &ips {
            assert_eq!(a.hash_one(ip), a.hash_one(ip), "same builder, same hash");
            assert_ne!(
                a.hash_one(ip),
                b.hash_one(ip),
                "{ip:?}: two seeds, one hash"
            );
        }
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
