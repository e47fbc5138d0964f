//! A claim: one replica's report of one host's demand to Redis, and what
//! Redis grants it (`lua/claim.lua`, the only writer of a host's state).
//!
//! - **On Redis**, a host is one hash (`<prefix>:shares:<HOST:PORT>`; not
//!   `host:`, the per-read leases' sorted sets before, so replicas of both
//!   versions on one Redis during a rolling upgrade do not fail each
//!   other's calls with `WRONGTYPE`) with one field per replica:
//!   `"<has> <wants> <expires> <since>"` — the slots it holds, its demand
//!   (reads in flight and waiting) when it last reported, when the field
//!   lapses (`lease_ms` after that report; a crashed replica's slots free up
//!   then), and since when its demand has not been met (0: it has been). A
//!   replica reports what it has in use and what it wants, and Redis
//!   answers what it may hold, never letting the fields' sum pass the cap.
//! - **Allocation.** While every replica's demand fits under the cap, a
//!   claim gets its demand plus spare slots: at most `lease_block`, and at
//!   most half the room still free, so a newcomer always finds some. When
//!   the demands do not fit (or another replica is short), the claim is
//!   *busy*: it gets its fair share of the cap (water-filling over the
//!   demands: nobody gets more than they want, the rest is split evenly,
//!   rounded down, and the slots left over go one each to the replicas
//!   short the longest — so an odd slot, or a cap smaller than the replicas
//!   wanting it, turns round instead of staying with its holder) and no
//!   spare. A replica is never told to hold less than it has in use; it just
//!   takes no new slot until its reads have come down under its share.
//! - **Timed.** A claim carries its deadline on Redis's clock: one that
//!   Redis runs after it (queued behind a hung Redis) does nothing. Running
//!   one twice (a cluster client's retry after a lost reply) answers the
//!   same: it sets the replica's field absolutely.

use crate::backends::redis::backend::{down, RedisBackend};
use crate::backends::redis::lua::{ints, unexpected, Lua, Timed};
use crate::error::Unavailable;
use redis::{FromRedisValue, RedisResult, Value};
use std::sync::LazyLock;

/// `lua/claim.lua`.
pub(super) static CLAIM: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("../lua/claim.lua")));

/// What a replica reports of one host.
#[derive(Debug)]
pub(super) struct Claim<'a> {
    /// The host's hash.
    pub(super) key: &'a str,
    /// The replica's field.
    pub(super) holder: &'a str,
    /// The most the replica may have in use until the answer arrives:
    /// Redis goes on holding at least that many for it.
    pub(super) floor: u32,
    /// Its demand: reads in flight and waiting.
    pub(super) wants: u32,
    /// The host's cap.
    pub(super) cap: u32,
    /// Spare slots at most, beyond the demand.
    pub(super) block: u32,
}

/// What Redis granted a claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Grant {
    /// Slots the replica may have in use.
    pub(super) allowed: u32,
    /// Some replica's demand is not met: the cap is shared out.
    pub(super) busy: bool,
}

/// CLAIM's reply: `{allowed, busy, now_us}`, or `{-1, 0, now_us}` late.
#[derive(Debug)]
pub(super) struct ClaimReply {
    /// `None`: it ran past its deadline and did nothing.
    pub(super) grant: Option<Grant>,
    now_us: i64,
}

impl FromRedisValue for ClaimReply {
    fn from_redis_value(v: &Value) -> RedisResult<Self> {
        let [allowed, busy, now_us] = ints("CLAIM", v)?;
        let grant = match (allowed, busy) {
            (-1, 0) => None,
            (0.., 0 | 1) => Some(Grant {
                allowed: u32::try_from(allowed).map_err(|_| unexpected("CLAIM", v))?,
                busy: busy == 1,
            }),
            _ => return Err(unexpected("CLAIM", v)),
        };
        Ok(Self { grant, now_us })
    }
}

impl Timed for ClaimReply {
    fn late(&self) -> bool {
        self.grant.is_none()
    }
    fn redis_now_us(&self) -> i64 {
        self.now_us
    }
}

impl Claim<'_> {
    /// Sends the claim on `backend`, timed.
    pub(super) async fn send(&self, backend: &RedisBackend) -> Result<Grant, Unavailable> {
        let args = [
            i64::from(self.floor),
            i64::from(self.wants),
            i64::from(self.cap),
            i64::from(self.block),
            backend.lease().as_millis() as i64,
        ];
        let reply: ClaimReply = backend
            .timed_script(&CLAIM, self.key, Some(self.holder), &args)
            .await?;
        reply
            .grant
            .ok_or_else(|| down("the claim ran after its deadline"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(v: &[i64]) -> RedisResult<ClaimReply> {
        ClaimReply::from_redis_value(&Value::Array(v.iter().map(|n| Value::Int(*n)).collect()))
    }

    #[test]
    fn a_claims_reply_is_a_grant_or_late_and_nothing_else() {
        let grant = reply(&[3, 1, 42]).unwrap();
        assert_eq!(
            grant.grant,
            Some(Grant {
                allowed: 3,
                busy: true
            })
        );
        assert_eq!(grant.redis_now_us(), 42);
        assert!(reply(&[-1, 0, 7]).unwrap().late());
        for bad in [
            &[3, 2, 1][..],
            &[-2, 0, 1],
            &[-1, 1, 1],
            &[1, 0],
            &[1, 0, 1, 1],
        ] {
            assert!(reply(bad).is_err(), "{bad:?}");
        }
        assert!(reply(&[i64::from(u32::MAX) + 1, 0, 1]).is_err());
    }
}
