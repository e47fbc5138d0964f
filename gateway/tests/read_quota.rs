//! The gateway with a read quota (`[quota]`): the upstream reads a client
//! causes stop at its quota, then 429 `QUOTA_EXHAUSTED` with the quota's
//! `RateLimit` fields beside the per-IP limit's; `fanoutQuota` and
//! `extensions.fanout.quota` show it.
mod common;

use common::*;
use fanout_budget::config::QuotaConfig;
use fanout_budget::Config;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde_json::json;
use std::sync::OnceLock;
use std::time::SystemTime;

/// The process's Prometheus recorder (installed once; only the first test
/// of this binary has a quota).
fn recorder() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| PrometheusBuilder::new().install_recorder().unwrap())
}

/// `fanout_quota_reads_total{class="reads", outcome}`.
fn quota_reads(outcome: &str) -> u64 {
    let page = recorder().render();
    let outcome = format!("outcome=\"{outcome}\"");
    let labels = ["class=\"reads\"", outcome.as_str()];
    fanout_testkit::prometheus::value(&page, "fanout_quota_reads_total", &labels).unwrap_or(0.0)
        as u64
}

const QUERY: &str = r#"{ repository(name: "acme/app") { tag(name: "t01") { manifest { config { os } } } } fanoutQuota { limit remaining resetAt } }"#;

#[tokio::test]
async fn a_client_is_answered_until_its_quota_is_spent_then_refused() {
    recorder();
    let mut config = Config::default();
    // 10 reads an hour: nothing refills while the test runs.
    config.quota = QuotaConfig::default().reads(10).period_secs(3600);
    let f = Fixture::new(config).await;
    let body = json!({ "query": QUERY }).to_string();
    let peer = "198.51.100.9:5000";
    let mut answered = 0;
    let before = f.reads();
    let refused = loop {
        let (status, headers, json) = post_from(&f.gateway.router, &body, peer, &[]).await;
        if status == 429 {
            break (headers, json);
        }
        assert_eq!(status, 200, "{json}");
        answered += 1;
        assert!(answered <= 10, "never refused");
        let quota = &json["data"]["fanoutQuota"];
        assert_eq!(quota["limit"], 10, "{json}");
        // The field shows the quota when it resolved, the extension when
        // the operation finished: no more left by then.
        let end = &json["extensions"]["fanout"]["quota"];
        assert_eq!(end["limit"], 10, "{json}");
        assert!(
            quota["remaining"].as_u64() >= end["remaining"].as_u64(),
            "{json}"
        );
        let reset = humantime::parse_rfc3339(quota["resetAt"].as_str().unwrap()).unwrap();
        assert!(reset <= SystemTime::now() + std::time::Duration::from_secs(3600));
        // The estimate (3 reads) is the budget.
        assert_eq!(json["extensions"]["fanout"]["limit"], 3, "{json}");
    };
    let reads = f.reads() - before;
    assert!(reads <= 10, "{reads} upstream reads past a quota of 10");
    // Reserved less refunded is what was read; the config blob, cached by
    // digest after the first request, was reserved and given back.
    let (reserved, refunded) = (quota_reads("reserved"), quota_reads("refunded"));
    assert_eq!(
        reserved - refunded,
        reads,
        "reserved {reserved}, refunded {refunded}"
    );
    assert!(refunded >= 1, "the cached reads came back");
    assert!(quota_reads("refused") >= 1);
    assert!(answered >= 3, "only {answered} answered");
    let (headers, json) = refused;
    let ext = &json["errors"][0]["extensions"];
    assert_eq!(ext["code"], "QUOTA_EXHAUSTED", "{json}");
    assert_eq!(ext["limit"], 10);
    assert!(ext["remaining"].as_u64().unwrap() < 3, "{json}");
    assert!(ext["retryAfterMs"].as_u64().unwrap() > 0);
    assert!(
        headers["retry-after"]
            .to_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 1
    );
    let policies: Vec<_> = headers.get_all("ratelimit-policy").iter().collect();
    assert!(
        policies.iter().any(|p| *p == "\"reads\";q=10;w=3600"),
        "{policies:?}"
    );
    assert!(
        policies
            .iter()
            .any(|p| p.to_str().unwrap().starts_with("\"per-ip\"")),
        "{policies:?}"
    );
    // A request that reads nothing is still answered, and shows the quota.
    let cheap = json!({ "query": "{ fanoutQuota { remaining } }" }).to_string();
    let (status, _, json) = post_from(&f.gateway.router, &cheap, peer, &[]).await;
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["data"]["fanoutQuota"]["remaining"], ext["remaining"]);
    // Another client has its own quota.
    let (status, _, json) = post_from(&f.gateway.router, &body, "198.51.100.10:5000", &[]).await;
    assert_eq!(status, 200, "{json}");
}

#[tokio::test]
async fn without_a_quota_the_field_is_null_and_nothing_is_shown() {
    let f = Fixture::default().await;
    let (status, _, json) = post_from(
        &f.gateway.router,
        &json!({ "query": QUERY }).to_string(),
        "198.51.100.11:5000",
        &[],
    )
    .await;
    assert_eq!(status, 200, "{json}");
    assert!(json["data"]["fanoutQuota"].is_null(), "{json}");
    assert!(
        json["extensions"]["fanout"].get("quota").is_none(),
        "{json}"
    );
}
