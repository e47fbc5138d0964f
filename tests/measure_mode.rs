//! Measure mode: a limit rehearsed on live traffic refuses nothing and
//! counts exactly what enforce mode refused for the same traffic
//! (`fanout_would_refuse_total{limit=...}`), with no change of code.
//!
//! Its own test binary: the Prometheus recorder is process-wide.

mod common;

use axum::routing::post;
use axum::Router;
use fanout_budget::config::{LimitMode, RateLimitConfig};
use fanout_budget::cost::{CostTable, FieldCost};
use fanout_budget::inbound::RateLimitLayer;
use fanout_budget::{Config, Engine};
use fanout_testkit::prometheus::value;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use std::net::SocketAddr;
use std::sync::OnceLock;

fn recorder() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| PrometheusBuilder::new().install_recorder().unwrap())
}

fn would_refuse(limit: &str) -> f64 {
    let page = recorder().render();
    value(
        &page,
        "fanout_would_refuse_total",
        &[&format!("limit=\"{limit}\"")],
    )
    .unwrap_or(0.0)
}

/// A server whose one route is behind the per-IP limit in `mode`.
async fn server(mode: LimitMode) -> (SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>) {
    let config = fanout_budget::Config::default().rate_limit(
        RateLimitConfig::default()
            .requests_per_minute(10)
            .mode(mode),
    );
    let app = Router::new()
        .route("/graphql", post(|| async { "ok" }))
        .route_layer(RateLimitLayer::new(&config.rate_limit));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let serving = fanout_budget::inbound::serve(listener, app, &config);
    (addr, tokio::spawn(async move { serving.await }))
}

/// The same traffic (40 requests of one client at once, against 10 a
/// minute) in each mode: the statuses, and the rate limit's headers.
async fn replay(mode: LimitMode) -> (Vec<u16>, Vec<String>) {
    let (addr, task) = server(mode).await;
    let client = fanout_budget::reqwest::Client::new();
    let mut statuses = Vec::new();
    let mut limits = Vec::new();
    for _ in 0..40 {
        let response = client
            .post(format!("http://{addr}/graphql"))
            .send()
            .await
            .unwrap();
        statuses.push(response.status().as_u16());
        let header = response.headers().get("ratelimit");
        limits.push(
            header
                .map(|h| h.to_str().unwrap().to_string())
                .unwrap_or_default(),
        );
    }
    task.abort();
    (statuses, limits)
}

#[tokio::test]
async fn the_per_ip_limit_in_measure_mode_lets_all_through_and_counts_what_enforce_refused() {
    recorder();
    let (enforced, _) = replay(LimitMode::Enforce).await;
    let refused = enforced.iter().filter(|s| **s == 429).count();
    assert!(
        refused > 20,
        "enforce refused {refused} of 40: {enforced:?}"
    );
    assert_eq!(would_refuse("rate_limit"), 0.0, "enforce measures nothing");
    let (measured, limits) = replay(LimitMode::Measure).await;
    assert!(measured.iter().all(|s| *s == 200), "{measured:?}");
    assert_eq!(
        would_refuse("rate_limit"),
        refused as f64,
        "measure counts exactly what enforce refused"
    );
    // The client is shown what enforce would show: nothing left.
    let exhausted = limits.iter().filter(|l| l.contains("r=0;")).count();
    assert!(exhausted >= refused, "{limits:?}");
}

#[test]
fn the_mode_is_a_key_of_the_file() {
    let config = fanout_budget::Config::from_toml("[rate_limit]\nmode = \"measure\"\n").unwrap();
    assert_eq!(config.rate_limit.mode, LimitMode::Measure);
    assert_eq!(
        fanout_budget::Config::default().rate_limit.mode,
        LimitMode::Enforce
    );
    let wrong = fanout_budget::Config::from_toml("[rate_limit]\nmode = \"shadow\"\n").unwrap_err();
    assert_eq!(wrong.key(), Some("rate_limit.mode"));
}

/// One request reading a list and its five items' details (six reads)
/// against a budget of three, in `mode`: the codes of its errors, the
/// requests sent, and its `extensions.fanout`.
async fn over_budget(mode: LimitMode) -> (Vec<String>, u64, serde_json::Value) {
    let upstream = common::Upstream::start().await;
    let mut config = Config::default();
    config.budget.max_reads = 3;
    config.budget.mode = mode;
    let engine = Engine::new(config);
    let app = common::app(&engine, &upstream);
    let query = r#"{"query":"{ items(first: 5) { id detail { value } } }"}"#;
    let (status, answer) = common::post(&app, query).await;
    assert_eq!(status, 200);
    let codes = common::codes(&answer);
    (
        codes,
        upstream.requests(),
        answer["extensions"]["fanout"].clone(),
    )
}

#[tokio::test]
async fn the_request_budget_in_measure_mode_sends_and_counts_what_enforce_refused() {
    recorder();
    let before = would_refuse("budget");
    let (codes, sent, fanout) = over_budget(LimitMode::Enforce).await;
    let refused = codes
        .iter()
        .filter(|c| *c == "FANOUT_BUDGET_EXHAUSTED")
        .count();
    assert_eq!((refused, sent), (3, 3), "{codes:?} {fanout}");
    assert_eq!(would_refuse("budget"), before, "enforce measures nothing");
    let (codes, sent, fanout) = over_budget(LimitMode::Measure).await;
    assert!(codes.is_empty(), "nothing refused: {codes:?}");
    assert_eq!(sent, 6, "every read sent");
    assert_eq!(would_refuse("budget") - before, refused as f64);
    assert_eq!(fanout["used"], 6, "used counts the reads sent: {fanout}");
    assert_eq!(fanout["remaining"], 0, "never below 0: {fanout}");
    assert_eq!(fanout["wouldRefuse"], 3, "{fanout}");
}

#[tokio::test]
async fn a_batch_priced_past_its_budget_in_measure_mode_runs_and_is_counted_once() {
    recorder();
    let upstream = common::Upstream::start().await;
    let run = |mode: LimitMode| {
        let mut config = Config::default();
        config.budget.max_reads = 2;
        config.budget.refuse_over_estimate = true;
        config.budget.mode = mode;
        let costs = CostTable::new().field("Query", "items", FieldCost::reads(1));
        let engine = Engine::builder(config).costs(costs).build();
        common::app(&engine, &upstream)
    };
    // Three operations of one read each: 3 > 2.
    let batch = common::batch((0..3).map(|_| "{ items(first: 1) { id } }".to_string()));
    let before = would_refuse("estimate");
    let (_, enforced) = common::post(&run(LimitMode::Enforce), batch.clone()).await;
    let codes = common::codes(&enforced);
    assert!(
        codes.iter().any(|c| c == "FANOUT_ESTIMATE_EXCEEDS_BUDGET"),
        "{enforced}"
    );
    let (_, measured) = common::post(&run(LimitMode::Measure), batch).await;
    assert!(common::codes(&measured).is_empty(), "{measured}");
    assert_eq!(
        would_refuse("estimate") - before,
        1.0,
        "one request, counted once"
    );
}

/// Five requests of one client, three reads each, against a read quota of
/// ten reads an hour and a budget of four, in `mode`: the statuses, and
/// the reads the upstream saw.
async fn over_quota(mode: LimitMode) -> (Vec<u16>, u64) {
    let upstream = common::Upstream::start().await;
    let mut config = Config::default();
    config.budget.max_reads = 4;
    config.quota.reads = 10;
    config.quota.mode = mode;
    let engine = Engine::new(config.clone());
    let app = common::app(&engine, &upstream);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let serving = fanout_budget::inbound::serve(listener, app, &config);
    let task = tokio::spawn(async move { serving.await });
    let client = fanout_budget::reqwest::Client::new();
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let response = client
            .post(format!("http://{addr}/graphql"))
            .header("content-type", "application/json")
            .body(r#"{"query":"{ items(first: 2) { id detail { value } } }"}"#)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        if status != 200 && mode == LimitMode::Measure {
            println!("{}", response.text().await.unwrap());
        }
        statuses.push(status);
    }
    task.abort();
    (statuses, upstream.requests())
}

#[tokio::test]
async fn the_read_quota_in_measure_mode_runs_every_request_and_counts_what_enforce_refused() {
    recorder();
    let before = would_refuse("quota");
    let (enforced, sent) = over_quota(LimitMode::Enforce).await;
    let refused = enforced.iter().filter(|s| **s == 429).count();
    assert!(refused >= 1, "{enforced:?}");
    assert_eq!(sent, 3 * (5 - refused) as u64, "{enforced:?}");
    assert_eq!(would_refuse("quota"), before, "enforce measures nothing");
    let (measured, sent) = over_quota(LimitMode::Measure).await;
    assert!(measured.iter().all(|s| *s == 200), "{measured:?}");
    assert_eq!(sent, 15, "every read sent");
    assert_eq!(
        would_refuse("quota") - before,
        (3 * refused) as f64,
        "the reads of the requests enforce refused"
    );
}
