//! Redis time, not wall clocks: [`Clocks`] keeps the offset between the
//! local monotonic clock and the clock of each Redis node, and puts a
//! call's deadline on the clock of the node that runs it.
//!
//! - Each reply carries Redis `TIME`, read by the script itself on the node
//!   that ran it; that time minus the local (monotonic, tokio) instant the
//!   reply arrived is a lower bound of the offset between the two clocks,
//!   since the script ran before its reply arrived. A call's local deadline
//!   plus that offset is a deadline on Redis's clock never later than the
//!   real one, so clock skew between replicas and Redis does not matter;
//!   only drift between two replies does (microseconds), and a step of
//!   Redis's clock is corrected by the next reply (until then a deadline is
//!   off by the step; a step forward of more than `lease_ms` less
//!   `refresh_ms` also lapses host shares early).
//! - In a cluster each master has its own clock, and an offset is a lower
//!   bound only for the node it was learned from. So the offset is kept per
//!   slot (16,384 of them) and used for calls on that slot, which that
//!   slot's master runs. It is learned from every reply for a key in the
//!   slot, and for all of a master's slots at once from its `TIME` when the
//!   backend connects and at each probe (`conn`) — so after a failover the
//!   breaker closes only with the promoted master's clock learned for the
//!   slots it took over. A slot that moves with no failed call (a manual
//!   failover, resharding) is served by another clock until its first reply
//!   there, and meanwhile its deadline is off by the two masters' skew
//!   (milliseconds under NTP). Too early, the script refuses as "late" a
//!   call that ran in time — a late answer that arrives before the local
//!   deadline proves exactly that, so the backend sends it once more with
//!   the corrected offset (`RedisBackend::timed_script`). Too late, it is a
//!   call queued behind a hung Redis, which its script's deadline check and
//!   the breaker cover.

use super::slots::{slot, Range, SLOTS};
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
use tokio::time::Instant;

/// No reply yet.
const UNKNOWN: i64 = i64::MIN;

/// The clock offsets of one backend's nodes: one for a server, one per slot
/// for a cluster.
#[derive(Debug)]
pub(super) struct Clocks {
    /// Local instants are measured from here.
    base: Instant,
    /// Redis `TIME` (µs) minus local µs since `base`, a lower bound;
    /// `UNKNOWN` before the first reply.
    offsets_us: Box<[AtomicI64]>,
}

impl Clocks {
    /// The clock of one server.
    pub(super) fn server() -> Self {
        Self::with(1)
    }

    /// The clocks of a cluster's masters, by slot.
    pub(super) fn cluster() -> Self {
        Self::with(SLOTS)
    }

    fn with(offsets: usize) -> Self {
        Self {
            base: Instant::now(),
            offsets_us: (0..offsets).map(|_| AtomicI64::new(UNKNOWN)).collect(),
        }
    }

    /// The offset for the node that runs calls on `key` (any key on one
    /// server); `None` for a keyless call to a cluster (its node unknown).
    fn offset(&self, key: Option<&str>) -> Option<&AtomicI64> {
        match (self.offsets_us.len(), key) {
            (1, _) => self.offsets_us.first(),
            (_, Some(key)) => self.offsets_us.get(slot(key.as_bytes())),
            (_, None) => None,
        }
    }

    /// `local` on the clock of the node that runs calls on `key` (µs; 0,
    /// "none", before that node has answered for it once).
    pub(super) fn deadline(&self, key: &str, local: Instant) -> i64 {
        match self.offset(Some(key)).map(|o| o.load(Relaxed)) {
            None | Some(UNKNOWN) => 0,
            Some(offset) => self.micros(local) + offset,
        }
    }

    /// Learns the offset of the node that ran a call on `key` (`None`: the
    /// server's) from its reply's Redis time (µs), received now.
    pub(super) fn observe(&self, key: Option<&str>, redis_us: i64) {
        if let Some(offset) = self.offset(key) {
            offset.store(redis_us - self.micros(Instant::now()), Relaxed);
        }
    }

    /// Learns the offset of every slot in `ranges` — one master's — from
    /// its Redis time (µs), received now.
    pub(super) fn observe_master(&self, ranges: &[Range], redis_us: i64) {
        let offset = redis_us - self.micros(Instant::now());
        for &(first, last) in ranges {
            let slots = self.offsets_us.get(usize::from(first)..=usize::from(last));
            for slot in slots.into_iter().flatten() {
                slot.store(offset, Relaxed);
            }
        }
    }

    fn micros(&self, at: Instant) -> i64 {
        at.saturating_duration_since(self.base).as_micros() as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_deadline_is_the_local_one_plus_the_learned_offset() {
        let clocks = Clocks::server();
        let local = Instant::now() + Duration::from_millis(100);
        assert_eq!(clocks.deadline("any", local), 0, "none before a reply");
        clocks.observe(None, 5_000_000);
        // Redis said 5 s at local 0: the deadline is 5.1 s on its clock.
        assert_eq!(clocks.deadline("k", local), 5_100_000);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cluster_keeps_an_offset_per_slot() {
        let clocks = Clocks::cluster();
        let local = Instant::now();
        // "foo" is in slot 12,182, "bar" in 5,061 (CLUSTER KEYSLOT).
        clocks.observe(None, 7);
        assert_eq!(clocks.deadline("foo", local), 0, "a keyless reply: no node");
        clocks.observe_master(&[(12_000, 12_200)], 1_000);
        assert_eq!(clocks.deadline("foo", local), 1_000);
        assert_eq!(clocks.deadline("bar", local), 0, "another master's slot");
        clocks.observe(Some("bar"), 2_000);
        assert_eq!(clocks.deadline("bar", local), 2_000);
        assert_eq!(clocks.deadline("foo", local), 1_000);
    }
}
