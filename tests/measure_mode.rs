//! Measure mode: a limit rehearsed on live traffic refuses nothing and
//! counts exactly what enforce mode refused for the same traffic
//! (`fanout_would_refuse_total{limit=...}`), with no change of code.
//!
//! Its own test binary: the Prometheus recorder is process-wide.

use axum::routing::post;
use axum::Router;
use fanout_budget::config::{LimitMode, RateLimitConfig};
use fanout_budget::inbound::RateLimitLayer;
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
