//! Inbound per-IP limiting, with identity (the token), never address, for
//! internal callers.
mod common;

use common::*;
use fanout_budget::Config;
use serde_json::json;

const TOKEN: &str = "internal-s3cret-token";

async fn gateway(trusted: &[&str]) -> Fixture {
    let mut config = Config::default();
    config.rate_limit.requests_per_minute = 5;
    config.rate_limit.internal_token = TOKEN.into();
    config.rate_limit.trusted_proxies = trusted.iter().map(|s| s.to_string()).collect();
    Fixture::new(config).await
}

const BUDGET: &str = r#"{"query":"{ fanoutBudget { limit } }"}"#;

async fn statuses(f: &Fixture, n: usize, peer: &str, headers: &[(&str, &str)]) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(post_from(&f.gateway.router, BUDGET, peer, headers).await.0);
    }
    out
}

/// The status of one request from `peer` per `X-Forwarded-For` value.
async fn forwarded(f: &Fixture, peer: &str, xffs: impl IntoIterator<Item = String>) -> Vec<u16> {
    let mut got = Vec::new();
    for xff in xffs {
        let headers = [("x-forwarded-for", xff.as_str())];
        got.push(post_from(&f.gateway.router, BUDGET, peer, &headers).await.0);
    }
    got
}

#[tokio::test]
async fn twenty_internal_requests_all_pass() {
    let f = gateway(&[]).await;
    let got = statuses(&f, 20, "192.0.2.1:4000", &[("x-internal-token", TOKEN)]).await;
    assert_eq!(got, vec![200; 20]);
}

#[tokio::test]
async fn ordinary_callers_get_five_then_429() {
    let f = gateway(&[]).await;
    let router = &f.gateway.router;
    for i in 0..5u32 {
        let (status, headers, _) = post_from(router, BUDGET, "192.0.2.2:4000", &[]).await;
        assert_eq!(status, 200);
        assert_eq!(
            headers["ratelimit"],
            format!("\"per-ip\";r={};t={}", 4 - i, 12 * (i + 1))
        );
        assert_eq!(headers["ratelimit-policy"], "\"per-ip\";q=5;w=60");
    }
    for _ in 0..3 {
        let (status, headers, body) = post_from(router, BUDGET, "192.0.2.2:4000", &[]).await;
        assert_eq!(status, 429);
        assert_eq!(body["errors"][0]["extensions"]["code"], "RATE_LIMITED");
        let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
        assert!((1..=12).contains(&retry), "Retry-After {retry}");
        assert_eq!(headers["ratelimit-policy"], "\"per-ip\";q=5;w=60");
        assert!(headers["ratelimit"]
            .to_str()
            .unwrap()
            .starts_with("\"per-ip\";r=0;t="));
    }
    // Another address has its own bucket.
    assert_eq!(
        post_from(router, BUDGET, "192.0.2.3:4000", &[]).await.0,
        200
    );
}

#[tokio::test]
async fn a_forged_token_is_limited_exactly_like_no_token() {
    let f = gateway(&[]).await;
    for forged in [
        "wrong",
        "internal-s3cret-toke",
        "internal-s3cret-token-",
        "",
    ] {
        let peer = format!("198.51.100.{}:1", forged.len());
        let got = statuses(&f, 8, &peer, &[("x-internal-token", forged)]).await;
        assert_eq!(
            got,
            [vec![200; 5], vec![429; 3]].concat(),
            "token {forged:?}"
        );
    }
}

#[tokio::test]
async fn x_forwarded_for_from_an_untrusted_peer_is_ignored() {
    let f = gateway(&["10.0.0.0/8"]).await;
    let got = forwarded(&f, "192.0.2.9:1", (0..7).map(|i| format!("203.0.113.{i}"))).await;
    assert_eq!(got, [vec![200; 5], vec![429; 2]].concat());
}

#[tokio::test]
async fn behind_a_trusted_proxy_each_forwarded_client_has_its_own_bucket() {
    let f = gateway(&["10.0.0.0/8"]).await;
    for client in ["203.0.113.1", "203.0.113.2", "2001:db8::1"] {
        let got = statuses(&f, 6, "10.1.2.3:5000", &[("x-forwarded-for", client)]).await;
        assert_eq!(
            got,
            [vec![200; 5], vec![429; 1]].concat(),
            "client {client}"
        );
    }
}

#[tokio::test]
async fn a_spoofed_leftmost_entry_does_not_change_the_key() {
    let f = gateway(&["10.0.0.0/8"]).await;
    // The client wrote the left part; our proxy appended the real address.
    let xffs = (0..7).map(|i| format!("198.18.0.{i}, 203.0.113.77, 10.0.0.5"));
    let got = forwarded(&f, "10.0.0.1:1", xffs).await;
    assert_eq!(got, [vec![200; 5], vec![429; 2]].concat());
}

#[tokio::test]
async fn internal_callers_get_the_internal_budget() {
    let f = gateway(&[]).await;
    let router = &f.gateway.router;
    let limit = |body: serde_json::Value| body["data"]["fanoutBudget"]["limit"].clone();
    let (_, _, internal) = post_from(
        router,
        BUDGET,
        "192.0.2.4:1",
        &[("x-internal-token", TOKEN)],
    )
    .await;
    assert_eq!(limit(internal), 1000);
    let (_, _, public) = post_from(router, BUDGET, "192.0.2.4:1", &[]).await;
    assert_eq!(limit(public), 100);
    let (_, _, forged) = post_from(
        router,
        BUDGET,
        "192.0.2.4:1",
        &[("x-internal-token", "nope")],
    )
    .await;
    assert_eq!(limit(forged), 100);
}

#[tokio::test]
async fn a_batch_counts_as_one_request_and_side_endpoints_are_never_limited() {
    let f = gateway(&[]).await;
    let router = &f.gateway.router;
    let batch = serde_json::Value::Array(vec![json!({ "query": "{ fanoutBudget { limit } }" }); 5])
        .to_string();
    for _ in 0..5 {
        assert_eq!(post_from(router, &batch, "192.0.2.5:1", &[]).await.0, 200);
    }
    assert_eq!(post_from(router, &batch, "192.0.2.5:1", &[]).await.0, 429);
    use tower::ServiceExt;
    for path in ["/healthz", "/metrics"] {
        for _ in 0..10 {
            let mut request = axum::http::Request::get(path)
                .body(axum::body::Body::empty())
                .unwrap();
            let addr: std::net::SocketAddr = "192.0.2.5:1".parse().unwrap();
            request
                .extensions_mut()
                .insert(axum::extract::ConnectInfo(addr));
            assert_eq!(
                router.clone().oneshot(request).await.unwrap().status(),
                200,
                "{path}"
            );
        }
    }
}

async fn gateway_with(configure: impl FnOnce(&mut Config)) -> Fixture {
    let mut config = Config::default();
    config.rate_limit.requests_per_minute = 5;
    configure(&mut config);
    Fixture::new(config).await
}

/// 400 requests, each from a different address of `net` (a /64 written as
/// its first four groups), through `router`: how many were admitted.
async fn rotating(f: &Fixture, net: &str, n: u64) -> usize {
    let mut admitted = 0;
    for i in 0..n {
        // Scattered interface identifiers, as a client picking them would.
        let iid = (i + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let peer = format!(
            "[{net}:{:x}:{:x}:{:x}:{:x}]:4000",
            iid >> 48,
            (iid >> 32) & 0xffff,
            (iid >> 16) & 0xffff,
            iid & 0xffff
        );
        if post_from(&f.gateway.router, BUDGET, &peer, &[]).await.0 == 200 {
            admitted += 1;
        }
    }
    admitted
}

#[tokio::test]
async fn rotating_addresses_inside_one_ipv6_64_are_limited_like_one_client() {
    let f = gateway_with(|_| {}).await;
    assert_eq!(rotating(&f, "2001:db8:1:2", 400).await, 5);
    // Another /64 (the next one up) is another client.
    assert_eq!(rotating(&f, "2001:db8:1:3", 10).await, 5);
}

#[tokio::test]
async fn ipv6_prefix_128_keys_each_address() {
    let f = gateway_with(|c| c.rate_limit.ipv6_prefix = 128).await;
    assert_eq!(rotating(&f, "2001:db8:1:2", 400).await, 400);
}

#[tokio::test]
async fn ipv4_clients_are_keyed_by_ipv4_prefix_and_mapped_addresses_count_as_ipv4() {
    let f = gateway_with(|c| c.rate_limit.ipv4_prefix = 24).await;
    let mut got = Vec::new();
    for i in 1..=4 {
        got.push(
            post_from(&f.gateway.router, BUDGET, &format!("192.0.2.{i}:1"), &[])
                .await
                .0,
        );
    }
    // The IPv4-mapped form of an address in the same /24 shares the bucket.
    for peer in ["[::ffff:192.0.2.200]:1", "192.0.2.99:1"] {
        got.push(post_from(&f.gateway.router, BUDGET, peer, &[]).await.0);
    }
    assert_eq!(got, [vec![200; 5], vec![429]].concat());
    assert_eq!(
        post_from(&f.gateway.router, BUDGET, "192.0.3.1:1", &[])
            .await
            .0,
        200,
        "the next /24 is another client"
    );
}

#[tokio::test]
async fn forwarded_ipv6_clients_are_keyed_by_prefix_too() {
    let f = gateway(&["10.0.0.0/8"]).await;
    let got = forwarded(
        &f,
        "10.0.0.1:1",
        (1..=6).map(|i| format!("2001:db8:7:7::{i}")),
    )
    .await;
    assert_eq!(got, [vec![200; 5], vec![429]].concat());
}

#[tokio::test]
async fn forwarded_entries_with_a_port_count_as_their_address() {
    let f = gateway(&["10.0.0.0/8"]).await;
    for forms in [
        ["203.0.113.5:4000", "203.0.113.5", "203.0.113.5:1"],
        ["[2001:db8::5]:443", "2001:db8::5", "[2001:db8::5]"],
    ] {
        let got = forwarded(
            &f,
            "10.0.0.1:1",
            (0..6).map(|i| format!("{}, 10.0.0.7:80", forms[i % 3])),
        )
        .await;
        assert_eq!(got, [vec![200; 5], vec![429]].concat(), "{forms:?}");
    }
    // None of it was charged to the proxy itself.
    let own = statuses(&f, 5, "10.0.0.1:1", &[]).await;
    assert_eq!(own, vec![200; 5]);
}

#[tokio::test]
async fn a_garbage_forwarded_entry_is_400_and_charged_to_no_one() {
    let f = gateway(&["10.0.0.0/8"]).await;
    let router = &f.gateway.router;
    for xff in [
        "garbage",
        "unknown",
        "203.0.113.9, nonsense",
        "203.0.113.9:",
        "",
        "1.2.3.4, 10.0.0.9, [::1",
    ] {
        for _ in 0..3 {
            let (status, headers, body) =
                post_from(router, BUDGET, "10.0.0.1:1", &[("x-forwarded-for", xff)]).await;
            assert_eq!(status, 400, "{xff:?}");
            assert_eq!(
                body["errors"][0]["extensions"]["code"], "BAD_REQUEST",
                "{xff:?}"
            );
            assert_eq!(headers["connection"], "close", "{xff:?}");
        }
    }
    // Garbage left of the decisive entry is hearsay, not an error.
    let got = statuses(
        &f,
        5,
        "10.0.0.1:1",
        &[("x-forwarded-for", "junk, 203.0.113.10")],
    )
    .await;
    assert_eq!(got, vec![200; 5]);
    // The proxy's own bucket and the forwarded clients' are untouched.
    assert_eq!(statuses(&f, 5, "10.0.0.1:1", &[]).await, vec![200; 5]);
    let got = statuses(&f, 5, "10.0.0.1:1", &[("x-forwarded-for", "203.0.113.9")]).await;
    assert_eq!(got, vec![200; 5]);
}

#[tokio::test]
async fn refusals_before_the_body_is_read_close_the_connection() {
    let f = gateway_with(|c| c.http.max_body_bytes = 64).await;
    let router = &f.gateway.router;
    let big = format!(
        r#"{{"query":"{{ fanoutBudget {{ limit }} }} #{}"}}"#,
        "x".repeat(100)
    );
    let (status, headers, body) = post_from(router, &big, "192.0.2.60:1", &[]).await;
    assert_eq!(
        (status, &headers["connection"]),
        (413, &"close".parse().unwrap())
    );
    assert_eq!(body["errors"][0]["extensions"]["code"], "PAYLOAD_TOO_LARGE");
    // The refused body still counted as a request: four more, then 429.
    assert_eq!(statuses(&f, 4, "192.0.2.60:1", &[]).await, vec![200; 4]);
    let (status, headers, _) = post_from(router, BUDGET, "192.0.2.60:1", &[]).await;
    assert_eq!(
        (status, &headers["connection"]),
        (429, &"close".parse().unwrap())
    );
    // An answer after the body was read keeps the connection.
    let (status, headers, _) = post_from(router, "{", "192.0.2.61:1", &[]).await;
    assert_eq!(status, 400);
    assert!(headers.get("connection").is_none());
}
