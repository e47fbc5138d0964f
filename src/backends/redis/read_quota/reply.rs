//! The script's side: `lua/quota.lua` and its typed reply.

use super::super::lua::{ints, unexpected, Lua, Timed};
use redis::{FromRedisValue, RedisResult, Value};
use std::sync::LazyLock;
use std::time::Duration;

/// `lua/quota.lua`.
pub(super) static QUOTA: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("../lua/quota.lua")));

/// What the script did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    /// `granted` reads taken: the reservation's and those ahead.
    Granted { granted: u64 },
    /// Refused, nothing taken; what was asked fits in `wait`.
    Refused { wait: Duration },
    /// It ran past its deadline and did nothing.
    Late,
}

/// The script's reply: `{status, granted, wait_us, full_in_us, now_us}`
/// (`lua/quota.lua`).
#[derive(Debug)]
pub(super) struct QuotaReply {
    pub(super) outcome: Outcome,
    /// Until the client's bucket is full again, after the call.
    pub(super) full_in: Duration,
    pub(super) now_us: i64,
}

impl FromRedisValue for QuotaReply {
    fn from_redis_value(v: &Value) -> RedisResult<Self> {
        let [status, granted, wait_us, full_in_us, now_us] = ints("QUOTA", v)?;
        let us = |n: i64| Duration::from_micros(n.max(0) as u64);
        let outcome = match status {
            -1 => Outcome::Late,
            0 => Outcome::Refused { wait: us(wait_us) },
            1 if granted >= 0 => Outcome::Granted {
                granted: granted as u64,
            },
            _ => return Err(unexpected("QUOTA", v)),
        };
        Ok(Self {
            outcome,
            full_in: us(full_in_us),
            now_us,
        })
    }
}

impl Timed for QuotaReply {
    fn late(&self) -> bool {
        self.outcome == Outcome::Late
    }
    fn redis_now_us(&self) -> i64 {
        self.now_us
    }
}
