//! The engine's cache of immutable answers (`src/read/cache.rs`), against
//! the testkit's loopback upstream: a hit sends nothing, costs no read and
//! is reported; credentials keep entries apart; a body that does not match
//! its digest is refused and never kept; only `2xx` answers are kept; the
//! cache stays within its bytes; a hit takes no host slot.
use fanout_budget::config::{HostConfig, UpstreamConfig};
use fanout_budget::{inbound::Caller, Config, Engine, Read, ReadError};
use fanout_testkit::{Behaviour, Upstream};
use http::{header, HeaderValue};
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// One inbound request reading `read`: the outcome, the reads charged, the
/// operation's cache hits.
async fn one(
    engine: &Engine,
    read: Read,
) -> (
    Result<Arc<fanout_budget::UpstreamResponse>, ReadError>,
    u64,
    u64,
) {
    let request = engine.begin_request(Caller::Public);
    let op = request.operation();
    let outcome = op.upstream().read(read).await;
    (outcome, request.budget().used(), op.cache_hits())
}

fn item(upstream: &Upstream, id: u64) -> Read {
    Read::get(upstream.url(&format!("/item/{id}")).parse().unwrap()).immutable()
}

#[tokio::test]
async fn a_hit_sends_nothing_costs_nothing_and_is_reported() {
    let upstream = Upstream::start().await;
    let engine = Engine::new(Config::default());
    let (first, used, hits) = one(&engine, item(&upstream, 1)).await;
    assert_eq!((first.unwrap().status.as_u16(), used, hits), (200, 1, 0));
    for _ in 0..5 {
        let request = engine.begin_request(Caller::Public);
        let op = request.operation();
        let answer = op.upstream().read(item(&upstream, 1)).await.unwrap();
        assert!(String::from_utf8_lossy(&answer.body).contains("item-1"));
        assert_eq!(
            (request.budget().used(), op.cache_hits(), op.reads()),
            (0, 1, 0)
        );
        let counts = request.budget().counts();
        assert_eq!((counts.cache_hits, counts.issued), (1, 0));
    }
    assert_eq!(upstream.requests(), 1, "one read reached the upstream");
    // A read not declared immutable is sent every time.
    let plain = Read::get(upstream.url("/item/1").parse().unwrap());
    assert_eq!(one(&engine, plain).await.1, 1);
    assert_eq!(upstream.requests(), 2);
}

#[tokio::test]
async fn two_credentials_never_share_an_entry() {
    let upstream = Upstream::start().await;
    let engine = Engine::new(Config::default());
    let as_user = |token: &'static str| {
        item(&upstream, 7).header(header::AUTHORIZATION, HeaderValue::from_static(token))
    };
    assert_eq!(one(&engine, as_user("Bearer alice")).await.1, 1);
    assert_eq!(
        one(&engine, as_user("Bearer bob")).await.1,
        1,
        "bob's own read"
    );
    assert_eq!(
        one(&engine, item(&upstream, 7)).await.1,
        1,
        "anonymous: its own read"
    );
    assert_eq!(
        one(&engine, as_user("Bearer alice")).await.2,
        1,
        "alice's entry"
    );
    assert_eq!(upstream.requests(), 3);
}

#[tokio::test]
async fn a_body_that_does_not_match_its_digest_is_refused_and_never_kept() {
    let upstream = Upstream::start().await;
    let engine = Engine::new(Config::default());
    let ok = || Read::get(upstream.url("/ok").parse().unwrap()).immutable();
    let right = format!("sha256:{:x}", Sha256::digest(b"fine"));
    let wrong = format!("sha256:{:x}", Sha256::digest(b"planted"));
    let (refused, used, _) = one(&engine, ok().sha256(&wrong)).await;
    let err = refused.unwrap_err();
    assert_eq!(err.code(), "UPSTREAM_ERROR");
    assert!(
        err.message().contains("not the digest"),
        "{}",
        err.message()
    );
    assert_eq!(used, 1);
    // Not kept: the next read of the same URL is sent again, and checked.
    let (answer, used, hits) = one(&engine, ok().sha256(&right)).await;
    assert_eq!(
        (answer.unwrap().body.as_ref(), used, hits),
        (&b"fine"[..], 1, 0)
    );
    let (_, used, hits) = one(&engine, ok().sha256(&right)).await;
    assert_eq!((used, hits), (0, 1));
    assert_eq!(upstream.requests(), 2);
}

#[tokio::test]
async fn only_a_2xx_is_kept() {
    let upstream = Upstream::start().await;
    upstream.seen.set(3, Behaviour::Status(500));
    let engine = Engine::new(Config::default());
    for _ in 0..3 {
        let (answer, used, hits) = one(&engine, item(&upstream, 3)).await;
        assert_eq!((answer.unwrap().status.as_u16(), used, hits), (500, 1, 0));
    }
    assert_eq!(upstream.requests(), 3);
}

#[tokio::test]
async fn the_cache_stays_within_its_bytes() {
    let upstream = Upstream::start().await;
    let bound = 64 << 10;
    let config = Config::default().upstream(UpstreamConfig::default().cache_bytes(bound));
    let engine = Engine::new(config);
    for id in 0..400 {
        one(&engine, item(&upstream, id)).await.0.unwrap();
    }
    let weight = engine.cache_weight();
    assert!(weight <= bound, "{weight} bytes kept, bound {bound}");
    assert!(weight > bound / 4, "the cache is used: {weight}");
    // Off: nothing kept, every read sent.
    let off = Engine::new(Config::default().upstream(UpstreamConfig::default().cache_bytes(0)));
    one(&off, item(&upstream, 1)).await.0.unwrap();
    assert_eq!(one(&off, item(&upstream, 1)).await.1, 1);
    assert_eq!(off.cache_weight(), 0);
}

#[tokio::test]
async fn a_hit_takes_no_host_slot() {
    let upstream = Upstream::start().await;
    let config = Config::default().host(upstream.host(), HostConfig::default().max_concurrent(1));
    let engine = Engine::new(config);
    one(&engine, item(&upstream, 1)).await.0.unwrap();
    // The host's one slot held by another request's call.
    let holder = engine.begin_request(Caller::Public);
    let op = holder.operation();
    let _permit = op.upstream().permit(&upstream.host()).await.unwrap();
    let (hit, used, hits) = one(&engine, item(&upstream, 1)).await;
    assert_eq!((hit.is_ok(), used, hits), (true, 0, 1));
    let (miss, _, _) = one(&engine, item(&upstream, 2)).await;
    assert_eq!(miss.unwrap_err().code(), "HOST_SATURATED");
}

/// One read's own expectation (the digest it names) is that read's error,
/// never a verdict on the entry every other request is served from: a
/// read naming a wrong digest for a URL the cache holds, in a request whose
/// identical read was a hit, must not drop the good entry.
#[tokio::test]
async fn a_read_naming_a_wrong_digest_does_not_drop_a_good_entry() {
    let upstream = Upstream::start().await;
    let engine = Engine::new(Config::default());
    let url = || upstream.url("/ok").parse().unwrap();
    let right = format!("sha256:{:x}", Sha256::digest(b"fine"));
    let wrong = format!("sha256:{:x}", Sha256::digest(b"planted"));
    let (kept, used, _) = one(&engine, Read::get(url()).immutable().sha256(&right)).await;
    assert_eq!((kept.unwrap().body.as_ref(), used), (&b"fine"[..], 1));
    // A client's request: the URL as a hit, then the same URL naming
    // another digest — answered by the cache, then read — each refused.
    let request = engine.begin_request(Caller::Public);
    let op = request.operation();
    op.upstream()
        .read(Read::get(url()).immutable())
        .await
        .unwrap();
    let cached = Read::get(url()).immutable().sha256(&wrong);
    let refused = op.upstream().read(cached).await;
    assert_eq!(refused.unwrap_err().code(), "UPSTREAM_ERROR");
    assert_eq!(request.budget().used(), 0, "the hits cost nothing");
    let refused = op.upstream().read(Read::get(url()).sha256(&wrong)).await;
    assert_eq!(refused.unwrap_err().code(), "UPSTREAM_ERROR");
    assert_eq!(request.budget().used(), 1, "the plain read is sent");
    drop((op, request));
    // Every other request is still served from the cache.
    let (_, used, hits) = one(&engine, Read::get(url()).immutable().sha256(&right)).await;
    assert_eq!(
        (used, hits),
        (0, 1),
        "one request's wrong digest dropped the good entry"
    );
    assert_eq!(upstream.requests(), 2);
}

/// A read that names its digest is checked against it even when the cache
/// answers (the entry was checked against the digest of the read that
/// kept it, which the key does not hold).
#[tokio::test]
async fn a_hit_is_checked_against_the_digest_its_read_names() {
    let upstream = Upstream::start().await;
    let engine = Engine::new(Config::default());
    let ok = || Read::get(upstream.url("/ok").parse().unwrap()).immutable();
    let right = format!("sha256:{:x}", Sha256::digest(b"fine"));
    let wrong = format!("sha256:{:x}", Sha256::digest(b"planted"));
    one(&engine, ok().sha256(&right)).await.0.unwrap();
    let (answer, _, hits) = one(&engine, ok().sha256(&wrong)).await;
    assert_eq!(hits, 1);
    assert!(
        answer.is_err(),
        "a body whose digest is not the one the read names, served from the cache"
    );
}
