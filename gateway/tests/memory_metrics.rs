//! The memory bounds on `/metrics`: what the requests in flight hold
//! (`fanout_memory_held_bytes`, back to 0 when they end) and the requests
//! each bound stopped (`fanout_memory_trips_total{bound}`). Its own test
//! binary: the recorder is process-wide.

use fanout_budget::Config;
use fanout_gateway::app;
use fanout_gateway::embedded::EmbeddedRegistry;
use fanout_testkit::prometheus::value;
use metrics_exporter_prometheus::PrometheusBuilder;
use serde_json::json;
use std::sync::Arc;
use tower::ServiceExt;

#[tokio::test]
async fn what_requests_hold_and_what_stopped_them_are_on_metrics() {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder of this test binary");
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    let mut config = Config::default();
    config.http.max_answer_bytes = 1 << 20;
    let render: app::MetricsRender = Arc::new(move || handle.render());
    let gateway = app::build(config, registry.url().parse().unwrap(), Some(render));
    let page = || fanout_testkit::metrics_page(&gateway.router);
    let held = |page: &str| {
        value(page, "fanout_memory_held_bytes", &[]).or_else(|| {
            // A gauge without labels is `name value`.
            page.lines()
                .find_map(|l| l.strip_prefix("fanout_memory_held_bytes "))
                .and_then(|v| v.trim().parse().ok())
        })
    };

    // An answer not read yet holds its bytes.
    let query = r#"{ repository(name: "acme/app") { tags(first: 60) { nodes { name manifest { digest } } } } }"#;
    let body = json!({ "query": query }).to_string();
    let request =
        fanout_testkit::graphql_request(body, &[], Some(fanout_testkit::PEER.parse().unwrap()));
    let unread = gateway.router.clone().oneshot(request).await.unwrap();
    assert_eq!(unread.status(), 200);
    let holding = held(&page().await).expect("the gauge is on the page");
    assert!(
        holding >= 4096.0,
        "an unread answer holds its bytes: {holding}"
    );
    drop(unread);
    assert_eq!(
        held(&page().await),
        Some(0.0),
        "given back when the body is dropped"
    );

    // Past the answer's bound: counted under `bound="answer"`.
    let aliases: String = (0..40)
        .map(|i| {
            format!("a{i}: tags(first: 60) {{ nodes {{ name manifest {{ digest mediaType }} }} }} ")
        })
        .collect();
    let query = format!(r#"{{ repository(name: "acme/app") {{ {aliases}}} }}"#);
    let answer =
        fanout_testkit::post(&gateway.router, json!({ "query": query }).to_string(), &[]).await;
    assert_eq!(
        answer.json()["errors"][0]["extensions"]["code"],
        "RESPONSE_TOO_LARGE",
        "{:?}",
        answer.json()
    );
    let page = page().await;
    assert_eq!(
        value(&page, "fanout_memory_trips_total", &["bound=\"answer\""]),
        Some(1.0)
    );
    assert_eq!(held(&page), Some(0.0));
}
