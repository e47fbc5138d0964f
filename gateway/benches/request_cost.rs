//! Where the end-to-end cost goes: one
//! inbound request of the load query, in process, with no network at all —
//! the router called directly (`tower::ServiceExt::oneshot`), the engine's
//! reads answered by an in-memory copy of the registry's responses (pending
//! once, so every read's timer is armed as on a socket).
//!
//! Each side is measured turn about with the baseline side "read path only"
//! (the gateway's schema, every read through the engine's acquisition point,
//! nothing else of the engine), 31 rounds; the table gives the medians and
//! the median per-round difference, i.e. what each part of the engine adds
//! per request.
//!
//! `cargo bench --bench request_cost` (or `-p fanout-gateway --bench request_cost`).

mod common;

use axum::Router;
use common::*;
use fanout_budget::config::HostConfig;
use fanout_budget::{Config, Engine};
use fanout_gateway::app;
use fanout_gateway::oci::MANIFEST_ACCEPT;
use fanout_gateway::schema;
use fanout_testkit::{graphql_request, MemTransport};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

const QUERY: &str =
    r#"{ repository(name: "acme/app") { tags(first: 4) { nodes { name manifest { digest } } } } }"#;
const ROUNDS: usize = 31;
const ITERS: u64 = 300;

/// The registry's answers, copied once over HTTP, served from memory (each
/// read pending once first).
async fn copy_registry(base: &str) -> Arc<MemTransport> {
    let client = reqwest::Client::new();
    let mut transport = MemTransport::new().pending_once(true).record(false);
    let mut paths = vec![(format!("/v2/{REPO}/tags/list"), None)];
    for i in 0..4 {
        paths.push((
            format!("/v2/{REPO}/manifests/t{i:02}"),
            Some(MANIFEST_ACCEPT),
        ));
    }
    for (path, accept) in paths {
        let mut request = client.get(format!("{base}{path}"));
        if let Some(accept) = accept {
            request = request.header("accept", accept);
        }
        let response = request.send().await.expect("the registry answers");
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.bytes().await.expect("a body");
        transport = transport.stored(path, status, headers, body);
    }
    Arc::new(transport)
}

fn engine(config: &Config, transport: &Arc<MemTransport>, costs: bool) -> Engine {
    let mut engine = Engine::builder(config.clone()).transport(transport.clone());
    if costs {
        engine = engine.costs(schema::costs());
    }
    engine.build()
}

async fn call(router: &Router) -> bytes::Bytes {
    let peer: SocketAddr = "127.0.0.1:40000".parse().expect("an address");
    let request = graphql_request(single(QUERY), &[], Some(peer));
    fanout_testkit::call(router, request).await.body
}

/// `iters` requests through `router`, one after another; the time they took.
fn routine<'a>(
    rt: &'a tokio::runtime::Runtime,
    router: &'a Router,
) -> impl FnMut(u64) -> Duration + 'a {
    move |iters| {
        rt.block_on(async {
            let started = Instant::now();
            for _ in 0..iters {
                std::hint::black_box(call(router).await);
            }
            started.elapsed()
        })
    }
}

/// `a` and `b` turn about (`fanout_testkit::paired`); medians of a, b (µs
/// per request) and of the per-round `a - b` (µs) and `a / b`.
fn paired(a: impl FnMut(u64) -> Duration, b: impl FnMut(u64) -> Duration) -> (f64, f64, f64, f64) {
    let p = fanout_testkit::paired(ROUNDS, ITERS, a, b);
    (p.a_ns / 1e3, p.b_ns / 1e3, p.diff_ns / 1e3, p.ratio)
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let (registry, transport) = rt.block_on(async {
        let registry = registry(None).await;
        let transport = copy_registry(&registry.url()).await;
        (registry, transport)
    });
    let upstream: reqwest::Url = registry.url().parse().expect("a URL");
    let mut config = Config::default();
    config.rate_limit.requests_per_minute = u32::MAX;
    config.hosts.insert(registry.host(), HostConfig::default());

    // Like for like with the baseline, which parses every request: the
    // engine's own cost is measured with its parsed-document cache off.
    let mut parsing = config.clone();
    parsing.http.document_cache_bytes = 0;
    let sides: Vec<(&str, Router)> = vec![
        (
            "the engine as the gateway serves it (`app::build_with`, parsed-document cache on)",
            app::build_with(engine(&config, &transport, true), upstream.clone(), None).router,
        ),
        (
            "the same, every query parsed (`http.document_cache_bytes = 0`)",
            app::build_with(engine(&parsing, &transport, true), upstream.clone(), None).router,
        ),
        (
            "every query parsed, minus the rate-limit layer",
            engine_router(engine(&parsing, &transport, true), &upstream),
        ),
        (
            "every query parsed, minus the rate-limit layer and the cost table",
            engine_router(engine(&parsing, &transport, false), &upstream),
        ),
        (
            "read path + a no-op async-graphql extension",
            read_path_router(engine(&config, &transport, false), &upstream, true),
        ),
    ];
    let base = read_path_router(engine(&config, &transport, false), &upstream, false);

    // Every side answers the same data.
    for router in sides.iter().map(|(_, r)| r).chain([&base]) {
        let body = rt.block_on(call(router));
        let text = String::from_utf8_lossy(&body);
        assert!(!text.contains("\"errors\""), "{text}");
        assert_eq!(text.matches("sha256:").count(), 4, "{text}");
    }

    println!("## request_cost summary");
    println!();
    println!("machine: {}", machine());
    println!(
        "one request of the load query (5 reads, in-memory upstream), turn about with \"read path only\", medians of {ROUNDS} rounds × {ITERS} requests"
    );
    println!();
    println!("| side | µs per request | read path only | difference | ratio |");
    println!("|---|---|---|---|---|");
    for (name, router) in &sides {
        let (a, b, diff, ratio) = paired(routine(&rt, router), routine(&rt, &base));
        println!("| {name} | {a:.1} µs | {b:.1} µs | {diff:+.1} µs | {ratio:.3}× |");
    }
    drop(registry);
}
