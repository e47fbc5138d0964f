//! Pulls only where the data needs them: a registry that meters pulls
//! (Docker Hub) counts a manifest `GET` as one and a `HEAD` as none. A
//! query that needs only a tag's digest or media type reads its manifest
//! with a `HEAD`; one that needs the body (layers, platforms, config) with
//! a `GET`. `requested` and `operationReads` stay exact.
//!
//! `cargo test -p fanout-gateway --test pulls -- --nocapture` prints the
//! upstream requests and pulls per GraphQL request of a realistic mix.
mod common;

use common::*;
use serde_json::Value;

/// (what it is, the query, upstream requests, pulls) — the pulls before
/// `HEAD`s were used are the manifest reads: every one was a `GET`.
fn mix() -> Vec<(&'static str, &'static str, u64, u64, u64)> {
    vec![
        (
            "20 tags with their digests",
            r#"{ repository(name: "acme/app") { tags(first: 20) { nodes { name manifest { digest } } } } }"#,
            21,
            0,
            20,
        ),
        (
            "one tag: layers and config",
            r#"{ repository(name: "acme/app") { tag(name: "t01") { manifest { digest layers { size } config { os architecture } } } } }"#,
            3,
            1,
            1,
        ),
        (
            "an index's platforms",
            r#"{ repository(name: "acme/multi") { tag(name: "latest") { manifest { mediaType manifests { platform { os architecture variant } } } } } }"#,
            2,
            1,
            1,
        ),
        (
            "5 tags: digest and media type",
            r#"{ repository(name: "acme/app") { tags(first: 5) { nodes { manifest { digest mediaType } } } } }"#,
            6,
            0,
            5,
        ),
    ]
}

fn fanout(answer: &Value) -> &Value {
    &answer["extensions"]["fanout"]
}

#[tokio::test]
async fn a_digest_is_a_head_and_a_body_a_get() {
    let f = Fixture::default().await;
    let counters = f.registry.counters();
    println!("| query | upstream requests | pulls | pulls before (all GET) |");
    println!("|---|---|---|---|");
    let (mut requests, mut pulls, mut before) = (0, 0, 0);
    for (what, query, want_requests, want_pulls, pulls_before) in mix() {
        counters.reset();
        let answer = f.query(query).await;
        assert!(answer.get("errors").is_none(), "{what}: {answer}");
        assert_eq!(counters.requests(), want_requests, "{what}");
        assert_eq!(counters.pulls(), want_pulls, "{what}");
        assert_eq!(counters.heads() + counters.pulls(), pulls_before, "{what}");
        let operation_reads = fanout(&answer)["operationReads"].as_u64().unwrap();
        assert_eq!(operation_reads, want_requests, "{what}");
        assert!(operation_reads <= fanout(&answer)["requested"].as_u64().unwrap());
        println!("| {what} | {want_requests} | {want_pulls} | {pulls_before} |");
        (requests, pulls, before) = (
            requests + want_requests,
            pulls + want_pulls,
            before + pulls_before,
        );
    }
    println!(
        "| the mix, per GraphQL request | {:.2} | {:.2} | {:.2} |",
        requests as f64 / 4.0,
        pulls as f64 / 4.0,
        before as f64 / 4.0
    );
}

#[tokio::test]
async fn the_digest_a_head_gives_is_the_one_a_get_gives() {
    let f = Fixture::default().await;
    let head = f
        .query(r#"{ repository(name: "acme/multi") { tag(name: "latest") { manifest { digest mediaType } } } }"#)
        .await;
    let get = f
        .query(r#"{ repository(name: "acme/multi") { tag(name: "latest") { manifest { digest mediaType layers { size } } } } }"#)
        .await;
    let manifest = |a: &Value| a["data"]["repository"]["tag"]["manifest"].clone();
    assert_eq!(manifest(&head)["digest"], manifest(&get)["digest"]);
    assert_eq!(manifest(&head)["mediaType"], manifest(&get)["mediaType"]);
    assert!(manifest(&head)["digest"]
        .as_str()
        .unwrap()
        .starts_with("sha256:"));
}
