//! The read quota as every replica shows it: two gateway replicas on one
//! `redis-server`; a client spends its burst on one; the other, which never
//! saw the client, shows it spent — in `fanoutQuota` and in the
//! `extensions.fanout.quota` of a request that reads nothing — and a busy
//! client's status requests cost that replica a Redis call a second at
//! most, not one each.
//!
//! Without `redis-server` this prints `SKIPPED` and passes, unless
//! `FANOUT_REQUIRE_EXTERNAL=1`.
mod common;

use common::*;
use fanout_budget::config::QuotaConfig;
use fanout_budget::Config;
use fanout_gateway::app::{self, Gateway};
use serde_json::json;

/// Tag list, manifest and config blob: 3 reads reserved.
const QUERY: &str =
    r#"{ repository(name: "acme/app") { tag(name: "t01") { manifest { config { os } } } } }"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_never_saw_the_client_shows_its_quota_as_the_fleet_has_it() {
    let Some(redis) = RedisServer::start().await else {
        return;
    };
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    let mut config = Config::default();
    config.redis.url = redis.url();
    config.rate_limit.requests_per_minute = 100_000;
    // 60 reads an hour, 20 at once: nothing refills while the test runs.
    config.quota = QuotaConfig::default().reads(60).period_secs(3600).burst(20);
    let fleet: Vec<Gateway> = (0..2)
        .map(|_| app::build(config.clone(), registry.url().parse().unwrap(), None))
        .collect();
    let (a, b) = (&fleet[0].router, &fleet[1].router);
    let peer = "198.18.0.50:1";
    // Spent on A.
    let body = json!({ "query": QUERY }).to_string();
    let mut refused = false;
    for _ in 0..15 {
        let (status, _, _) = post_from(a, &body, peer, &[]).await;
        refused |= status == 429;
    }
    assert!(refused, "the burst is spent on A");
    let before = fleet[1].shared.as_ref().unwrap().backend().calls();
    // B shows it spent.
    let status = json!({ "query": "{ fanoutQuota { limit remaining } }" }).to_string();
    for _ in 0..20 {
        let (code, _, answer) = post_from(b, &status, peer, &[]).await;
        assert_eq!(code, 200, "reading nothing is always answered: {answer}");
        let shown = &answer["data"]["fanoutQuota"];
        assert_eq!(shown["limit"], 20, "{answer}");
        assert!(
            shown["remaining"].as_u64().unwrap() <= 1,
            "B shows {answer} for a client spent on A"
        );
        let ext = &answer["extensions"]["fanout"]["quota"];
        assert!(ext["remaining"].as_u64().unwrap() <= 1, "{answer}");
    }
    // Twenty status requests in well under a second: one quota call (the
    // per-IP limit's calls come with them, a few admissions at a time).
    let calls = fleet[1].shared.as_ref().unwrap().backend().calls() - before;
    assert!(calls <= 6, "{calls} Redis calls for 20 status requests");
}
