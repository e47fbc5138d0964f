//! The inbound limiter against `governor` alone, and the Redis limiter
//! against a Redis `PING`, through the public API only.
//!
//! `cargo bench --bench limiter` measures, on the same keys:
//!
//! - `governor`: a keyed GCRA limiter over governor's `DashMapStateStore`
//!   hashed by foldhash's seeded `RandomState` (the store the library uses
//!   inside), nothing else;
//! - `layer`: the whole [`RateLimitLayer`] service per request
//!   (`tower::ServiceExt::oneshot` over an inner service that answers an
//!   empty 200): the internal-token check (no token header: an ordinary
//!   caller), the client IP from `ConnectInfo`, the GCRA check, and the
//!   `RateLimit` / `RateLimit-Policy` headers on the answer;
//! - with 1024 keys, the same service for a wrong token (a SHA-256 of the
//!   presented value) and for the internal caller (exempt, not counted);
//! - with `redis-server` on `PATH`: `RedisRateLimiter::check` through the
//!   [`InboundLimiter`] trait (one `EVALSHA`) vs `RedisBackend::ping` on the
//!   same connection.
//!
//! Keys are client IPs cycled in order, each inserted before timing; the
//! requests are built before timing too. The quota is chosen so that, for the
//! whole bench, every check is admitted and no key is ever idle: the figures
//! are the admitted path with a resident key, for governor and for the layer
//! alike. Refusals are counted and printed; they must be 0.
//!
//! After criterion, a paired pass measures the layer against governor alone
//! (fresh limiters) and the Redis check against `PING`, turn about, 31
//! rounds, and prints the medians of the per-round differences and ratios.
//! (The target "limiter check ≤ 1.1 × governor alone" was judged on the
//! limiter's check alone, which is private to the library now; the layer
//! here is the whole middleware, so its ratio is no verdict on that target.)

mod support;

use criterion::{black_box, BenchmarkGroup, Criterion};
use fanout_budget::backends::redis::{RedisBackend, RedisRateLimiter};
use fanout_budget::config::{RateLimitConfig, RedisConfig};
use fanout_budget::inbound::{Decision, InboundLimiter, RateLimitLayer, RateLimitService};
use fanout_testkit::{graphql_request, RedisServer};
use foldhash::fast::RandomState;
use governor::clock::DefaultClock;
use governor::state::keyed::DashMapStateStore;
use governor::{Quota, RateLimiter};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use support::{human, paired, ratio, show, verdict, Medians, Paired};
use tokio::runtime::Runtime;
use tower::ServiceExt;

const TOKEN: &str = "bench-internal-token-0123456789abcdef";
const REDIS_GROUP: &str = "redis";
const MISC_GROUP: &str = "limiter_layer";

/// A key population and a per-minute quota under which every key stays
/// resident and admitted for the length of one bench (see the module docs).
#[derive(Clone, Copy)]
struct Population {
    group: &'static str,
    keys: usize,
    per_minute: u32,
}

const POPULATIONS: [Population; 2] = [
    Population {
        group: "limiter_1024_keys",
        keys: 1024,
        per_minute: 200_000,
    },
    Population {
        group: "limiter_65536_keys",
        keys: 65_536,
        per_minute: 3_000,
    },
];

fn keys(n: usize) -> Arc<Vec<IpAddr>> {
    Arc::new(
        (0..n)
            .map(|i| IpAddr::V4(Ipv4Addr::new(10, (i >> 16) as u8, (i >> 8) as u8, i as u8)))
            .collect(),
    )
}

/// Checks cycle through the keys; `denied` counts refusals (must stay 0).
struct Cycle {
    keys: Arc<Vec<IpAddr>>,
    next: usize,
}

impl Cycle {
    fn new(keys: &Arc<Vec<IpAddr>>) -> Self {
        Self {
            keys: keys.clone(),
            next: 0,
        }
    }
    fn key(&mut self) -> IpAddr {
        let key = self.keys[self.next];
        self.next += 1;
        if self.next == self.keys.len() {
            self.next = 0;
        }
        key
    }
}

fn count(decision: Decision, denied: &AtomicU64) {
    if matches!(decision, Decision::Deny { .. }) {
        denied.fetch_add(1, Relaxed);
    }
}

/// `governor` alone: a fresh keyed limiter (governor's `DashMap` store,
/// hashed by foldhash), its keys inserted untimed.
fn governor_routine<'a>(
    keys: &Arc<Vec<IpAddr>>,
    rpm: NonZeroU32,
    denied: &'a AtomicU64,
) -> impl FnMut(u64) -> Duration + 'a {
    let store: DashMapStateStore<IpAddr, RandomState> =
        DashMapStateStore::with_hasher(RandomState::default());
    let governor: RateLimiter<IpAddr, _, DefaultClock> =
        RateLimiter::new(Quota::per_minute(rpm), store, DefaultClock::default());
    for k in keys.iter() {
        let _ = governor.check_key(k);
    }
    let mut cycle = Cycle::new(keys);
    move |iters| {
        let started = Instant::now();
        for _ in 0..iters {
            if governor.check_key(&cycle.key()).is_err() {
                denied.fetch_add(1, Relaxed);
            }
        }
        started.elapsed()
    }
}

/// An inner service that answers an empty 200.
#[derive(Clone, Copy)]
struct Empty;

impl tower::Service<http::Request<axum::body::Body>> for Empty {
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<axum::body::Body>) -> Self::Future {
        std::future::ready(Ok(axum::response::Response::new(axum::body::Body::empty())))
    }
}

fn current_thread() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// A fresh `RateLimitLayer` service (the internal token [`TOKEN`]), its keys
/// inserted untimed.
fn layer_service(
    rt: &Runtime,
    keys: &Arc<Vec<IpAddr>>,
    rpm: NonZeroU32,
) -> RateLimitService<Empty> {
    let config = RateLimitConfig::default()
        .requests_per_minute(rpm.get())
        .internal_token(TOKEN);
    let service = tower::Layer::layer(&RateLimitLayer::new(&config), Empty);
    rt.block_on(async {
        for k in keys.iter() {
            let _ = service.clone().oneshot(request(*k, &[])).await;
        }
    });
    service
}

/// A GraphQL POST from `ip` (as `ConnectInfo`) with `headers`.
fn request(ip: IpAddr, headers: &[(&str, &str)]) -> http::Request<axum::body::Body> {
    graphql_request(String::new(), headers, Some(SocketAddr::new(ip, 40000)))
}

/// Requests through the whole layer service, one after another; only the
/// calls are timed (the requests are built first). A refusal (any answer
/// but 200) is counted in `denied`.
fn layer_routine<'a>(
    rt: &'a Runtime,
    service: RateLimitService<Empty>,
    keys: &Arc<Vec<IpAddr>>,
    headers: &'a [(&'a str, &'a str)],
    denied: &'a AtomicU64,
) -> impl FnMut(u64) -> Duration + 'a {
    let mut cycle = Cycle::new(keys);
    move |iters| {
        let requests: Vec<_> = (0..iters).map(|_| request(cycle.key(), headers)).collect();
        let service = service.clone();
        rt.block_on(async move {
            let started = Instant::now();
            for request in requests {
                let response = service.clone().oneshot(request).await.unwrap();
                if response.status() != http::StatusCode::OK {
                    denied.fetch_add(1, Relaxed);
                }
                black_box(response);
            }
            started.elapsed()
        })
    }
}

fn population(
    g: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    rt: &Runtime,
    p: Population,
    denied: &AtomicU64,
) {
    let keys = keys(p.keys);
    let rpm = NonZeroU32::new(p.per_minute).unwrap();

    // Each bench gets a fresh limiter, its keys inserted before it is timed.
    let mut governor = governor_routine(&keys, rpm, denied);
    g.bench_function("governor", |b| b.iter_custom(&mut governor));
    drop(governor);

    let service = layer_service(rt, &keys, rpm);
    let mut layer = layer_routine(rt, service, &keys, &[], denied);
    g.bench_function("layer", |b| b.iter_custom(&mut layer));
}

/// The layer vs governor alone, turn about, for each population.
fn paired_limiter(rt: &Runtime, denied: &AtomicU64) -> Vec<(usize, Paired)> {
    POPULATIONS
        .iter()
        .map(|p| {
            let keys = keys(p.keys);
            let rpm = NonZeroU32::new(p.per_minute).unwrap();
            let service = layer_service(rt, &keys, rpm);
            let pair = paired(
                ROUNDS,
                100_000,
                layer_routine(rt, service, &keys, &[], denied),
                governor_routine(&keys, rpm, denied),
            );
            (p.keys, pair)
        })
        .collect()
}

const ROUNDS: usize = 31;

/// The layer for a wrong token and for the internal caller, 1024 keys.
fn tokens(c: &mut Criterion, rt: &Runtime, denied: &AtomicU64) {
    let mut g = c.benchmark_group(MISC_GROUP);
    let p = POPULATIONS[0];
    let keys = keys(p.keys);
    let rpm = NonZeroU32::new(p.per_minute).unwrap();
    let wrong = [("x-internal-token", "not-the-token")];
    let internal = [("x-internal-token", TOKEN)];
    for (id, headers) in [("layer_wrong_token", &wrong), ("layer_internal", &internal)] {
        let service = layer_service(rt, &keys, rpm);
        let mut routine = layer_routine(rt, service, &keys, headers, denied);
        g.bench_function(id, |b| b.iter_custom(&mut routine));
    }
    g.finish();
}

fn redis(c: &mut Criterion, denied: &AtomicU64, run_paired: bool) -> Option<Paired> {
    let rt = current_thread();
    let server = rt.block_on(RedisServer::start())?;
    let config = RedisConfig::default()
        .url(format!("redis://127.0.0.1:{}", server.port))
        .timeout_ms(1_000);
    let backend = RedisBackend::new(&config).expect("a redis URL");
    rt.block_on(async {
        for _ in 0..200 {
            if backend.ping().await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("redis-server did not answer on port {}", server.port);
    });
    let p = POPULATIONS[0];
    let limiter = RedisRateLimiter::new(backend.clone(), NonZeroU32::new(p.per_minute).unwrap());
    let keys = keys(p.keys);
    let mut g = c.benchmark_group(REDIS_GROUP);
    let ping = |iters: u64| {
        rt.block_on(async {
            let started = Instant::now();
            for _ in 0..iters {
                backend.ping().await.expect("PING");
            }
            started.elapsed()
        })
    };
    let mut cycle = Cycle::new(&keys);
    let mut check = |iters: u64| {
        let ips: Vec<IpAddr> = (0..iters).map(|_| cycle.key()).collect();
        rt.block_on(async {
            let started = Instant::now();
            for ip in ips {
                // Through the trait, as the layer calls a shared limiter.
                let shared: &dyn InboundLimiter = &limiter;
                count(shared.check(ip).await.expect("a decision"), denied);
            }
            started.elapsed()
        })
    };
    g.bench_function("ping", |b| b.iter_custom(ping));
    g.bench_function("limiter_check", |b| b.iter_custom(&mut check));
    g.finish();
    let pair = run_paired.then(|| paired(ROUNDS, 200, &mut check, ping));
    drop(server);
    pair
}

fn summary(m: &Medians, denied: u64, limiter: &[(usize, Paired)], redis: Option<&Paired>) {
    println!();
    println!("## limiter summary (criterion medians of this run)");
    println!();
    println!("| figure | median | ratio to governor alone |");
    println!("|---|---|---|");
    for p in POPULATIONS {
        let gov = m.get(p.group, "governor");
        for (id, name) in [
            (
                "governor",
                "governor alone (foldhash-keyed `DashMap` store)",
            ),
            (
                "layer",
                "**the whole `RateLimitLayer` service** (identity, client IP, check, headers)",
            ),
        ] {
            let v = m.get(p.group, id);
            println!(
                "| {} keys: {name} | {} | {} |",
                p.keys,
                show(v),
                ratio(v, gov)
            );
        }
    }
    let gov = m.get(POPULATIONS[0].group, "governor");
    for (id, name) in [
        (
            "layer_wrong_token",
            "the layer, a wrong token (SHA-256), 1024 keys",
        ),
        (
            "layer_internal",
            "the layer, the internal caller (exempt), 1024 keys",
        ),
    ] {
        let v = m.get(MISC_GROUP, id);
        println!("| {name} | {} | {} |", show(v), ratio(v, gov));
    }
    let ping = m.get(REDIS_GROUP, "ping");
    let check = m.get(REDIS_GROUP, "limiter_check");
    println!();
    println!("| Redis | median | ratio to PING |");
    println!("|---|---|---|");
    println!("| `PING` | {} | {} |", show(ping), ratio(ping, ping));
    println!(
        "| `RedisRateLimiter::check` | {} | {} |",
        show(check),
        ratio(check, ping)
    );
    println!();
    println!("refused checks during the benches (must be 0): {denied}");

    if limiter.is_empty() && redis.is_none() {
        println!("(paired pass not run)");
        return;
    }
    println!();
    println!("## limiter, paired (a and b turn about, medians of {ROUNDS} rounds)");
    println!();
    println!("| a vs b | a | b | a − b | a / b |");
    println!("|---|---|---|---|---|");
    for (keys, x) in limiter {
        println!(
            "| {keys} keys: the layer vs governor alone | {} | {} | {} | {:.3}× |",
            human(x.a_ns),
            human(x.b_ns),
            human(x.diff_ns),
            x.ratio
        );
    }
    if let Some(x) = redis {
        println!(
            "| `RedisRateLimiter::check` vs `PING` | {} | {} | {} | {:.3}× |",
            human(x.a_ns),
            human(x.b_ns),
            human(x.diff_ns),
            x.ratio
        );
    }
    println!();
    for (keys, x) in limiter {
        println!(
            "the layer over governor alone ({keys} keys, paired): {} per request, {:.3}× (informational: the 1.1× target was on the private check)",
            human(x.diff_ns),
            x.ratio
        );
    }
    match redis {
        Some(x) => println!(
            "target: Redis check ≤ 2 × PING (paired): {:.3}× — {}",
            x.ratio,
            verdict(Some(x.ratio <= 2.0))
        ),
        None => println!("target: Redis check ≤ 2 × PING: n/a (redis-server not run)"),
    }
}

fn main() {
    let started = SystemTime::now();
    let denied = Arc::new(AtomicU64::new(0));
    let run_paired = !support::quick_mode();
    let mut c = support::criterion();
    let rt = current_thread();
    for p in POPULATIONS {
        let mut g = c.benchmark_group(p.group);
        population(&mut g, &rt, p, &denied);
        g.finish();
    }
    tokens(&mut c, &rt, &denied);
    let redis = redis(&mut c, &denied, run_paired);
    c.final_summary();
    let limiter = if run_paired {
        paired_limiter(&rt, &denied)
    } else {
        Vec::new()
    };
    summary(
        &Medians::since(started),
        denied.load(Relaxed),
        &limiter,
        redis.as_ref(),
    );
}
