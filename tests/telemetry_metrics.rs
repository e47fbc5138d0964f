//! Metrics over OTLP (`telemetry`, the `otel` feature): while a telemetry
//! lives, each upstream request sent is recorded in
//! `http.client.request.duration` (seconds, with its method, server and
//! status) and each inbound request's reads in `fanout.request.reads`,
//! exported to an OTLP/HTTP collector inside the test. Its own binary: the
//! instruments are process-wide.
#![cfg(feature = "otel")]
mod common;

use fanout_budget::config::TelemetryConfig;
use fanout_budget::telemetry::Telemetry;
use fanout_budget::{Config, Engine};
use fanout_testkit::otlp::{attribute_of, Collector, Data, Metric};
use std::time::Duration;

fn histogram_count(metrics: &[Metric], name: &str) -> (u64, f64, Vec<Vec<(String, String)>>) {
    let mut count = 0;
    let mut sum = 0.0;
    let mut attributes = Vec::new();
    // Cumulative: the last export of the metric holds the totals.
    if let Some(Data::Histogram(histogram)) = metrics
        .iter()
        .rev()
        .find(|m| m.name == name)
        .and_then(|m| m.data.clone())
    {
        for point in histogram.data_points {
            count += point.count;
            sum += point.sum.unwrap_or(0.0);
            attributes.push(point.attributes.iter().map(attribute_of).collect());
        }
    }
    (count, sum, attributes)
}

#[tokio::test(flavor = "current_thread")]
async fn reads_and_their_durations_are_exported() {
    let collector = Collector::start().await;
    let upstream = common::Upstream::start().await;
    let telemetry =
        Telemetry::builder(TelemetryConfig::default().otlp_endpoint(collector.base.clone()))
            .metric_interval(Duration::from_secs(3600))
            .build()
            .unwrap()
            .unwrap();
    let engine = Engine::new(Config::default());
    let app = common::app(&engine, &upstream);
    let (status, body) = common::post(
        &app,
        r#"{"query":"{ items(first: 2) { id detail { value } } }"}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");

    let telemetry = tokio::task::spawn_blocking(move || {
        telemetry.flush().unwrap();
        telemetry
    })
    .await
    .unwrap();
    let metrics = collector.metrics();
    let (sent, seconds, attributes) = histogram_count(&metrics, "http.client.request.duration");
    assert_eq!(sent, 3, "the list and two items");
    assert!(seconds > 0.0 && seconds < 30.0, "{seconds} s");
    let host = upstream.addr.ip().to_string();
    let port = upstream.addr.port().to_string();
    for point in &attributes {
        let get = |key: &str| {
            point
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("http.request.method"), Some("GET"), "{point:?}");
        assert_eq!(get("server.address"), Some(host.as_str()), "{point:?}");
        assert_eq!(get("server.port"), Some(port.as_str()), "{point:?}");
        assert_eq!(get("http.response.status_code"), Some("200"), "{point:?}");
    }
    let (requests, reads, _) = histogram_count(&metrics, "fanout.request.reads");
    assert_eq!((requests, reads), (1, 3.0), "one request, three reads");
    tokio::task::spawn_blocking(move || drop(telemetry))
        .await
        .unwrap();
}
