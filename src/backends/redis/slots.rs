//! A Redis Cluster's slots: which slot a key hashes to, which master serves
//! which slots (`CLUSTER SLOTS`), and a key of ours that lands on a given
//! master. Pure functions, no connection: the connection (`conn`) routes
//! by them and the clocks (`clocks`) keep an offset per slot.

use redis::{ErrorKind, RedisResult, Value};

/// Slots of a Redis Cluster.
pub(super) const SLOTS: usize = 16_384;

/// A range of slots, first and last included.
pub(super) type Range = (u16, u16);

/// The cluster slot of `key`, as Redis computes it: CRC16 (XMODEM) of the
/// key's hash tag — what is between its first `{` and the next `}`, if not
/// empty — or of the whole key, modulo 16,384.
pub(super) fn slot(key: &[u8]) -> usize {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let len = rest.iter().position(|&b| b == b'}')?;
            (len > 0).then(|| &rest[..len])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &byte in hashed {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    usize::from(crc) % SLOTS
}

/// `CLUSTER SLOTS`' ranges, grouped by the master serving them.
pub(super) fn ranges_by_master(reply: &Value) -> RedisResult<Vec<Vec<Range>>> {
    let rows: Vec<Vec<Value>> = redis::from_redis_value(reply)?;
    let mut masters: std::collections::BTreeMap<(String, i64), Vec<Range>> = Default::default();
    for row in rows {
        let [first, last, master, ..] = row.as_slice() else {
            return Err((ErrorKind::TypeError, "a CLUSTER SLOTS row").into());
        };
        let node: Vec<Value> = redis::from_redis_value(master)?;
        let [host, port, ..] = node.as_slice() else {
            return Err((ErrorKind::TypeError, "a CLUSTER SLOTS node").into());
        };
        let address = (
            redis::from_redis_value(host)?,
            redis::from_redis_value(port)?,
        );
        let range: Range = (
            redis::from_redis_value(first)?,
            redis::from_redis_value(last)?,
        );
        if range.0 > range.1 || usize::from(range.1) >= SLOTS {
            return Err((ErrorKind::TypeError, "a CLUSTER SLOTS range").into());
        }
        masters.entry(address).or_default().push(range);
    }
    Ok(masters.into_values().collect())
}

/// The first of `key(0)`, `key(1)`, … whose slot is in one of `ranges`;
/// `None` when none is (a hash tag in the key prefix puts every key in one
/// slot).
pub(super) fn key_in(ranges: &[Range], key: impl Fn(u32) -> String) -> Option<String> {
    (0..1u32 << 16).map(key).find(|key| {
        let slot = slot(key.as_bytes());
        ranges
            .iter()
            .any(|&(first, last)| (usize::from(first)..=usize::from(last)).contains(&slot))
    })
}

#[cfg(test)]
mod tests {
    use super::{key_in, slot};

    #[test]
    fn slots_are_redis_cluster_slots() {
        // What CLUSTER KEYSLOT answers on redis-server 7.0.
        for (key, want) in [
            (&b"123456789"[..], 12_739),
            (b"foo", 12_182),
            (b"bar", 5_061),
            // A hash tag: only what is between the first `{` and the next `}`.
            (b"{user1000}.following", 3_443),
            (b"user1000", 3_443),
            (b"a{user1000}b{x}", 3_443),
            // An empty or unclosed tag: the whole key.
            (b"foo{}{bar}", 8_363),
            (b"foo{bar", 15_278),
        ] {
            assert_eq!(slot(key), want, "{}", String::from_utf8_lossy(key));
        }
    }

    #[test]
    fn a_key_in_a_masters_slots_is_found_unless_a_tag_pins_every_key() {
        let key = key_in(&[(0, 100)], |n| format!("fanout:probe:{n}")).unwrap();
        assert!(slot(key.as_bytes()) <= 100, "{key}");
        // `{foo}` hashes to 12,182: never in 0..=100.
        assert_eq!(key_in(&[(0, 100)], |n| format!("{{foo}}:probe:{n}")), None);
    }
}
