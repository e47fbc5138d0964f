//! The inbound limiter against `governor` alone, and the Redis limiter
//! against a Redis `PING` (issue 8, part 1).
//!
//! `cargo bench --bench limiter` measures, on the same keys:
//!
//! - `governor`: a keyed GCRA limiter (DashMap store), nothing else;
//! - `local`: [`LocalLimiter::check`] (governor with state information over
//!   the limiter's own key store — a `DashMap` with a keyed folded-multiply
//!   hash —, the idle-key sweep's pacing, the `Decision`);
//! - `inbound`: what the rate-limit layer decides per request — the internal
//!   token check (no token header: an ordinary caller), the client IP, then
//!   `LocalLimiter::check` — and the same with a wrong token (a SHA-256);
//! - the internal caller's exemption, and the whole `RateLimitLayer` service
//!   around an empty inner service (headers included);
//! - with `redis-server` on `PATH`: `RedisRateLimiter::check` (one `EVALSHA`)
//!   vs `PING` on the same connection.
//!
//! Keys are client IPs cycled in order. The quota is chosen so that, for the
//! whole bench, every check is admitted and no key is ever idle (so the sweep
//! scans but never evicts): the figures are the admitted path with a
//! resident key, for governor and for the layer alike. Refusals are counted
//! and printed; they must be 0.
//!
//! After criterion, a paired pass measures the inbound check against governor
//! alone (fresh limiters) and the Redis check against `PING`, turn about, 31
//! rounds; the targets are judged on the medians of those per-round ratios.

mod support;

use criterion::{black_box, BenchmarkGroup, Criterion};
use fanout_budget::backends::redis::{RedisBackend, RedisRateLimiter};
use fanout_budget::config::{RateLimitConfig, RedisConfig};
use fanout_budget::identity::{ClientPrefix, InternalToken, TokenCheck, TrustedProxies};
use fanout_budget::{Decision, InboundLimiter, LocalLimiter, RateLimitLayer};
use fanout_testkit::RedisServer;
use governor::{Quota, RateLimiter};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use support::{human, paired, ratio, show, verdict, Medians, Paired};
use tower::{Service, ServiceExt};

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

/// The headers of an ordinary GraphQL POST (no internal token).
fn public_headers() -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    h.insert("host", "gateway.local:8080".parse().unwrap());
    h.insert("content-type", "application/json".parse().unwrap());
    h.insert("accept", "application/json".parse().unwrap());
    h.insert("user-agent", "bench/1.0".parse().unwrap());
    h.insert("content-length", "96".parse().unwrap());
    h
}

fn with_token(token: &str) -> http::HeaderMap {
    let mut h = public_headers();
    h.insert("x-internal-token", token.parse().unwrap());
    h
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

/// `governor` alone: a fresh keyed limiter, its keys inserted untimed.
fn governor_routine<'a>(
    keys: &Arc<Vec<IpAddr>>,
    rpm: NonZeroU32,
    denied: &'a AtomicU64,
) -> impl FnMut(u64) -> Duration + 'a {
    let governor = RateLimiter::dashmap(Quota::per_minute(rpm));
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

/// A fresh `LocalLimiter`, its keys inserted untimed.
fn local_limiter(keys: &Arc<Vec<IpAddr>>, rpm: NonZeroU32) -> LocalLimiter {
    let local = LocalLimiter::per_minute(rpm);
    for k in keys.iter() {
        local.check(*k);
    }
    local
}

/// What `RateLimitService` decides per request, in its order: the internal
/// token (with `headers`), the client IP, then `LocalLimiter::check`.
fn inbound_routine<'a>(
    keys: &Arc<Vec<IpAddr>>,
    rpm: NonZeroU32,
    headers: http::HeaderMap,
    denied: &'a AtomicU64,
) -> impl FnMut(u64) -> Duration + 'a {
    let local = local_limiter(keys, rpm);
    let token = InternalToken::new(TOKEN);
    let proxies = TrustedProxies::new::<&str>(&[]);
    let prefix = ClientPrefix::default();
    let mut cycle = Cycle::new(keys);
    move |iters| {
        let started = Instant::now();
        for _ in 0..iters {
            let check = token.check(black_box(&headers));
            if check == TokenCheck::Valid {
                continue;
            }
            let Ok(client) = proxies.client_ip(cycle.key(), &headers) else {
                continue;
            };
            count(black_box(local.check(prefix.key(client))), denied);
        }
        started.elapsed()
    }
}

fn local_population(
    g: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    p: Population,
    denied: &AtomicU64,
) {
    let keys = keys(p.keys);
    let rpm = NonZeroU32::new(p.per_minute).unwrap();

    // Each bench gets a fresh limiter, its keys inserted before it is timed.
    let mut governor = governor_routine(&keys, rpm, denied);
    g.bench_function("governor", |b| b.iter_custom(&mut governor));
    drop(governor);

    let local = local_limiter(&keys, rpm);
    let mut cycle = Cycle::new(&keys);
    g.bench_function("local", |b| {
        b.iter(|| count(black_box(local.check(cycle.key())), denied))
    });
    drop(local);

    for (id, headers) in [
        ("inbound", public_headers()),
        ("inbound_wrong_token", with_token("not-the-token")),
    ] {
        let mut inbound = inbound_routine(&keys, rpm, headers, denied);
        g.bench_function(id, |b| b.iter_custom(&mut inbound));
    }
}

/// The inbound check vs governor alone, turn about, for each population.
fn paired_limiter(denied: &AtomicU64) -> Vec<(usize, Paired)> {
    POPULATIONS
        .iter()
        .map(|p| {
            let keys = keys(p.keys);
            let rpm = NonZeroU32::new(p.per_minute).unwrap();
            let pair = paired(
                ROUNDS,
                100_000,
                inbound_routine(&keys, rpm, public_headers(), denied),
                governor_routine(&keys, rpm, denied),
            );
            (p.keys, pair)
        })
        .collect()
}

const ROUNDS: usize = 31;

fn layer(c: &mut Criterion, denied: &Arc<AtomicU64>) {
    let mut g = c.benchmark_group(MISC_GROUP);
    let token = InternalToken::new(TOKEN);
    let headers = with_token(TOKEN);
    g.bench_function("exempt_internal", |b| {
        b.iter(|| black_box(token.check(black_box(&headers))))
    });
    // An ordinary caller: no token header, so the check is one header lookup.
    let public = public_headers();
    g.bench_function("token_check_absent", |b| {
        b.iter(|| black_box(token.check(black_box(&public))))
    });

    // The whole middleware, per request: identity, key, check, and the
    // `RateLimit` / `RateLimit-Policy` headers on the answer.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let p = POPULATIONS[0];
    let config = RateLimitConfig {
        requests_per_minute: p.per_minute,
        internal_token: TOKEN.into(),
        trusted_proxies: Vec::new(),
        ..RateLimitConfig::default()
    };
    let inner = tower::service_fn(|_req: http::Request<axum::body::Body>| async {
        Ok::<_, std::convert::Infallible>(axum::response::Response::new(axum::body::Body::empty()))
    });
    let service = tower::Layer::layer(&RateLimitLayer::new(&config), inner);
    let keys = keys(p.keys);
    let request = |ip: IpAddr| {
        let mut request = http::Request::post("/graphql")
            .header("content-type", "application/json")
            .body(axum::body::Body::empty())
            .unwrap();
        request
            .extensions_mut()
            .insert(axum::extract::ConnectInfo(SocketAddr::new(ip, 40000)));
        request
    };
    let mut cycle = Cycle::new(&keys);
    g.bench_function("layer_call", |b| {
        b.iter_custom(|iters| {
            let requests: Vec<_> = (0..iters).map(|_| request(cycle.key())).collect();
            let mut service = service.clone();
            let denied = denied.clone();
            rt.block_on(async move {
                let started = Instant::now();
                for request in requests {
                    let response = service.ready().await.unwrap().call(request).await.unwrap();
                    if response.status() != http::StatusCode::OK {
                        denied.fetch_add(1, Relaxed);
                    }
                    black_box(response);
                }
                started.elapsed()
            })
        })
    });
    g.finish();
}

fn redis(c: &mut Criterion, denied: &Arc<AtomicU64>, run_paired: bool) -> Option<Paired> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(RedisServer::start())?;
    let config = RedisConfig {
        url: format!("redis://127.0.0.1:{}", server.port),
        timeout_ms: 1_000,
        ..RedisConfig::default()
    };
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
                count(limiter.check(ip).await.expect("a decision"), denied);
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
            ("governor", "governor alone"),
            ("local", "`LocalLimiter::check`"),
            (
                "inbound",
                "**inbound check** (token check + client IP + `LocalLimiter::check`)",
            ),
            (
                "inbound_wrong_token",
                "inbound check, wrong token (SHA-256)",
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
            "token_check_absent",
            "token check, no token header (an ordinary caller)",
        ),
        (
            "exempt_internal",
            "internal caller's exemption (token check only)",
        ),
        (
            "layer_call",
            "the whole `RateLimitLayer` service, 1024 keys",
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
            "| {keys} keys: inbound check vs governor alone | {} | {} | {} | {:.3}× |",
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
            "target: limiter check ≤ 1.1 × governor alone ({keys} keys, paired): {:.3}× — {}",
            x.ratio,
            verdict(Some(x.ratio <= 1.1))
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
    for p in POPULATIONS {
        let mut g = c.benchmark_group(p.group);
        local_population(&mut g, p, &denied);
        g.finish();
    }
    layer(&mut c, &denied);
    let redis = redis(&mut c, &denied, run_paired);
    c.final_summary();
    let limiter = if run_paired {
        paired_limiter(&denied)
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
