//! The claim script and the pools on a real `redis-server` (each test skips
//! without one): the helpers; the tests in `claims` and `pools`.

use super::claim::{ClaimReply, Grant, CLAIM};
use super::pool::Waiting;
use super::*;
use crate::backends::redis::backend::Route;
use crate::config::RedisConfig;
use fanout_testkit::RedisServer;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

const HOST: &str = "h:1";

async fn redis_time_us(redis: &RedisServer) -> i64 {
    let Some(redis::Value::Array(parts)) = redis.command(&["TIME"]).await else {
        panic!("TIME");
    };
    let parts: Vec<i64> = parts
        .into_iter()
        .map(|p| match p {
            redis::Value::BulkString(b) => String::from_utf8(b).unwrap().parse().unwrap(),
            other => panic!("TIME part {other:?}"),
        })
        .collect();
    parts[0] * 1_000_000 + parts[1]
}

/// Slots held on Redis for `key`: the sum of its fields' `has`.
async fn held(redis: &RedisServer, key: &str) -> u32 {
    redis.slots_held(key).await
}

fn config(redis: &RedisServer) -> RedisConfig {
    RedisConfig {
        url: redis.url(),
        timeout_ms: 1_000,
        lease_ms: 30_000,
        ..RedisConfig::default()
    }
}

/// Caps on `redis` for host `h:1` with `cap` and `config`.
fn caps(config: &RedisConfig, cap: u32) -> RedisHostCaps {
    let host = HostConfig {
        max_concurrent: cap,
        acquire_wait_ms: 200,
        ..Default::default()
    };
    let hosts = BTreeMap::from([(HOST.to_string(), host)]);
    RedisHostCaps::new(hosts, RedisBackend::new(config).unwrap())
}

/// A server and a backend on it; `None` without `redis-server`.
async fn setup() -> Option<(RedisServer, RedisBackend, String)> {
    let redis = RedisServer::start().await?;
    let backend = RedisBackend::new(&config(&redis)).unwrap();
    let key = backend.key("shares", HOST);
    Some((redis, backend, key))
}

/// Runs CLAIM for `holder`: {allowed, busy}; `deadline_us` on Redis's clock.
async fn claim(
    backend: &RedisBackend,
    key: &str,
    holder: &str,
    [in_use, wants, cap, block]: [i64; 4],
    deadline_us: i64,
) -> (i64, i64) {
    let local = Instant::now() + Duration::from_secs(5);
    let args = [in_use, wants, cap, block, 30_000, deadline_us];
    let call = backend.script(Route::Call, local, &CLAIM, key, Some(holder), &args);
    let reply: ClaimReply = call.await.expect("redis answers");
    match reply.grant {
        Some(Grant { allowed, busy }) => (i64::from(allowed), i64::from(busy)),
        None => (-1, 0),
    }
}

mod claims;
mod pools;
