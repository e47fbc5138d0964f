//! Registry requests per edge request, down a chain of three engines:
//!
//! ```text
//! bench ─▶ A (max_reads 10) ─▶ B (100) ─▶ gateway (100) ─▶ registry
//! ```
//!
//! A and B are `examples/chain.rs`, the gateway is `app::build` on the
//! embedded registry, each served by `fanout_budget::inbound::serve` on a
//! loopback listener of its own — as `gateway/tests/chain.rs` builds it,
//! without its TCP taps. A's and B's reads to the next hop are marked
//! `propagate`, or not; each edge request fans out `width` rows at A and at
//! B, and each gateway request reads ten manifests after their tag list (11
//! registry reads when its budget allows).

use crate::hops::{self, nest, roomy, Seen, Server, INNER_BUDGET, TEN_MANIFESTS};
use fanout_gateway::embedded::EmbeddedRegistry;
use fanout_testkit::median;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The edge's budget (A).
const EDGE_BUDGET: u64 = 10;

/// A → B → gateway → registry, all running; stopped when dropped.
struct Chain {
    a: reqwest::Url,
    /// Requests B received (A's reads).
    b_seen: Arc<Seen>,
    /// Requests the gateway received (B's reads).
    gateway_seen: Arc<Seen>,
    registry: EmbeddedRegistry,
    _servers: [Server; 3],
}

impl Chain {
    async fn start(propagate: bool) -> Self {
        let registry = EmbeddedRegistry::fixture().await.expect("the registry");
        let gateway = hops::gateway(registry.url().parse().expect("a URL")).await;
        let b = hops::service(gateway.url.clone(), propagate, roomy).await;
        let a = hops::service(b.url.clone(), propagate, |config| {
            config.budget.max_reads = EDGE_BUDGET;
            config.budget.deadline_ms = 30_000;
            config.budget.read_timeout_ms = 30_000;
            config.rate_limit.requests_per_minute = u32::MAX;
        })
        .await;
        Self {
            a: a.url,
            b_seen: b.seen,
            gateway_seen: gateway.seen,
            registry,
            _servers: [a.server, b.server, gateway.server],
        }
    }

    /// One edge request: what each hop received for it, and A's answer.
    async fn edge_request(&self, client: &reqwest::Client, query: &str) -> Sample {
        self.registry.counters().reset();
        self.b_seen.clear();
        self.gateway_seen.clear();
        let started = Instant::now();
        let answer = client
            .post(self.a.clone())
            .json(&json!({ "query": query }))
            .send()
            .await
            .expect("A answers");
        assert_eq!(answer.status(), 200);
        let answer: Value = answer.json().await.expect("a JSON answer");
        let wall = started.elapsed();
        Sample {
            b: self.b_seen.count(),
            gateway: self.gateway_seen.count(),
            registry: self.registry.counters().requests(),
            used: answer["extensions"]["fanout"]["used"]
                .as_u64()
                .expect("extensions.fanout.used"),
            errors: answer["errors"].as_array().map_or(0, Vec::len),
            wall,
        }
    }
}

/// What one edge request cost along the chain.
struct Sample {
    b: u64,
    gateway: u64,
    registry: u64,
    used: u64,
    /// Errors at the edge (rows refused there).
    errors: usize,
    wall: Duration,
}

/// The mean of `f` over `samples`, and its range when it moved.
fn per_request(samples: &[Sample], f: impl Fn(&Sample) -> u64) -> String {
    let values: Vec<u64> = samples.iter().map(f).collect();
    let (min, max) = (values.iter().min(), values.iter().max());
    let mean = values.iter().sum::<u64>() as f64 / values.len() as f64;
    match (min, max) {
        (Some(min), Some(max)) if min != max => format!("{mean:.1} ({min}–{max})"),
        _ => format!("{mean:.0}"),
    }
}

/// The fan-outs measured: the issue's ×10 at A and at B, and narrower
/// ones, where the edge's budget reaches the registry.
const WIDTHS: [u32; 4] = [10, 3, 2, 1];

/// `requests` edge requests per fan-out and side, the sides turn about;
/// prints the table and the verdict. Whether the target held.
pub async fn run(requests: usize) -> bool {
    let off = Chain::start(false).await;
    let on = Chain::start(true).await;
    let client = reqwest::Client::new();
    println!("## chain: registry requests per edge request");
    println!();
    println!(
        "A (max_reads {EDGE_BUDGET}) → B ({INNER_BUDGET}) → gateway ({INNER_BUDGET}) → embedded registry, \
         loopback; {requests} edge requests per row, sequential, the two sides turn about; \
         each gateway request asks for ten manifests after their tag list (11 registry reads)."
    );
    println!();
    println!("| fan-out per hop | propagation | A → B requests | B → gateway requests | registry requests | edge `used` | errors at the edge | wall per edge request (median) |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut held = true;
    for width in WIDTHS {
        let query = nest(&[width, width], TEN_MANIFESTS);
        let mut samples: [Vec<Sample>; 2] = [Vec::new(), Vec::new()];
        for i in 0..requests {
            let order = if i % 2 == 0 { [0, 1] } else { [1, 0] };
            for side in order {
                let chain = if side == 0 { &off } else { &on };
                samples[side].push(chain.edge_request(&client, &query).await);
            }
        }
        for (side, name) in [(0, "off"), (1, "on")] {
            let s = &samples[side];
            let mut walls: Vec<f64> = s.iter().map(|s| s.wall.as_secs_f64() * 1e3).collect();
            println!(
                "| ×{width} | {name} | {} | {} | **{}** | {} | {} | {:.1} ms |",
                per_request(s, |s| s.b),
                per_request(s, |s| s.gateway),
                per_request(s, |s| s.registry),
                per_request(s, |s| s.used),
                per_request(s, |s| s.errors as u64),
                median(&mut walls),
            );
        }
        // With propagation the edge's budget bounds every request the chain
        // sends for it, the registry's included; `used` counts them all.
        for s in &samples[1] {
            held &= s.registry <= EDGE_BUDGET;
            held &= s.b + s.gateway + s.registry == s.used && s.used <= EDGE_BUDGET;
        }
    }
    println!();
    println!(
        "target: registry requests per edge request ≤ the edge's budget ({EDGE_BUDGET}) with \
         propagation on, and every request the chain sent counted in the edge's `used`: {}",
        if held { "met" } else { "MISSED" }
    );
    held
}
