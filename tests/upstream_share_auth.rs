//! An upstream's share (`[upstreams."NAME"] max_reads`) and the requests
//! an authenticating upstream takes: the `401`, the token fetch from a realm
//! on its origin and the retry each count against its share, as each is
//! charged to the request's budget.
use axum::Router;
use fanout_budget::config::UpstreamTable;
use fanout_budget::{inbound::Caller, Config, Engine, Read, ReadError};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

/// A registry on loopback that wants a bearer token from `/token` on its
/// own origin; how many requests it received.
async fn token_registry() -> (String, Arc<AtomicU64>) {
    use axum::http::{header, HeaderMap, StatusCode};
    use axum::response::IntoResponse;
    let seen = Arc::new(AtomicU64::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let realm = format!("{base}/token");
    let counted = seen.clone();
    let app = Router::new()
        .route(
            "/v2/x",
            axum::routing::get(move |headers: HeaderMap| async move {
                if headers
                    .get(header::AUTHORIZATION)
                    .is_some_and(|v| v == "Bearer t")
                {
                    return (StatusCode::OK, "{}").into_response();
                }
                let challenge = format!("Bearer realm=\"{realm}\",service=\"s\"");
                let challenge = [(header::WWW_AUTHENTICATE, challenge)];
                (StatusCode::UNAUTHORIZED, challenge, "{}").into_response()
            }),
        )
        .route(
            "/token",
            axum::routing::get(|| async { r#"{"token":"t"}"# }),
        )
        .layer(axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| {
                counted.fetch_add(1, SeqCst);
                next.run(request)
            },
        ));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, seen)
}

/// A cold read of a registry that wants a token is 3 requests to its
/// origin — the `401`, the token fetch, the retry — each counted against
/// its share as against the request's budget.
#[tokio::test]
async fn the_challenge_the_token_fetch_and_the_retry_each_count_against_the_share() {
    for (share, sent, answered) in [(2, 2, false), (3, 3, true)] {
        let (base, seen) = token_registry().await;
        let config = Config::default().upstream_named(
            "registry",
            UpstreamTable::default().url(base.as_str()).max_reads(share),
        );
        let engine = Engine::new(config);
        let request = engine.begin_request(Caller::Public);
        let op = request.operation();
        let upstream = op.upstream();
        let read = upstream.read(Read::get(format!("{base}/v2/x").parse().unwrap()));
        match read.await {
            Ok(response) => assert!(answered && response.status == 200),
            Err(err) => {
                assert!(!answered, "{}", err.display());
                assert_eq!(
                    err,
                    ReadError::UpstreamBudgetExhausted {
                        upstream: "registry".into(),
                        limit: share
                    }
                );
            }
        }
        assert_eq!(seen.load(SeqCst), sent, "share {share}");
        assert_eq!(request.budget().used(), sent, "share {share}");
    }
}
