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
    let mut got = Vec::new();
    for i in 0..7 {
        let xff = format!("203.0.113.{i}");
        got.push(
            post_from(
                &f.gateway.router,
                BUDGET,
                "192.0.2.9:1",
                &[("x-forwarded-for", &xff)],
            )
            .await
            .0,
        );
    }
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
    let mut got = Vec::new();
    for i in 0..7 {
        // The client wrote the left part; our proxy appended the real address.
        let xff = format!("198.18.0.{i}, 203.0.113.77, 10.0.0.5");
        got.push(
            post_from(
                &f.gateway.router,
                BUDGET,
                "10.0.0.1:1",
                &[("x-forwarded-for", &xff)],
            )
            .await
            .0,
        );
    }
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
