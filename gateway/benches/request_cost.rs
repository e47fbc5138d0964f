//! Where the end-to-end cost goes (issue 8, the profile behind part 2): one
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
use fanout_budget::{Config, Engine, ReadError, Read, Transport, UpstreamResponse};
use fanout_gateway::app;
use fanout_gateway::oci::MANIFEST_ACCEPT;
use fanout_gateway::schema;
use futures::future::BoxFuture;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower::ServiceExt;

const QUERY: &str = r#"{ repository(name: "bench/app") { tags(first: 4) { nodes { name manifest { digest } } } } }"#;
const ROUNDS: usize = 31;
const ITERS: u64 = 300;

use fanout_testkit::YieldOnce;

/// The registry's answers, copied once over HTTP, served from memory.
struct MemRegistry {
    responses: HashMap<String, (http::StatusCode, http::HeaderMap, bytes::Bytes)>,
}

impl Transport for MemRegistry {
    fn fetch<'a>(
        &'a self,
        read: Read,
        host: &'a str,
    ) -> BoxFuture<'a, Result<UpstreamResponse, ReadError>> {
        Box::pin(async move {
            YieldOnce(false).await;
            let (status, headers, body) = self
                .responses
                .get(read.url().path())
                .unwrap_or_else(|| panic!("no stored answer for {}", read.url()));
            Ok(UpstreamResponse::new(
                host.to_string(),
                *status,
                headers.clone(),
                body.clone(),
            ))
        })
    }
}

async fn copy_registry(base: &str) -> Arc<MemRegistry> {
    let client = reqwest::Client::new();
    let mut responses = HashMap::new();
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
        responses.insert(path, (status, headers, body));
    }
    Arc::new(MemRegistry { responses })
}

fn engine(config: &Config, transport: &Arc<MemRegistry>, costs: bool) -> Engine {
    let mut engine = Engine::builder(config.clone()).transport(transport.clone());
    if costs {
        engine = engine.costs(schema::costs());
    }
    engine.build()
}

fn request() -> http::Request<axum::body::Body> {
    let mut request = http::Request::post("/graphql")
        .header("content-type", "application/json")
        .body(axum::body::Body::from(single(QUERY)))
        .expect("a request");
    let peer: SocketAddr = "127.0.0.1:40000".parse().expect("an address");
    request
        .extensions_mut()
        .insert(axum::extract::ConnectInfo(peer));
    request
}

async fn call(router: &Router) -> bytes::Bytes {
    let response = router.clone().oneshot(request()).await.expect("infallible");
    axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("a body")
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

/// `a` and `b` turn about; medians of a, b (µs per request) and of the
/// per-round `a - b` and `a / b`.
fn paired(
    mut a: impl FnMut(u64) -> Duration,
    mut b: impl FnMut(u64) -> Duration,
) -> (f64, f64, f64, f64) {
    a(ITERS);
    b(ITERS);
    let per = |d: Duration| d.as_secs_f64() * 1e6 / ITERS as f64;
    let (mut av, mut bv, mut diff, mut ratio) = (vec![], vec![], vec![], vec![]);
    for round in 0..ROUNDS {
        let (x, y) = if round % 2 == 0 {
            let x = per(a(ITERS));
            (x, per(b(ITERS)))
        } else {
            let y = per(b(ITERS));
            (per(a(ITERS)), y)
        };
        av.push(x);
        bv.push(y);
        diff.push(x - y);
        ratio.push(x / y);
    }
    (
        median(&mut av),
        median(&mut bv),
        median(&mut diff),
        median(&mut ratio),
    )
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
