//! The in-memory upstream, the engine on it, and the timed loops.

use crate::{CHUNK, HOST};
use criterion::black_box;
use fanout_budget::config::HostConfig;
use fanout_budget::{inbound::Caller, request::FanoutRequest, Config, Engine, Read};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;

pub(crate) use fanout_testkit::{MemTransport, YieldOnce};

/// The in-memory upstream: 200 with a fixed body, at once or after pending
/// once; the reads are not kept.
pub(crate) fn mem_transport(yields: bool) -> Arc<MemTransport> {
    Arc::new(
        MemTransport::new()
            .body(&br#"{"schemaVersion":2}"#[..])
            .pending_once(yields)
            .record(false),
    )
}

/// The engine on the in-memory transport, with a cap on `HOST` — or, with
/// `READ_PATH_NOCAP=1`, without a `[hosts]` table (`HOST` is then counted
/// while its reads are in flight, under the shared `host="other"` label).
pub(crate) fn mem_engine(yields: bool) -> Engine {
    mem_engine_in(yields, fanout_budget::config::LimitMode::Enforce)
}

/// [`mem_engine`] with its budget and read quota in `mode` (measure mode
/// against enforce: the read path's cost of rehearsing a limit).
pub(crate) fn mem_engine_in(yields: bool, mode: fanout_budget::config::LimitMode) -> Engine {
    let mut config = Config::default();
    config.budget.max_reads = 1_000;
    config.budget.mode = mode;
    config.quota.mode = mode;
    if std::env::var("READ_PATH_NOCAP").as_deref() != Ok("1") {
        config.hosts.insert(
            HOST.into(),
            HostConfig::default()
                .max_concurrent(256)
                .acquire_wait_ms(50),
        );
    }
    Engine::builder(config)
        .transport(mem_transport(yields))
        .build()
}

/// `n` distinct URLs on `HOST` (thread `t` gets its own).
pub(crate) fn urls(t: usize, n: usize) -> Arc<Vec<reqwest::Url>> {
    Arc::new(
        (0..n)
            .map(|i| {
                format!("http://{HOST}/v2/bench/app/manifests/t{t}-{i}")
                    .parse()
                    .expect("a URL")
            })
            .collect(),
    )
}

pub(crate) fn current_thread() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Runs `f` as a spawned task (so a pending future is rescheduled by the
/// scheduler, not by `block_on`'s park) and returns what it timed.
pub(crate) fn in_task<F>(rt: &Runtime, f: F) -> Duration
where
    F: Future<Output = Duration> + Send + 'static,
{
    rt.block_on(async move { tokio::spawn(f).await.expect("the bench task") })
}

/// The budget's charge, hand-rolled: one compare-and-swap loop.
pub(crate) fn charge(used: &AtomicU64, limit: u64) -> bool {
    used.fetch_update(Relaxed, Relaxed, |n| (n < limit).then_some(n + 1))
        .is_ok()
}

/// Sends `reads` through one operation of `request`; the time they took.
pub(crate) async fn timed_reads(request: &FanoutRequest, reads: Vec<Read>) -> Duration {
    let op = request.operation();
    let upstream = op.upstream();
    let started = Instant::now();
    for read in reads {
        black_box(upstream.read(read).await.expect("an in-memory read"));
    }
    started.elapsed()
}

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Dedup {
    Miss,
    Hit,
}

/// `iters` reads through `engine`, `CHUNK` per inbound request; only the
/// reads are timed (building the `Read`s and opening the request are not).
pub(crate) async fn engine_reads(
    engine: Engine,
    urls: Arc<Vec<reqwest::Url>>,
    iters: u64,
    mode: Dedup,
) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(CHUNK as u64) as usize;
        left -= n as u64;
        let request = engine.begin_request(Caller::Public);
        let reads = match mode {
            Dedup::Miss => urls[..n].iter().cloned().map(Read::get).collect(),
            Dedup::Hit => {
                let warm = request.operation();
                warm.upstream()
                    .read(Read::get(urls[0].clone()))
                    .await
                    .expect("an in-memory read");
                vec![Read::get(urls[0].clone()); n]
            }
        };
        total += timed_reads(&request, reads).await;
    }
    total
}
