//! Redis time, not wall clocks: the deadlines a call carries on the clock of
//! the node that runs it, and the clock offsets they come from.
//!
//! - Each reply carries Redis `TIME`, read by the script itself on the node that ran it; that time minus the local
//!   (monotonic, tokio) instant the reply arrived is a lower bound of the
//!   offset between the two clocks, since the script ran before its reply
//!   arrived. A call's local deadline plus that offset is a deadline on
//!   Redis's clock never later than the real one, so clock skew between
//!   replicas and Redis does not matter; only drift between two replies does
//!   (microseconds), and a step of Redis's clock is corrected by the next
//!   reply (until then a deadline is off by the step; a step forward of
//!   more than `lease_ms` less `refresh_ms` also lapses host shares early).
//! - In a cluster each master has its own clock,
//!   and an offset is a lower bound only for the node it was learned from. So
//!   the offset is kept per slot (16,384 of them) and used for calls on that
//!   slot, which that slot's master runs. It is learned from every reply for
//!   a key in the slot, and for all of a master's slots at once from its
//!   `TIME` when the backend connects and at each probe — so after a
//!   failover the breaker closes only with the promoted master's clock
//!   learned for the slots it took over. A slot that moves with no failed
//!   call (a manual failover, resharding) is served by another clock until
//!   its first reply there, and meanwhile its deadline is off by the two
//!   masters' skew (milliseconds under NTP). Too early, the script refuses
//!   as "late" a call that ran in time — a late answer that arrives before
//!   the local deadline proves exactly that, so the call is sent once more
//!   with the corrected offset. Too late, it is a call queued behind a hung
//!   Redis, which its script's deadline check and the breaker cover.

use super::conn::{slot, slot_ranges_by_master, Conn, Target, NODE_TIME};
use super::{Failure, Lua, RedisBackend, Route, UNKNOWN};
use redis::{ErrorKind, FromRedisValue, RedisResult, Value};
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
use tokio::time::Instant;

/// The reply of a script that checks its deadline: whether it ran past it
/// (and so did nothing), and Redis's time when it ran (µs).
pub(crate) trait Timed: FromRedisValue {
    fn late(&self) -> bool;
    fn redis_now_us(&self) -> i64;
}

/// `{status, _, now_us}`, status -1: late.
impl Timed for (i64, i64, i64) {
    fn late(&self) -> bool {
        self.0 == -1
    }
    fn redis_now_us(&self) -> i64 {
        self.2
    }
}

/// `{status, _, _, now_us}`, status -1: late.
impl Timed for (i64, i64, i64, i64) {
    fn late(&self) -> bool {
        self.0 == -1
    }
    fn redis_now_us(&self) -> i64 {
        self.3
    }
}

impl RedisBackend {
    /// The clock offset for the node that runs calls on `key` (any key on
    /// one server); `None` for a keyless call to a cluster (its node unknown).
    fn offset(&self, key: Option<&str>) -> Option<&AtomicI64> {
        match (&self.inner.target, key) {
            (Target::Server(_), _) => self.inner.offsets_us.first(),
            (Target::Cluster(_), Some(key)) => self.inner.offsets_us.get(slot(key.as_bytes())),
            (Target::Cluster(_), None) => None,
        }
    }

    /// `local` on the clock of the node that runs calls on `key` (µs; 0,
    /// "none", before that node has answered for it once).
    pub(crate) fn redis_deadline(&self, key: &str, local: Instant) -> i64 {
        match self.offset(Some(key)).map(|o| o.load(Relaxed)) {
            None | Some(UNKNOWN) => 0,
            Some(offset) => self.micros(local) + offset,
        }
    }

    pub(super) fn micros(&self, at: Instant) -> i64 {
        at.saturating_duration_since(self.inner.base).as_micros() as i64
    }

    /// Learns the clock offset of the node that ran a call on `key` from its
    /// reply's Redis time (µs), received now.
    pub(crate) fn observe(&self, key: Option<&str>, redis_us: i64) {
        if let Some(offset) = self.offset(key) {
            offset.store(redis_us - self.micros(Instant::now()), Relaxed);
        }
    }

    /// Asks every master serving slots for its time: `CLUSTER SLOTS` from any
    /// node, then to each master a script returning its `TIME`, sent with a
    /// key of one of its slots (so the client's routing, redirects included,
    /// takes it there, as it takes the checks). Each answer sets the clock
    /// offset of every slot that master serves. `Ok` only when every master
    /// answered: a master down or not yet replaced fails it.
    pub(super) async fn learn_cluster_clocks(&self, conn: &mut Conn) -> RedisResult<()> {
        let slots: Value = redis::cmd("CLUSTER").arg("SLOTS").query_async(conn).await?;
        let masters = slot_ranges_by_master(&slots)?;
        if masters.is_empty() {
            return Err((ErrorKind::ClusterDown, "no master serves slots").into());
        }
        let asks = masters.iter().filter_map(|ranges| {
            // None: a hash tag in key_prefix keeps every key off this master.
            let key = self.key_in(ranges)?;
            let mut conn = conn.clone();
            Some(async move {
                let (secs, micros): (i64, i64) = redis::cmd("EVAL")
                    .arg(NODE_TIME)
                    .arg(1)
                    .arg(&key)
                    .query_async(&mut conn)
                    .await?;
                let offset = secs * 1_000_000 + micros - self.micros(Instant::now());
                for &(first, last) in ranges {
                    for slot in &self.inner.offsets_us[usize::from(first)..=usize::from(last)] {
                        slot.store(offset, Relaxed);
                    }
                }
                RedisResult::Ok(())
            })
        });
        futures::future::try_join_all(asks).await?;
        Ok(())
    }

    /// A key under the prefix whose slot is in one of `ranges`; `None` when
    /// none is (a hash tag in the prefix puts every key in one slot).
    fn key_in(&self, ranges: &[(u16, u16)]) -> Option<String> {
        (0..1u32 << 16)
            .map(|n| self.key("probe", &n.to_string()))
            .find(|key| {
                let slot = slot(key.as_bytes());
                ranges
                    .iter()
                    .any(|&(first, last)| (usize::from(first)..=usize::from(last)).contains(&slot))
            })
    }

    /// Runs a script that checks its deadline — its last argument, the
    /// deadline on Redis's clock, appended to `ints` — on `key` by
    /// [`Route::Call`], bounded by `timeout_ms`, and learns the clock offset
    /// from its reply. A "late" reply that arrives before the local deadline
    /// ran in time, did nothing and shows the offset was wrong (the slot moved
    /// to a master with another clock, or Redis's clock stepped): it is sent
    /// once more with the corrected deadline.
    pub(crate) async fn timed_script<T: Timed>(
        &self,
        script: &Lua,
        key: &str,
        holder: Option<&str>,
        ints: &[i64],
    ) -> Result<T, Failure> {
        let local = self.local_deadline();
        let mut args = ints.to_vec();
        args.push(0);
        let mut tries = 0;
        loop {
            tries += 1;
            *args.last_mut().expect("the deadline") = self.redis_deadline(key, local);
            let reply: T = self
                .script(Route::Call, local, script, key, holder, &args)
                .await?;
            self.observe(Some(key), reply.redis_now_us());
            if !reply.late() || tries == 2 || Instant::now() >= local {
                return Ok(reply);
            }
        }
    }
}
