//! Coalescing and the engine's cache together: identical reads in flight
//! in different requests (`coalesce = true`) are one upstream answer, each
//! request given a response of its own — and the cache's rule that an
//! answer a reader found unusable is never served again holds whichever of
//! those responses the cache kept.
use fanout_budget::config::HostConfig;
use fanout_budget::{inbound::Caller, Config, Engine, Read};
use fanout_testkit::Upstream;
use std::time::Duration;

async fn until(what: &str, done: impl Fn() -> bool) {
    let started = std::time::Instant::now();
    while !done() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "still waiting for {what}"
        );
        tokio::task::yield_now().await;
    }
}

/// A leader and a joiner read `/item/N` (fresh for a minute) while the
/// upstream holds it; the leader's reader finds the answer unusable; the
/// joiner's request never looks at it. No later request is served it —
/// whichever of the two responses the cache kept (the two requests end
/// together, in either order: ten rounds, ten items).
#[tokio::test]
async fn an_answer_the_leader_found_unusable_is_not_served_from_the_joiners_copy() {
    let upstream = Upstream::start().await;
    let mut config = Config::default();
    config
        .hosts
        .insert(upstream.host(), HostConfig::default().coalesce(true));
    let engine = Engine::new(config);
    let mut served = Vec::new();
    for id in 1..=10u64 {
        let url = upstream.url(&format!("/item/{id}"));
        let read = || Read::get(url.parse().unwrap()).fresh_for(Duration::from_secs(60));
        upstream.seen.hold();
        let sent = upstream.requests();
        let leader = engine.begin_request(Caller::Public);
        let joiner = engine.begin_request(Caller::Public);
        let (lead_op, join_op) = (leader.operation(), joiner.operation());
        let lead = tokio::spawn({
            let read = read();
            async move {
                let answer = lead_op.upstream().read(read).await.unwrap();
                // The reader could not use it (a proxy's page, say).
                answer.error("not the page the reader expected").code()
            }
        });
        until("the leader's read sent", || upstream.requests() == sent + 1).await;
        let join = tokio::spawn({
            let read = read();
            async move { join_op.upstream().read(read).await.map(|_| ()) }
        });
        until("the joiner joined", || {
            joiner.budget().counts().coalesced == 1
        })
        .await;
        upstream.seen.release();
        assert_eq!(lead.await.unwrap(), "UPSTREAM_ERROR");
        join.await.unwrap().unwrap();
        drop((leader, joiner));
        // A later request reads it anew, not from the cache.
        let later = engine.begin_request(Caller::Public);
        let op = later.operation();
        op.upstream().read(read()).await.unwrap();
        if (later.budget().used(), op.cache_hits()) != (1, 0) {
            served.push(id);
        }
    }
    assert!(
        served.is_empty(),
        "served from the cache, though the leader's reader found them unusable: items {served:?}"
    );
}
