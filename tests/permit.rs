//! A call that is not HTTP under the bounds of a read (examples/database.rs):
//! each query is charged, holds its host's slot, and is cut by the read
//! timeout; a batch of them never runs more than the cap at once.
mod common;
#[path = "../examples/database.rs"]
mod example;

use common::*;
use example::{Database, DB};
use fanout_budget::config::HostConfig;
use fanout_budget::{Config, Engine};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::Duration;

fn config(max_reads: u64, cap: u32, read_timeout_ms: u64) -> Config {
    let mut config = Config::default();
    config.budget.max_reads = max_reads;
    config.budget.read_timeout_ms = read_timeout_ms;
    config.hosts.insert(
        DB.to_string(),
        HostConfig::default()
            .max_concurrent(cap)
            .acquire_wait_ms(10_000),
    );
    config
}

#[tokio::test(start_paused = true)]
async fn queries_are_charged_capped_and_cut_like_reads() {
    let db = Arc::new(Database {
        latency: Duration::from_millis(50),
        ..Database::default()
    });
    // A budget of 4, a cap of 2: six rows asked, four run, two at a time.
    let app = example::app(Engine::new(config(4, 2, 1_000)), db.clone());
    let query =
        "{ a: row(id: 1) b: row(id: 2) c: row(id: 3) d: row(id: 4) e: row(id: 5) f: row(id: 6) }";
    let (status, answer) = post(&app, serde_json::json!({ "query": query }).to_string()).await;
    assert_eq!(status, 200);
    assert_eq!(db.queries.load(SeqCst), 4, "{answer}");
    assert_eq!(db.peak.load(SeqCst), 2, "the host cap holds");
    let mut refused = codes(&answer);
    refused.sort();
    assert_eq!(
        refused,
        ["FANOUT_BUDGET_EXHAUSTED", "FANOUT_BUDGET_EXHAUSTED"]
    );
    assert_eq!(answer["extensions"]["fanout"]["used"], 4);
    assert_eq!(answer["extensions"]["fanout"]["operationReads"], 4);

    // A batch shares one budget: 3 + 3 rows asked of a budget of 4 — four
    // run, two are refused, across both operations.
    let db = Arc::new(Database {
        latency: Duration::from_millis(50),
        ..Database::default()
    });
    let app = example::app(Engine::new(config(4, 2, 1_000)), db.clone());
    let ops = [
        "{ a: row(id: 1) b: row(id: 2) c: row(id: 3) }".to_string(),
        "{ d: row(id: 4) e: row(id: 5) f: row(id: 6) }".to_string(),
    ];
    let (_, answer) = post(&app, batch(ops)).await;
    assert_eq!(db.queries.load(SeqCst), 4, "{answer}");
    assert_eq!(codes(&answer).len(), 2, "{answer}");
    assert_eq!(
        fanout_testkit::operation_reads(answer.as_array().unwrap()),
        4
    );

    // A query slower than the read timeout is cut, named UPSTREAM_TIMEOUT.
    let slow = Arc::new(Database {
        latency: Duration::from_secs(5),
        ..Database::default()
    });
    let app = example::app(Engine::new(config(10, 2, 300)), slow);
    let started = tokio::time::Instant::now();
    let (_, answer) = post(&app, r#"{"query":"{ row(id: 1) }"}"#).await;
    assert_eq!(codes(&answer), ["UPSTREAM_TIMEOUT"]);
    assert_eq!(answer["errors"][0]["extensions"]["host"], DB);
    assert_eq!(started.elapsed(), Duration::from_millis(300));
    assert!(answer["data"]["row"].is_null());
}

#[tokio::test(start_paused = true)]
async fn a_permit_counts_as_a_read_on_every_outcome() {
    let engine = Engine::new(config(10, 1, 300));
    let request = engine.begin_request(fanout_budget::inbound::Caller::Public);
    let op = request.operation();
    let upstream = op.upstream();
    // Succeeded, timed out, cancelled mid-call, held without a call.
    upstream
        .permit(DB)
        .await
        .unwrap()
        .timeout(async {})
        .await
        .unwrap();
    let slow = tokio::time::sleep(Duration::from_secs(5));
    let err = upstream
        .permit(DB)
        .await
        .unwrap()
        .timeout(slow)
        .await
        .unwrap_err();
    assert_eq!(err.code(), "UPSTREAM_TIMEOUT");
    let permit = upstream.permit(DB).await.unwrap();
    let mut call = Box::pin(permit.timeout(std::future::pending::<()>()));
    assert!(futures::poll!(call.as_mut()).is_pending());
    assert_eq!(
        engine.hosts().in_flight(DB),
        1,
        "the slot is held during the call"
    );
    drop(call);
    drop(upstream.permit("DB:5432").await.unwrap());
    assert_eq!(engine.hosts().in_flight(DB), 0, "every slot came back");
    let counts = request.budget().counts();
    assert_eq!(
        (
            counts.issued,
            counts.succeeded,
            counts.timed_out,
            counts.cancelled
        ),
        (4, 2, 1, 1),
        "{counts:?}"
    );
    assert!(counts.balanced());
}
