//! Hash seeds for the maps whose keys clients choose: the de-duplication
//! table (URLs), the parsed-document cache (query texts), the limiter's
//! key store (client addresses) and the host caps' in-flight counts (hosts
//! redirects name).
//!
//! The hasher is foldhash's (fast, not steerable without its seed). Its seeds
//! are drawn from `std`'s `RandomState` — keyed by the operating system's
//! randomness — rather than foldhash's own process seed (addresses and the
//! time): one shared seed per process, and a fresh per-map seed for every map.

use foldhash::fast::SeedableRandomState;
use foldhash::SharedSeed;
use std::hash::{BuildHasher, RandomState};
use std::sync::OnceLock;

/// A hasher builder with a fresh random seed, for one map.
pub(crate) fn random_state() -> SeedableRandomState {
    static SHARED: OnceLock<SharedSeed> = OnceLock::new();
    let shared =
        SHARED.get_or_init(|| SharedSeed::from_u64(RandomState::new().hash_one(0x5eed_u64)));
    SeedableRandomState::with_seed(RandomState::new().hash_one(0x5eed_u64), shared)
}

#[cfg(test)]
mod tests {
    use super::random_state;
    use std::hash::BuildHasher;

    #[test]
    fn every_map_hashes_its_own_way() {
        let (a, b) = (random_state(), random_state());
        let keys: Vec<String> = (0..256)
            .map(|i| format!("http://registry/v2/r{i}/manifests/latest"))
            .collect();
        let same = keys
            .iter()
            .filter(|k| a.hash_one(k) == b.hash_one(k))
            .count();
        assert_eq!(same, 0, "two maps, one hash");
        assert!(keys.iter().all(|k| a.hash_one(k) == a.hash_one(k)));
    }
}
