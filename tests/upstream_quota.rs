//! The upstream's own quota (`src/read/quota.rs`), against a loopback
//! upstream started here that meters its reads as Docker Hub does
//! (`ratelimit-remaining: N;w=SECONDS`) and refuses with a `429` and
//! `Retry-After` once told to: no read reaches it while it said its quota
//! is spent, and reads flow again when the time it gave has passed.
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use fanout_budget::read::host_name;
use fanout_budget::{inbound::Caller, Config, Engine, Read, ReadError};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

#[derive(Default)]
struct Meter {
    /// Requests that reached the upstream.
    seen: AtomicU64,
    /// Reads left; at 0 it answers `ratelimit-remaining: 0;w=1`.
    left: AtomicU64,
    /// While non-zero, it answers `429` with `Retry-After: <this>`.
    refuse_for: AtomicU64,
}

async fn upstream(meter: Arc<Meter>) -> reqwest::Url {
    let handler = move || {
        let meter = meter.clone();
        async move {
            meter.seen.fetch_add(1, SeqCst);
            let mut headers = HeaderMap::new();
            let refuse_for = meter.refuse_for.swap(0, SeqCst);
            if refuse_for > 0 {
                let after = HeaderValue::from_str(&refuse_for.to_string()).unwrap();
                headers.insert("retry-after", after);
                return (StatusCode::TOO_MANY_REQUESTS, headers, "slow down").into_response();
            }
            let left = meter.left.load(SeqCst).saturating_sub(1);
            meter.left.store(left, SeqCst);
            let value = HeaderValue::from_str(&format!("{left};w=1")).unwrap();
            headers.insert("ratelimit-limit", HeaderValue::from_static("100;w=1"));
            headers.insert("ratelimit-remaining", value);
            (StatusCode::OK, headers, "{}").into_response()
        }
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = Router::new().route("/pull", get(handler));
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    format!("http://{addr}/pull").parse().unwrap()
}

async fn read(engine: &Engine, url: &reqwest::Url) -> Result<u16, ReadError> {
    let request = engine.begin_request(Caller::Public);
    let operation = request.operation();
    let response = operation.upstream().read(Read::get(url.clone())).await?;
    Ok(response.status.as_u16())
}

fn retry_after(err: &ReadError) -> std::time::Duration {
    match err {
        ReadError::QuotaExhausted { retry_after_ms, .. } => {
            std::time::Duration::from_millis(*retry_after_ms)
        }
        other => panic!("expected UPSTREAM_QUOTA_EXHAUSTED, got {}", other.display()),
    }
}

#[tokio::test]
async fn no_read_reaches_an_upstream_that_said_its_quota_is_spent() {
    let meter = Arc::new(Meter::default());
    meter.left.store(2, SeqCst);
    let url = upstream(meter.clone()).await;
    let engine = Engine::builder(Config::default())
        .known_host(host_name(&url))
        .build();
    assert_eq!(read(&engine, &url).await.unwrap(), 200, "1 left after it");
    assert_eq!(read(&engine, &url).await.unwrap(), 200, "0 left after it");
    // Spent, said the last answer: refused here, for at most its window.
    let mut waits = Vec::new();
    for _ in 0..20 {
        let err = read(&engine, &url).await.unwrap_err();
        assert_eq!(err.code(), "UPSTREAM_QUOTA_EXHAUSTED");
        assert!(err.extensions().get("host").is_some());
        waits.push(retry_after(&err));
    }
    assert_eq!(
        meter.seen.load(SeqCst),
        2,
        "no read was sent into the spent quota"
    );
    assert!(waits
        .iter()
        .all(|w| *w <= std::time::Duration::from_secs(1)));
    // The window ends: reads flow again.
    meter.left.store(100, SeqCst);
    tokio::time::sleep(*waits.last().unwrap()).await;
    assert_eq!(read(&engine, &url).await.unwrap(), 200);
    assert_eq!(meter.seen.load(SeqCst), 3);

    // A 429 with Retry-After: that read is the coded error, the next ones
    // are refused without a request until the time given.
    meter.refuse_for.store(1, SeqCst);
    let err = read(&engine, &url).await.unwrap_err();
    assert_eq!(err.code(), "UPSTREAM_QUOTA_EXHAUSTED");
    assert_eq!(meter.seen.load(SeqCst), 4);
    let wait = retry_after(&read(&engine, &url).await.unwrap_err());
    assert_eq!(meter.seen.load(SeqCst), 4);
    tokio::time::sleep(wait).await;
    assert_eq!(read(&engine, &url).await.unwrap(), 200);
    assert_eq!(meter.seen.load(SeqCst), 5);
}

#[tokio::test]
async fn a_refused_read_is_not_charged() {
    let meter = Arc::new(Meter::default());
    meter.left.store(1, SeqCst);
    let url = upstream(meter.clone()).await;
    let engine = Engine::builder(Config::default())
        .known_host(host_name(&url))
        .build();
    read(&engine, &url).await.unwrap();
    let request = engine.begin_request(Caller::Public);
    let operation = request.operation();
    let err = operation
        .upstream()
        .read(Read::get(url.clone()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "UPSTREAM_QUOTA_EXHAUSTED");
    assert_eq!(request.budget().used(), 0);
}

/// Two replicas on one Redis: the upstream tells one its quota is spent;
/// the other learns it from the board and sends nothing either.
#[tokio::test]
async fn a_spent_quota_is_shared_between_replicas_on_redis() {
    let Some(redis) = fanout_testkit::RedisServer::start().await else {
        return;
    };
    let meter = Arc::new(Meter::default());
    meter.left.store(100, SeqCst);
    let url = upstream(meter.clone()).await;
    let mut config = Config::default();
    config.redis.url = redis.url();
    let replica = || {
        let shared = fanout_budget::backends::redis::SharedLimits::open(&config)
            .unwrap()
            .unwrap();
        Engine::builder(config.clone())
            .known_host(host_name(&url))
            .quota_board(shared.quota_board())
            .build()
    };
    let (a, b) = (replica(), replica());
    assert_eq!(read(&b, &url).await.unwrap(), 200);
    // A 429 with Retry-After: 5 to replica A.
    meter.refuse_for.store(5, SeqCst);
    assert_eq!(
        read(&a, &url).await.unwrap_err().code(),
        "UPSTREAM_QUOTA_EXHAUSTED"
    );
    // B learns it from the board (read every 250 ms); until then its reads
    // still go out.
    let learned = fanout_testkit::until(
        "replica B refuses",
        std::time::Duration::from_secs(5),
        async || read(&b, &url).await.is_err(),
    )
    .await;
    assert!(learned < std::time::Duration::from_secs(2), "{learned:?}");
    let sent = meter.seen.load(SeqCst);
    for replica in [&a, &b, &a, &b] {
        let err = read(replica, &url).await.unwrap_err();
        assert_eq!(err.code(), "UPSTREAM_QUOTA_EXHAUSTED");
        assert!(retry_after(&err) <= std::time::Duration::from_secs(5));
    }
    assert_eq!(
        meter.seen.load(SeqCst),
        sent,
        "no read reached the upstream from either"
    );
}
