//! The metrics each inbound request and each operation records, read from
//! the Prometheus page, with the recorder installed after the engines were
//! built and before their first request (as an application may order its
//! start-up): `fanout_requests_total{caller}`, `fanout_request_reads`,
//! `fanout_request_seconds`, `fanout_operation_reads{type}`,
//! `fanout_operation_delta{type}`, `fanout_dedup_hits_total`,
//! `fanout_budget_exhausted_total` and `fanout_memory_held_bytes`; and the
//! per-IP limiter's decisions (`fanout_rate_limit_exempt_total`,
//! `fanout_wrong_internal_token_total`, `fanout_rate_limited_total`). Its
//! own binary: the recorder is process-wide.
mod common;

use fanout_budget::cost::{CostTable, FieldCost};
use fanout_budget::inbound::RateLimitLayer;
use fanout_budget::{Config, Engine};
use metrics_exporter_prometheus::PrometheusBuilder;

/// The value of `series` (its name and labels exactly as rendered) on
/// `page`, `None` when it is not there.
fn sample(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit_once(' ')?.1.parse().ok())
}

#[tokio::test]
async fn each_request_and_operation_is_recorded_with_a_recorder_installed_after_the_engine() {
    let upstream = common::Upstream::start().await;
    let mut config = Config::default();
    config.rate_limit.internal_token = "s3cret".into();
    // Priced: the list at 5 reads, its items at none.
    let costs = CostTable::new().field("Query", "items", FieldCost::reads(5));
    let limit = RateLimitLayer::new(&config.rate_limit);
    let engine = Engine::builder(config).costs(costs).build();
    let mut tight = Config::default();
    tight.budget.max_reads = 1;
    tight.rate_limit.requests_per_minute = 1;
    let tight_limit = RateLimitLayer::new(&tight.rate_limit);
    let tight = Engine::new(tight);
    let (app, tight_app) = (
        common::app(&engine, &upstream).layer(limit),
        common::app(&tight, &upstream).layer(tight_limit),
    );

    // Installed once the engines are built, before their first request.
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder of this test binary");

    // A public request: the list and two items, three reads.
    let query = r#"{"query":"{ items(first: 2) { id detail { value } } }"}"#;
    let (status, body) = common::post(&app, query).await;
    assert_eq!(status, 200, "{body}");
    // An internal caller's batch of two operations sharing the list: one
    // read, the other answered by the request's de-duplication.
    let list = "{ items(first: 1) { id } }".to_string();
    let batch = common::batch([list.clone(), list]);
    let (status, body) = common::post_with(&app, batch, &[("x-internal-token", "s3cret")]).await;
    assert_eq!(status, 200, "{body}");
    // One read allowed: the list sent, its two items refused.
    let (status, body) = common::post(&tight_app, query).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        common::codes(&body),
        ["FANOUT_BUDGET_EXHAUSTED", "FANOUT_BUDGET_EXHAUSTED"],
        "{body}"
    );
    // Past its one request a minute: refused before the engine, once with
    // a wrong internal token.
    let (status, body) = common::post_with(&tight_app, query, &[("x-internal-token", "no")]).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(common::codes(&body), ["RATE_LIMITED"], "{body}");
    let (status, _) = common::post(&tight_app, query).await;
    assert_eq!(status, 429);

    let page = handle.render();
    let at = |series: &str| {
        sample(&page, series).unwrap_or_else(|| panic!("{series} missing from:\n{page}"))
    };
    assert_eq!(at(r#"fanout_requests_total{caller="public"}"#), 2.0);
    assert_eq!(at(r#"fanout_requests_total{caller="internal"}"#), 1.0);
    assert_eq!(
        (
            at("fanout_request_reads_count"),
            at("fanout_request_reads_sum")
        ),
        (3.0, 3.0 + 1.0 + 1.0),
        "each request's reads"
    );
    assert_eq!(at("fanout_request_seconds_count"), 3.0);
    assert_eq!(
        (
            at(r#"fanout_operation_reads_count{type="query"}"#),
            at(r#"fanout_operation_reads_sum{type="query"}"#)
        ),
        (4.0, 3.0 + 1.0 + 0.0 + 1.0),
        "each operation's reads"
    );
    // Priced on the first engine only: 5 − 3, then 5 − 1 and 5 − 0.
    assert_eq!(
        (
            at(r#"fanout_operation_delta_count{type="query"}"#),
            at(r#"fanout_operation_delta_sum{type="query"}"#)
        ),
        (3.0, 2.0 + 4.0 + 5.0)
    );
    assert_eq!(at("fanout_dedup_hits_total"), 1.0);
    assert_eq!(at("fanout_budget_exhausted_total"), 2.0);
    // Every answer written and dropped: nothing held, once something was.
    assert_eq!(at("fanout_memory_held_bytes"), 0.0);
    assert_eq!(at("fanout_rate_limit_exempt_total"), 1.0);
    assert_eq!(at("fanout_wrong_internal_token_total"), 1.0);
    assert_eq!(at("fanout_rate_limited_total"), 2.0);
}
