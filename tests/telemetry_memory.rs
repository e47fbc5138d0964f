//! A collector that takes connections and never answers costs bounded
//! memory (`telemetry`, the `otel` feature): 60,000 reads, each with its
//! `upstream.read` and CLIENT spans, are exported to it while it hangs;
//! the spans past the export queue are dropped (and counted), never held.
//! In a child process under an address-space limit
//! (`fanout_testkit::child`), so a queue without bound ends the child, not
//! the suite; the resident memory gained is read from the kernel.
//!
//! `cargo test --test telemetry_memory -- --nocapture` prints the figures.
#![cfg(feature = "otel")]

use bytes::Bytes;
use fanout_budget::config::TelemetryConfig;
use fanout_budget::read::Transport;
use fanout_budget::telemetry::Telemetry;
use fanout_budget::{inbound::Caller, Config, Engine, Read, ReadError, UpstreamResponse};
use fanout_testkit::child;
use futures::future::BoxFuture;
use http::{HeaderMap, StatusCode};
use std::sync::Arc;
use std::time::Duration;
use tracing_subscriber::layer::SubscriberExt as _;

/// Reads per round; four rounds.
const ROUND: u64 = 15_000;

/// Answers every read `200` at once.
struct Answers;

impl Transport for Answers {
    fn fetch<'a>(
        &'a self,
        _read: Read,
        host: &'a str,
    ) -> BoxFuture<'a, Result<UpstreamResponse, ReadError>> {
        let body = Bytes::from_static(b"{}");
        Box::pin(async move {
            Ok(UpstreamResponse::new(
                host,
                StatusCode::OK,
                HeaderMap::new(),
                body,
            ))
        })
    }
}

/// In the child: reads with a telemetry exporting to a collector that
/// hangs, reporting the resident memory gained after each round.
fn run_reads() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let hung = fanout_testkit::hung::Hung::start(fanout_testkit::hung::Hangs::Holds).await;
        let hanging = hung.base.clone();
        let telemetry = Telemetry::builder(TelemetryConfig::default().otlp_endpoint(hanging))
            .export_interval(Duration::from_millis(20))
            .export_timeout(Duration::from_millis(200))
            .build()
            .unwrap()
            .unwrap();
        let subscriber = tracing_subscriber::registry().with(telemetry.layer());
        tracing::subscriber::set_global_default(subscriber).unwrap();
        let engine = Engine::builder(Config::default())
            .transport(Arc::new(Answers))
            .build();
        let before = child::rss_mib();
        for round in 0..4 {
            for batch in 0..ROUND / 100 {
                // A request of 100 distinct reads.
                let request = engine.begin_request(Caller::Internal);
                let op = request.operation();
                for i in 0..100 {
                    let url = format!("http://upstream.local/r{round}/{batch}/{i}");
                    op.upstream()
                        .read(Read::get(url.parse().unwrap()))
                        .await
                        .unwrap();
                }
            }
            child::report(format!("{:.1}", child::rss_mib() - before));
        }
        std::mem::forget(telemetry); // its shutdown would wait on the collector
    });
}

#[test]
fn a_hanging_collector_holds_no_more_than_the_export_queue() {
    if child::case().is_some() {
        return run_reads();
    }
    let test = "a_hanging_collector_holds_no_more_than_the_export_queue";
    let run = child::run(test, "reads", 1024, Duration::from_secs(300));
    assert!(
        run.success,
        "the child ended {}:\n{}",
        run.ended, run.output
    );
    let gained: Vec<f64> = run.reports.iter().map(|r| r.parse().unwrap()).collect();
    println!("resident MiB gained after each {ROUND} reads: {gained:?}");
    assert_eq!(gained.len(), 4);
    // 120,000 spans were made; 2,048 wait at most. Held, they would be
    // tens of MiB and growing each round.
    let last = gained[3];
    assert!(last < 24.0, "{last:.1} MiB resident after 60,000 reads");
    assert!(
        gained[3] - gained[1] < 8.0,
        "memory grows with the spans made: {gained:?}"
    );
}
