//! The DataLoader example against a counting upstream: its loads are reads
//! of the request — de-duplicated across the batch, counted in `used` and in
//! each operation's `operationReads`.
mod common;
#[path = "../examples/dataloader.rs"]
mod example;

use common::*;
use fanout_budget::{Config, Engine};

#[tokio::test]
async fn a_request_scoped_loader_reads_through_the_acquisition_point() {
    let upstream = Upstream::start().await;
    let base = format!("{}/", upstream.base()).parse().unwrap();
    let app = example::app(Engine::new(Config::default()), base);
    let queries = [
        "{ items(ids: [1, 2, 2, 3]) { id value } }".to_string(),
        "{ items(ids: [3, 4]) { id value } }".to_string(),
    ];
    let (status, answer) = post(&app, batch(queries)).await;
    assert_eq!(status, 200);
    let responses = answer.as_array().expect("a batch answer");
    for r in responses {
        assert!(r.get("errors").is_none(), "{r}");
        for item in r["data"]["items"].as_array().unwrap() {
            assert_eq!(item["value"], format!("item-{}", item["id"]), "{r}");
        }
    }
    // Items 1–4, each read once for the whole batch.
    assert_eq!(upstream.seen.requests(), 4);
    assert_eq!(fanout_testkit::operation_reads(responses), 4);
    let used: Vec<_> = responses
        .iter()
        .map(|r| r["extensions"]["fanout"]["used"].as_u64())
        .collect();
    assert!(used.contains(&Some(4)), "{used:?}");
}
