//! The gateway binary exporting its traces: started with
//! `OTEL_EXPORTER_OTLP_ENDPOINT` pointing at an OTLP/HTTP collector inside
//! the test, a batch of two operations is one trace (a SERVER span, an
//! operation span each, CLIENT spans for the registry reads), sent by the
//! time the gateway has stopped on SIGTERM.
mod common;

use fanout_testkit::otlp::{attribute, hex, Collector, SpanKind};
use serde_json::json;
use std::process::{Command, Stdio};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_exports_one_trace_per_request() {
    let collector = Collector::start().await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_fanout-gateway"))
        .args(["--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "error")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.base)
        .env_remove("OTEL_SERVICE_NAME")
        .env_remove("OTEL_TRACES_SAMPLER_ARG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = common::loopback::listening_address(&mut child);
    let batch = json!([
        { "query": r#"{ repository(name: "library/alpine") { tags(first: 2) { nodes { name } } } }"# },
        { "query": r#"{ repository(name: "library/alpine") { tag(name: "1.0") { manifest { digest } } } }"# }
    ]);
    let response = reqwest::Client::new()
        .post(format!("http://{addr}/graphql"))
        .json(&batch)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(
        body[0]["data"]["repository"]["tags"]["nodes"][0]["name"],
        "1.0"
    );

    // Stopped, it sends what is queued.
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let exited = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(exited.success(), "{exited:?}");

    let spans = collector
        .wait_for(Duration::from_secs(10), "the request's spans", |spans| {
            spans.iter().any(|r| r.span.kind == SpanKind::Server as i32)
        })
        .await;
    let servers: Vec<_> = spans
        .iter()
        .filter(|r| r.span.kind == SpanKind::Server as i32)
        .collect();
    assert_eq!(servers.len(), 1, "one SERVER span per request");
    let root = &servers[0];
    assert_eq!(root.service, "fanout-gateway");
    assert_eq!(
        attribute(&root.span, "fanout.operations").as_deref(),
        Some("2")
    );
    let trace = hex(&root.span.trace_id);
    assert!(
        spans.iter().all(|r| hex(&r.span.trace_id) == trace),
        "one trace"
    );
    let operations = spans
        .iter()
        .filter(|r| attribute(&r.span, "graphql.operation.type").is_some())
        .count();
    assert_eq!(operations, 2, "a span per operation");
    let clients = spans
        .iter()
        .filter(|r| r.span.kind == SpanKind::Client as i32)
        .count();
    let reads: u64 = attribute(&root.span, "fanout.reads")
        .unwrap()
        .parse()
        .unwrap();
    assert!(reads > 0);
    assert_eq!(clients as u64, reads, "a CLIENT span per read sent");
}
