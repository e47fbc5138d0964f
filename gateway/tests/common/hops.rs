//! Engines chained over loopback HTTP, for `gateway/tests/chain.rs` and
//! the `chain` bench: each hop is served by `fanout_budget::inbound::serve`
//! on a listener of its own and counted (with the `Fanout-Budget` each
//! request carried) by a layer around its router.
//!
//! Not part of `common/mod.rs`: it uses `crate::example`
//! (`examples/chain.rs`), which the including target declares.
#![allow(dead_code)] // each target uses a part

use crate::example;
use axum::Router;
use fanout_budget::{Config, Engine};
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// Ten manifests after their tag list: 11 registry reads at the gateway.
pub const TEN_MANIFESTS: &str =
    r#"{ repository(name: "acme/app") { tags(first: 10) { nodes { manifest { digest } } } } }"#;

/// A listener on a free loopback port, and its GraphQL URL.
pub async fn bind() -> (TcpListener, reqwest::Url) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let url = format!("http://{}/graphql", listener.local_addr().expect("bound"));
    (listener, url.parse().expect("a URL"))
}

/// A service being served; stopped when dropped.
pub struct Server(JoinHandle<()>);

impl Server {
    pub fn start(listener: TcpListener, router: Router, config: &Config) -> Self {
        let serve = fanout_budget::inbound::serve(listener, router, config);
        Self(tokio::spawn(async move {
            let _ = serve.await;
        }))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The requests a service received, each with its `Fanout-Budget` (`None`:
/// without one), in the order they arrived.
#[derive(Default)]
pub struct Seen(Mutex<Vec<Option<String>>>);

impl Seen {
    pub fn count(&self) -> u64 {
        self.0.lock().unwrap().len() as u64
    }

    pub fn budgets(&self) -> Vec<Option<String>> {
        self.0.lock().unwrap().clone()
    }

    /// Forgets what was received.
    pub fn clear(&self) {
        self.0.lock().unwrap().clear();
    }

    /// Member `key` of every request's header, sorted (a request without
    /// the header, or without the member, is a failure).
    pub fn members(&self, key: &str) -> Vec<u64> {
        let mut all: Vec<u64> = (self.budgets().iter())
            .map(|b| member(b.as_deref().expect("a Fanout-Budget"), key).expect(key))
            .collect();
        all.sort_unstable();
        all
    }
}

/// `router`, with every request it receives recorded.
pub fn counted(router: Router) -> (Router, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let record = seen.clone();
    let layer = tower::util::MapRequestLayer::new(move |request: axum::extract::Request| {
        let budget =
            (request.headers().get("fanout-budget")).map(|v| v.to_str().unwrap().to_string());
        record.0.lock().unwrap().push(budget);
        request
    });
    (router.layer(layer), seen)
}

/// Member `key` of a `Fanout-Budget` value as the engine writes it
/// (`reads=G, deadline-ms=D, hops=H`).
pub fn member(budget: &str, key: &str) -> Option<u64> {
    budget.split(", ").find_map(|m| {
        let (k, v) = m.split_once('=')?;
        (k == key).then(|| v.parse().unwrap())
    })
}

/// `leaf` asked through one `fan` per width, the outermost first:
/// `nest(&[10, 10], leaf)` is A's query whose every row asks B for
/// `{ fan(width: 10, query: leaf) { answer } }`.
pub fn nest(widths: &[u32], leaf: &str) -> String {
    widths.iter().rev().fold(leaf.to_string(), |inner, width| {
        let inner = serde_json::to_string(&inner).expect("a string"); // a GraphQL string too
        format!("{{ fan(width: {width}, query: {inner}) {{ answer }} }}")
    })
}

/// The inner hops' budget (B's and the gateway's).
pub const INNER_BUDGET: u64 = 100;

/// B's and the gateway's limits: generous, so that only what the edge
/// sends down the chain bounds them.
pub fn roomy(config: &mut Config) {
    config.budget.max_reads = INNER_BUDGET;
    config.budget.deadline_ms = 60_000;
    config.budget.read_timeout_ms = 60_000;
    config.http.max_connections_per_client = 1_000;
    config.rate_limit.requests_per_minute = u32::MAX;
}

/// A hop being served: where it listens, what it received.
pub struct Hop {
    pub url: reqwest::Url,
    pub seen: Arc<Seen>,
    pub server: Server,
}

/// The gateway (`app::build`, roomy) reading the registry at `upstream`.
pub async fn gateway(upstream: reqwest::Url) -> Hop {
    let (listener, url) = bind().await;
    let mut config = Config::default();
    roomy(&mut config);
    let gateway = fanout_gateway::app::build(config.clone(), upstream, None);
    let (router, seen) = counted(gateway.router);
    let server = Server::start(listener, router, &config);
    Hop { url, seen, server }
}

/// `examples/chain.rs` calling `next`, its reads to `next` marked
/// `propagate` or not; `limits` sets the rest of its configuration.
pub async fn service(next: reqwest::Url, propagate: bool, limits: impl FnOnce(&mut Config)) -> Hop {
    let (listener, url) = bind().await;
    let mut config = example::config(&next);
    limits(&mut config);
    config.upstreams.get_mut("next").expect("next").propagate = propagate;
    let (router, seen) = counted(example::app(Engine::new(config.clone()), next));
    let server = Server::start(listener, router, &config);
    Hop { url, seen, server }
}
