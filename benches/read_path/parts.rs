//! The miss path taken apart.

use crate::fixtures::{in_task, urls};
use crate::{CHUNK, HOST, LONG, PARTS};
use criterion::{black_box, Criterion};
use fanout_budget::config::HostConfig;
use fanout_budget::{FanoutError, UpstreamResponse};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;

/// The miss path taken apart with the library's public pieces (and, where a
/// piece is private, the same code written out), to see where the time goes.
pub(crate) fn parts(c: &mut Criterion, rt: &Runtime) {
    let mut g = c.benchmark_group(PARTS);
    let pool = urls(0, CHUNK);

    // `Read::host` (private): the `host:port` string built for every read.
    let url = pool[0].clone();
    g.bench_function("host_string", |b| {
        b.iter(|| {
            let url = black_box(&url);
            let host = url.host_str().unwrap_or("");
            black_box(match url.port_or_known_default() {
                Some(port) => format!("{host}:{port}"),
                None => host.to_string(),
            })
        })
    });

    // One clock read (the miss path makes about seven: see BENCHMARKS.md).
    g.bench_function("clock_read", |b| {
        b.iter(|| black_box(tokio::time::Instant::now()))
    });

    // `Dedup::get_or_run`, a miss: the key (URL copied), the DashMap entry,
    // the `Arc<OnceCell>`, its initialisation, the value cloned out.
    let value: Result<Arc<UpstreamResponse>, FanoutError> = Ok(Arc::new(UpstreamResponse::new(
        HOST,
        http::StatusCode::OK,
        http::HeaderMap::new(),
        bytes::Bytes::new(),
    )));
    g.bench_function("dedup_miss", |b| {
        b.iter_custom(|iters| {
            let (pool, value) = (pool.clone(), value.clone());
            in_task(rt, async move {
                type Key = (String, Option<http::HeaderValue>);
                let mut total = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let n = left.min(CHUNK as u64) as usize;
                    left -= n as u64;
                    let dedup: fanout_budget::dedup::Dedup<Key, _> =
                        fanout_budget::dedup::Dedup::new();
                    let started = Instant::now();
                    for url in &pool[..n] {
                        let key = (url.as_str().to_owned(), None);
                        let _ = black_box(dedup.get_or_run(key, || async { value.clone() }).await);
                    }
                    total += started.elapsed();
                }
                total
            })
        })
    });

    // `LocalHostCaps::acquire` + drop (the `HostLimiter` trait's path): the
    // boxed future, the map lookup, the permit, the in-flight count, the
    // `HostSlot`.
    let mut hosts = std::collections::BTreeMap::new();
    hosts.insert(HOST.to_string(), HostConfig::default());
    let caps = Arc::new(fanout_budget::LocalHostCaps::new(hosts));
    g.bench_function("host_slot", |b| {
        b.iter_custom(|iters| {
            let caps = caps.clone();
            in_task(rt, async move {
                use fanout_budget::HostLimiter;
                let started = Instant::now();
                for _ in 0..iters {
                    drop(black_box(caps.acquire(HOST, LONG).await.expect("a slot")));
                }
                started.elapsed()
            })
        })
    });

    // `HostCap::try_acquire` + drop: the engine's path once the host is
    // resolved (a free permit, the in-flight count, the `HostSlot`).
    let cap = caps.cap(HOST);
    g.bench_function("host_cap_try", |b| {
        b.iter(|| {
            drop(black_box(
                cap.try_acquire().expect("capped").expect("a slot"),
            ))
        })
    });
    g.finish();
}
