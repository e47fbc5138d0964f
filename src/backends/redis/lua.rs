//! The Lua scripts (`lua/*.lua`) and their replies.
//!
//! A [`Lua`] is sent by its hash (`EVALSHA`); a node that does not have it
//! yet (a fresh server, a promoted replica) gets its text once (`EVAL`,
//! routed by the same key, which caches it there), never a `SCRIPT LOAD`,
//! which a cluster client would send to every node, a dead one included.
//! Every script touches exactly one key, `KEYS[1]`, so it runs whole on the
//! master owning that key's slot.
//!
//! Each script's reply has a type on this side, parsed by
//! [`FromRedisValue`] with an error for any other shape: [`RedisTime`]
//! here (`TIME`, `NODE_TIME`), the per-IP check's and the claim's beside
//! the code that sends them. A script that checks its deadline answers a
//! [`Timed`] reply.

use redis::aio::ConnectionLike;
use redis::{ErrorKind, FromRedisValue, RedisResult, Script, Value};

/// `lua/node_time.lua`: the `TIME` of the node that runs it.
pub(super) const NODE_TIME: &str = include_str!("lua/node_time.lua");

/// A Lua script and its hash.
#[derive(Debug)]
pub(super) struct Lua {
    code: &'static str,
    hash: String,
}

impl Lua {
    /// The script `code` (an `include_str!` of `lua/`).
    pub(super) fn new(code: &'static str) -> Self {
        let hash = Script::new(code).get_hash().to_string();
        Self { code, hash }
    }

    /// Runs the script on `key` with an optional string argument first, then
    /// `ints`: by hash, and by text on a node that lacks it.
    pub(super) async fn run<T: FromRedisValue>(
        &self,
        conn: &mut impl ConnectionLike,
        key: &str,
        holder: Option<&str>,
        ints: &[i64],
    ) -> RedisResult<T> {
        let invocation = |eval: &str, body: &str| {
            let mut cmd = redis::cmd(eval);
            cmd.arg(body).arg(1).arg(key);
            if let Some(holder) = holder {
                cmd.arg(holder);
            }
            for arg in ints {
                cmd.arg(*arg);
            }
            cmd
        };
        match invocation("EVALSHA", &self.hash)
            .query_async(&mut *conn)
            .await
        {
            Err(e) if e.kind() == ErrorKind::NoScriptError => {
                invocation("EVAL", self.code).query_async(conn).await
            }
            answer => answer,
        }
    }
}

/// The reply of a script that checks its deadline: whether it ran past it
/// (and so did nothing), and Redis's time when it ran (µs).
pub(super) trait Timed: FromRedisValue {
    /// It ran past its deadline and did nothing.
    fn late(&self) -> bool;
    /// Redis's time when it ran, µs.
    fn redis_now_us(&self) -> i64;
}

/// Redis time, µs: `TIME`'s `[seconds, microseconds]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct RedisTime(pub(super) i64);

impl FromRedisValue for RedisTime {
    fn from_redis_value(v: &Value) -> RedisResult<Self> {
        let parts: Vec<i64> = redis::from_redis_value(v)?;
        match parts.as_slice() {
            [secs, micros] if *secs >= 0 && (0..1_000_000).contains(micros) => {
                Ok(Self(secs * 1_000_000 + micros))
            }
            _ => Err(unexpected("TIME", v)),
        }
    }
}

/// A script's reply of exactly `N` integers.
pub(super) fn ints<const N: usize>(script: &'static str, v: &Value) -> RedisResult<[i64; N]> {
    let Value::Array(items) = v else {
        return Err(unexpected(script, v));
    };
    let ints = items
        .iter()
        .map(|item| match item {
            Value::Int(n) => Ok(*n),
            _ => Err(unexpected(script, v)),
        })
        .collect::<RedisResult<Vec<i64>>>()?;
    ints.try_into().map_err(|_| unexpected(script, v))
}

/// The error for a reply of a shape `script` never answers.
pub(super) fn unexpected(script: &'static str, v: &Value) -> redis::RedisError {
    (
        ErrorKind::TypeError,
        "an unexpected reply",
        format!("{script}: {v:?}"),
    )
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn time_is_two_numbers() {
        let time = Value::Array(vec![bulk("1700000000"), bulk("123456")]);
        assert_eq!(
            RedisTime::from_redis_value(&time).unwrap(),
            RedisTime(1_700_000_000_123_456)
        );
        for bad in [
            Value::Array(vec![bulk("1700000000")]),
            Value::Array(vec![bulk("1"), bulk("2"), bulk("3")]),
            Value::Array(vec![bulk("1"), bulk("1000000")]),
            Value::Int(5),
        ] {
            assert!(RedisTime::from_redis_value(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_reply_of_n_integers_has_exactly_n() {
        let three = Value::Array(vec![Value::Int(1), Value::Int(0), Value::Int(9)]);
        assert_eq!(ints::<3>("CLAIM", &three).unwrap(), [1, 0, 9]);
        let err = ints::<4>("GCRA", &three).unwrap_err();
        assert!(err.to_string().contains("GCRA"), "{err}");
        let text = Value::Array(vec![Value::Int(1), bulk("0"), Value::Int(9)]);
        assert!(ints::<3>("CLAIM", &text).is_err());
        assert!(ints::<3>("CLAIM", &Value::Nil).is_err());
    }
}
