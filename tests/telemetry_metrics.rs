//! Metrics over OTLP (`telemetry`, the `otel` feature): while a telemetry
//! lives, each upstream request sent is recorded in
//! `http.client.request.duration` (seconds, with its method, server and
//! status), each inbound request's reads in `fanout.request.reads`, and
//! each operation's reads and `requested − reads` in
//! `fanout.operation.reads` and `fanout.operation.delta`,
//! exported to an OTLP/HTTP collector inside the test. A host without a
//! `[hosts]` table is `server.address = "other"`, as on the Prometheus
//! page. Its own binary: the instruments are process-wide.
#![cfg(feature = "otel")]
mod common;

use fanout_budget::config::{HostConfig, TelemetryConfig};
use fanout_budget::cost::{CostTable, FieldCost};
use fanout_budget::telemetry::Telemetry;
use fanout_budget::{Config, Engine};
use fanout_testkit::otlp::{attribute_of, Collector, Data, Metric};
use std::time::Duration;

/// Per data point, its count and its sorted attributes.
type Points = Vec<(u64, Vec<(String, String)>)>;

/// A histogram's total count and sum, and its data points.
fn histogram(metrics: &[Metric], name: &str) -> (u64, f64, Points) {
    let (mut count, mut sum, mut points) = (0, 0.0, Vec::new());
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
            let mut attributes: Vec<_> = point.attributes.iter().map(attribute_of).collect();
            attributes.sort();
            points.push((point.count, attributes));
        }
    }
    points.sort();
    (count, sum, points)
}

/// `telemetry` after a flush of its spans and metrics, made off the
/// runtime's thread (the export runs on it).
async fn flushed(telemetry: Telemetry) -> Telemetry {
    tokio::task::spawn_blocking(move || {
        telemetry.flush().unwrap();
        telemetry
    })
    .await
    .unwrap()
}

fn kv(key: &str, value: &str) -> (String, String) {
    (key.to_owned(), value.to_owned())
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
    let query = r#"{"query":"{ items(first: 2) { id detail { value } } }"}"#;
    // First an operation not priced: its reads are recorded, and no
    // `fanout.operation.delta` series exists, not even an empty one (a
    // thread binds a series only once it has recorded on it).
    let engine = Engine::builder(Config::default()).build();
    let (status, body) = common::post(&common::app(&engine, &upstream), query).await;
    assert_eq!(status, 200, "{body}");
    let telemetry = flushed(telemetry).await;
    let metrics = collector.metrics();
    assert_eq!(histogram(&metrics, "fanout.operation.reads").0, 1);
    let (_, _, points) = histogram(&metrics, "fanout.operation.delta");
    assert!(points.is_empty(), "no series: {points:?}");
    // The same reads through an engine whose `[hosts]` names the upstream,
    // and through one that does not, priced; recorded on the series this
    // thread bound.
    let named = Config::default().host(upstream.host(), HostConfig::default());
    // Priced: the list at 5 reads, its items at none (three sent).
    let costs = CostTable::new().field("Query", "items", FieldCost::reads(5));
    for config in [named, Config::default()] {
        let engine = Engine::builder(config).costs(costs.clone()).build();
        let (status, body) = common::post(&common::app(&engine, &upstream), query).await;
        assert_eq!(status, 200, "{body}");
    }

    let telemetry = flushed(telemetry).await;
    let metrics = collector.metrics();
    let (sent, seconds, points) = histogram(&metrics, "http.client.request.duration");
    assert_eq!(sent, 9, "the list and two items, three times");
    assert!(seconds > 0.0 && seconds < 30.0, "{seconds} s");
    let mut named = vec![
        kv("http.request.method", "GET"),
        kv("http.response.status_code", "200"),
        kv("server.address", &upstream.addr.ip().to_string()),
        kv("server.port", &upstream.addr.port().to_string()),
    ];
    named.sort();
    let other = vec![
        kv("http.request.method", "GET"),
        kv("http.response.status_code", "200"),
        kv("server.address", "other"),
    ];
    let mut expected = vec![(3, named), (6, other)];
    expected.sort();
    assert_eq!(
        points, expected,
        "a configured host by name, any other as `other`"
    );
    let (answered, seconds, points) = histogram(&metrics, "http.server.request.duration");
    assert!(seconds > 0.0 && seconds < 30.0, "{seconds} s");
    let mut server = vec![
        kv("http.request.method", "POST"),
        kv("http.response.status_code", "200"),
        kv("http.route", "/graphql"),
    ];
    server.sort();
    assert_eq!((answered, points), (3, vec![(3, server)]));
    let (requests, reads, _) = histogram(&metrics, "fanout.request.reads");
    assert_eq!(
        (requests, reads),
        (3, 9.0),
        "three requests, three reads each"
    );
    let query = vec![kv("graphql.operation.type", "query")];
    let (operations, reads, points) = histogram(&metrics, "fanout.operation.reads");
    assert_eq!(
        (operations, reads),
        (3, 9.0),
        "three operations, three reads each"
    );
    assert_eq!(points, vec![(3, query.clone())]);
    let (priced, delta, points) = histogram(&metrics, "fanout.operation.delta");
    assert_eq!((priced, delta), (2, 4.0), "priced at 5, three sent: 2 each");
    assert_eq!(points, vec![(2, query)]);
    tokio::task::spawn_blocking(move || drop(telemetry))
        .await
        .unwrap();
}
