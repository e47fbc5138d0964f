//! The cache of immutable answers on a realistic workload: the
//! embedded registry with 50 repositories × 20 tags (1 ms per answer);
//! 8 clients, each request choosing its repository and tag by Zipf(1.1)
//! popularity; 30 % list pages (`tags(first: 5)` with digests and configs),
//! 70 % single-tag lookups (layers and config). The gateway with the cache
//! on (the default 32 MiB), off (`upstream.cache_bytes = 0`), and on with
//! what a tag says reused for 60 s (`tag_ttl_ms`), in turns over the same
//! loopback registry (paired rounds).
//!
//! Reported per GraphQL request: upstream requests, pulls (manifest `GET`s),
//! the engine's cache hits; and throughput, on / off.
//!
//! `cargo bench -p fanout-gateway --bench cache` (`CACHE_ROUNDS`, default 5,
//! of `CACHE_ROUND_MS`, default 2000, per side).

mod common;

use common::*;
use fanout_budget::config::{UpstreamConfig, UpstreamTable};
use fanout_budget::Config;
use fanout_gateway::app;
use fanout_gateway::embedded::{Image, Store};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

const REPOS: usize = 50;
const TAGS: usize = 20;
const CLIENTS: usize = 8;
const ZIPF_S: f64 = 1.1;

/// Cumulative Zipf(s) weights over `n` ranks.
fn zipf(n: usize) -> Vec<f64> {
    let weights: Vec<f64> = (1..=n).map(|k| 1.0 / (k as f64).powf(ZIPF_S)).collect();
    let total: f64 = weights.iter().sum();
    let mut sum = 0.0;
    weights
        .iter()
        .map(|w| {
            sum += w / total;
            sum
        })
        .collect()
}

/// xorshift64*: the bench's own reproducible randomness.
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn rank(&mut self, cdf: &[f64]) -> usize {
        let u = self.unit();
        cdf.iter().position(|c| u <= *c).unwrap_or(cdf.len() - 1)
    }
}

fn store() -> Store {
    let mut store = Store::default();
    for r in 0..REPOS {
        for t in 0..TAGS {
            let seed = format!("r{r}t{t}");
            let image = Image::demo("linux", "amd64", &seed);
            store.put_image(&format!("bench/r{r:02}"), Some(&format!("t{t:02}")), &image);
        }
    }
    store
}

fn query(rng: &mut Rng, repos: &[f64], tags: &[f64]) -> String {
    let repo = format!("bench/r{:02}", rng.rank(repos));
    if rng.unit() < 0.3 {
        single(&format!(
            r#"{{ repository(name: "{repo}") {{ tags(first: 5) {{ nodes {{ name manifest {{ digest config {{ os }} }} }} }} }} }}"#
        ))
    } else {
        let tag = format!("t{:02}", rng.rank(tags));
        single(&format!(
            r#"{{ repository(name: "{repo}") {{ tag(name: "{tag}") {{ manifest {{ digest layers {{ size }} config {{ os architecture }} }} }} }} }}"#
        ))
    }
}

/// One side's round: 8 clients for `length`; requests answered, cache hits.
async fn round(router: &axum::Router, length: Duration, seed: u64) -> (u64, u64) {
    let (repos, tags) = (Arc::new(zipf(REPOS)), Arc::new(zipf(TAGS)));
    let done = Arc::new(AtomicU64::new(0));
    let hits = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + length;
    let clients = (0..CLIENTS as u64).map(|c| {
        let (router, repos, tags) = (router.clone(), repos.clone(), tags.clone());
        let (done, hits) = (done.clone(), hits.clone());
        tokio::spawn(async move {
            let mut rng = Rng(seed.wrapping_mul(31).wrapping_add(c) | 1);
            while Instant::now() < until {
                let body = query(&mut rng, &repos, &tags);
                let answer = fanout_testkit::post(&router, body, &[]).await;
                assert_eq!(answer.status, 200);
                let json = answer.json();
                assert!(json.get("errors").is_none(), "{json}");
                let h = json["extensions"]["fanout"]["cacheHits"].as_u64().unwrap();
                hits.fetch_add(h, Relaxed);
                done.fetch_add(1, Relaxed);
            }
        })
    });
    for client in futures::future::join_all(clients).await {
        client.expect("a client");
    }
    (done.load(Relaxed), hits.load(Relaxed))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rounds: usize = std::env::var("CACHE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let length = Duration::from_millis(
        std::env::var("CACHE_ROUND_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2000),
    );
    let registry = registry(Some(Duration::from_millis(1))).await;
    registry.with_store(|s| *s = store());
    let upstream: reqwest::Url = registry.url().parse().expect("a URL");
    let mut config = Config::default();
    config.rate_limit.requests_per_minute = u32::MAX;
    let on = app::build(config.clone(), upstream.clone(), None).router;
    // The cache, and what a tag says reused for 60 s (`tag_ttl_ms`).
    let table = UpstreamTable::default()
        .url(upstream.as_str())
        .tag_ttl_ms(60_000);
    let kept = app::build(
        config.clone().upstream_named("bench", table),
        upstream.clone(),
        None,
    )
    .router;
    let off_config = config.upstream(UpstreamConfig::default().cache_bytes(0));
    let off = app::build(off_config, upstream, None).router;
    println!("{}", machine());
    println!("cache bench: {REPOS} repositories × {TAGS} tags, Zipf({ZIPF_S}), {CLIENTS} clients, {rounds} × {length:?} per side");
    // Warm the cache sides once (what a long-running gateway has).
    round(&on, length, 99).await;
    round(&kept, length, 99).await;
    let mut sides = [(0u64, 0u64, 0u64, 0u64, Duration::ZERO); 3];
    for r in 0..rounds {
        for (i, router) in [&on, &off, &kept].into_iter().enumerate() {
            let counters = registry.counters();
            counters.reset();
            let started = Instant::now();
            let (done, hits) = round(router, length, r as u64 + 1).await;
            let side = &mut sides[i];
            side.0 += done;
            side.1 += counters.requests();
            side.2 += counters.pulls();
            side.3 += hits;
            side.4 += started.elapsed();
        }
    }
    println!("| side | GraphQL requests/s | upstream requests / request | pulls / request | cache hits / request |");
    println!("|---|---|---|---|---|");
    let names = ["cache on", "cache off", "cache on, tag_ttl_ms = 60000"];
    for (name, (done, requests, pulls, hits, took)) in names.iter().zip(sides) {
        let per = |n: u64| n as f64 / done as f64;
        println!(
            "| {name} | {:.0} | {:.2} | {:.2} | {:.2} |",
            done as f64 / took.as_secs_f64(),
            per(requests),
            per(pulls),
            per(hits)
        );
    }
    let per_request = |i: usize| sides[i].1 as f64 / sides[i].0 as f64;
    let throughput = |i: usize| sides[i].0 as f64 / sides[i].4.as_secs_f64();
    println!(
        "upstream requests per GraphQL request, off / on: {:.2}×, off / on with tags kept: {:.2}×; \
         throughput on / off: {:.2}×, with tags kept / off: {:.2}×",
        per_request(1) / per_request(0),
        per_request(1) / per_request(2),
        throughput(0) / throughput(1),
        throughput(2) / throughput(1)
    );
}
