//! The budget through the engine: one request's reads never pass its limit.
mod common;

use common::*;
use fanout_budget::config::Config;
use fanout_budget::{inbound::Caller, Engine};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_concurrent_reads_through_the_engine_send_at_most_the_budget() {
    let upstream = Upstream::start().await;
    let mut config = Config::default();
    config.budget.max_reads = 100;
    config.budget.max_concurrent_reads = 64;
    let engine = Engine::new(config);
    let request = engine.begin_request(Caller::Public);
    let tasks: Vec<_> = (0..1000)
        .map(|i| {
            let request = request.clone();
            let url = format!("{}/item/{i}", upstream.base()).parse().unwrap();
            tokio::spawn(async move {
                let op = request.operation();
                op.upstream()
                    .read(fanout_budget::Read::get(url))
                    .await
                    .is_ok()
            })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        ok += t.await.unwrap() as u64;
    }
    assert_eq!(ok, 100);
    assert_eq!(upstream.seen.requests(), 100);
    assert_eq!(request.budget().used(), 100);
    let counts = request.budget().counts();
    assert_eq!(counts.issued, 100);
    assert_eq!(counts.refused_budget, 900);
}

#[tokio::test]
async fn internal_callers_get_the_internal_budget() {
    let mut config = Config::default();
    config.rate_limit.internal_token = "s3cret".into();
    let engine = Engine::new(config);
    assert_eq!(
        engine.begin_request(Caller::Internal).budget().limit(),
        1000
    );
    assert_eq!(engine.begin_request(Caller::Public).budget().limit(), 100);
    let mut headers = http::HeaderMap::new();
    headers.insert("x-internal-token", "s3cret".parse().unwrap());
    assert_eq!(engine.identify(&headers), Caller::Internal);
    headers.insert("x-internal-token", "s3cre".parse().unwrap());
    assert_eq!(engine.identify(&headers), Caller::Public);
    headers.insert("x-internal-token", "s3cret ".parse().unwrap());
    assert_eq!(engine.identify(&headers), Caller::Public);
    assert_eq!(engine.identify(&http::HeaderMap::new()), Caller::Public);
}
