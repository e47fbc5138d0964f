//! The stock-service example (`examples/stock_service.rs`) against a
//! counting upstream: a batch through async-graphql-axum's own service
//! shares one budget and one de-duplication cache.
mod common;
#[path = "../examples/stock_service.rs"]
mod example;

use common::*;
use fanout_budget::{Config, Engine};

#[tokio::test]
async fn a_batch_through_the_stock_service_shares_one_budget() {
    let upstream = Upstream::start().await;
    let app = example::app(
        Engine::new(Config::default()),
        upstream.base().parse().unwrap(),
    );
    let get = |path: &str| format!("{{ get(path: \"{path}\") }}");
    let queries = [get("/item/1"), get("/item/2"), get("/item/1")];
    let (status, answer) = post(&app, batch(queries)).await;
    assert_eq!(status, 200);
    let responses = answer.as_array().expect("a batch answer");
    for r in responses {
        assert!(r["data"]["get"].as_str().unwrap().contains("item-"), "{r}");
    }
    // Items 1 and 2, item 1 shared: 2 reads for the batch, one budget.
    assert_eq!(upstream.seen.requests(), 2);
    assert_eq!(fanout_testkit::operation_reads(responses), 2);
    let used: Vec<_> = responses
        .iter()
        .map(|r| r["extensions"]["fanout"]["used"].as_u64())
        .collect();
    assert!(used.contains(&Some(2)), "{used:?}");
}
