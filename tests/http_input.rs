//! Bad inbound input is refused before anything runs or reads.
mod common;

use common::*;
use fanout_budget::config::{Config, CsrfGet};
use fanout_budget::{Engine, FanoutExtension};

async fn setup() -> (Upstream, axum::Router) {
    let upstream = Upstream::start().await;
    let mut config = Config::default();
    config.http.max_batch_operations = 20;
    config.http.max_body_bytes = 4096;
    let app = app(&Engine::new(config), &upstream);
    (upstream, app)
}

#[tokio::test]
async fn a_batch_over_the_cap_is_rejected_whole() {
    let (upstream, app) = setup().await;
    let ops = (0..21).map(|i| format!("{{ item(id: {i}) {{ detail {{ value }} }} }}"));
    let (status, body) = post(&app, batch(ops)).await;
    assert_eq!(status, 400);
    assert_eq!(codes(&body), vec!["BATCH_TOO_LARGE"]);
    assert_eq!(body["errors"][0]["extensions"]["max"], 20);
    assert_eq!(upstream.seen.requests(), 0);
    // At the cap it runs.
    let ops = (0..20).map(|i| format!("{{ item(id: {i}) {{ detail {{ value }} }} }}"));
    let (status, _) = post(&app, batch(ops)).await;
    assert_eq!(status, 200);
    assert_eq!(upstream.seen.requests(), 20);
}

#[tokio::test]
async fn malformed_and_empty_requests_are_bad_requests() {
    let (upstream, app) = setup().await;
    for body in [
        "{not json",
        "[]",
        "42",
        "",
        r#"{"no_query": 1}"#,
        r#"[{"query": "{ items { id } }"}, 3]"#,
    ] {
        let (status, answer) = post(&app, body).await;
        assert_eq!(status, 400, "body {body:?}");
        assert_eq!(codes(&answer), vec!["BAD_REQUEST"], "body {body:?}");
    }
    assert_eq!(upstream.seen.requests(), 0);
}

#[tokio::test]
async fn an_oversize_body_is_413() {
    let (upstream, app) = setup().await;
    let query = format!("{{ items(first: 1) {{ id }} }} #{}", "x".repeat(5000));
    let (status, body) = post(&app, serde_json::json!({ "query": query }).to_string()).await;
    assert_eq!(status, 413);
    assert_eq!(codes(&body), vec!["PAYLOAD_TOO_LARGE"]);
    assert_eq!(body["errors"][0]["extensions"]["max"], 4096);
    assert_eq!(upstream.seen.requests(), 0);
}

#[tokio::test]
async fn get_serves_graphiql() {
    let (_upstream, app) = setup().await;
    use tower::ServiceExt;
    let response = app
        .oneshot(
            axum::http::Request::get("/graphql")
                .header("accept", "text/html,application/xhtml+xml,*/*;q=0.8")
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let html = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&html)
        .to_lowercase()
        .contains("graphiql"));
}

/// A body whose first chunk is a whole request and whose rest is one space
/// every 100 ms for 10 s: valid JSON, were it ever finished.
fn trickled_body() -> axum::body::Body {
    let first = futures::stream::once(async {
        Ok::<_, std::io::Error>(bytes::Bytes::from_static(
            br#"{"query":"{ items(first: 1) { id } }"}"#,
        ))
    });
    let rest = futures::stream::unfold(0, |sent| async move {
        if sent == 100 {
            return None;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        Some((Ok(bytes::Bytes::from_static(b" ")), sent + 1))
    });
    axum::body::Body::from_stream(futures::StreamExt::chain(first, rest))
}

#[tokio::test(start_paused = true)]
async fn a_trickled_body_is_cut_at_the_body_timeout_or_the_deadline_whichever_is_first() {
    use tower::ServiceExt;
    let upstream = Upstream::start().await;
    for (body_ms, deadline_ms, cut_ms) in [(500, 30_000, 500), (10_000, 300, 300)] {
        let mut config = Config::default();
        config.http.body_read_timeout_ms = body_ms;
        config.budget.deadline_ms = deadline_ms;
        let app = app(&Engine::new(config), &upstream);
        let started = tokio::time::Instant::now();
        let request = axum::http::Request::post("/graphql")
            .header("content-type", "application/json")
            .body(trickled_body())
            .unwrap();
        let response = app.oneshot(request).await.unwrap();
        // The paused clock moves only by the timers: exactly the bound.
        assert_eq!(started.elapsed().as_millis(), cut_ms);
        assert_eq!(response.status(), 408);
        assert_eq!(response.headers()["connection"], "close");
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(codes(&body), vec!["REQUEST_TIMEOUT"]);
        assert_eq!(body["errors"][0]["extensions"]["timeoutMs"], cut_ms as u64);
    }
    assert_eq!(upstream.seen.requests(), 0);
}

#[tokio::test]
async fn refusals_before_the_body_close_the_connection_and_later_ones_do_not() {
    use tower::ServiceExt;
    let (_upstream, app) = setup().await;
    let send = |body: String| {
        let request = axum::http::Request::post("/graphql")
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body))
            .unwrap();
        app.clone().oneshot(request)
    };
    let oversize = send("x".repeat(5000)).await.unwrap();
    assert_eq!(oversize.status(), 413);
    assert_eq!(oversize.headers()["connection"], "close");
    // A malformed body was read whole: the connection can carry on.
    let malformed = send("{not json".into()).await.unwrap();
    assert_eq!(malformed.status(), 400);
    assert!(malformed.headers().get("connection").is_none());
}

/// A shared limiter that is always down.
struct Down;

impl fanout_budget::inbound::InboundLimiter for Down {
    fn check(
        &self,
        _key: std::net::IpAddr,
    ) -> futures::future::BoxFuture<
        '_,
        Result<fanout_budget::inbound::Decision, fanout_budget::error::Unavailable>,
    > {
        Box::pin(async {
            Err(fanout_budget::error::Unavailable {
                message: "down".into(),
            })
        })
    }
}

#[tokio::test]
async fn a_closed_mode_503_closes_the_connection() {
    use tower::ServiceExt;
    let (_upstream, app) = setup().await;
    let layer = fanout_budget::inbound::RateLimitLayer::new(&Default::default()).shared(
        std::sync::Arc::new(Down),
        fanout_budget::config::FailureMode::Closed,
    );
    let peer = Some(fanout_testkit::PEER.parse().unwrap());
    let request = fanout_testkit::graphql_request(r#"{"query":"{ items { id } }"}"#, &[], peer);
    let response = app.route_layer(layer).oneshot(request).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["connection"], "close");
}

#[tokio::test]
async fn the_rate_limiter_without_the_tcp_peer_refuses_loudly_not_into_one_bucket() {
    let (upstream, app) = setup().await;
    let config = Config::default();
    let limited = app.route_layer(fanout_budget::inbound::RateLimitLayer::new(
        &config.rate_limit,
    ));
    let body = r#"{"query":"{ item(id: 1) { detail { value } } }"}"#;
    // Served without connect info: every client would share one bucket.
    let bare =
        fanout_testkit::call(&limited, fanout_testkit::graphql_request(body, &[], None)).await;
    assert_eq!(bare.status, 500);
    assert_eq!(codes(&bare.json()), vec!["INTERNAL_SERVER_ERROR"]);
    assert!(bare.json()["errors"][0]["message"]
        .as_str()
        .unwrap()
        .contains("connect_info"));
    assert_eq!(bare.headers["connection"], "close");
    assert_eq!(upstream.seen.requests(), 0);
    // With the peer, as `fanout_budget::inbound::serve` records it: served.
    let (status, _) = post(&limited, body).await;
    assert_eq!(status, 200);
    assert_eq!(upstream.seen.requests(), 1);
}

/// A `GET` carrying `query`, with `headers`: without a custom header it is
/// what a page on any site makes a visitor's browser send with no CORS
/// preflight (`<img src="https://api.example/graphql?query=…">`, a link),
/// the visitor's cookies attached.
fn get(query: &str, headers: &[(&str, &str)]) -> axum::http::Request<axum::body::Body> {
    let mut params = form_urlencoded::Serializer::new(String::new());
    params.append_pair("query", query);
    let mut request = axum::http::Request::get(format!("/graphql?{}", params.finish()));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(axum::body::Body::empty()).unwrap()
}

/// The stock service (async-graphql-axum's `GraphQL`) under `FanoutLayer`.
fn layered(engine: &Engine, upstream: &Upstream) -> axum::Router {
    let schema = async_graphql::Schema::build(
        Query,
        async_graphql::EmptyMutation,
        async_graphql::EmptySubscription,
    )
    .data(Base(upstream.base()))
    .extension(FanoutExtension::new(engine))
    .finish();
    axum::Router::new()
        .route_service("/graphql", async_graphql_axum::GraphQL::new(schema))
        .layer(fanout_budget::FanoutLayer::new(engine.clone()))
}

const ITEM: &str = "query Q { item(id: 1) { detail { value } } }";

/// Headers a page cannot send cross-site without a CORS preflight, so a
/// `GET` with one of them comes from a GraphQL client (or a page the CORS
/// policy let through).
const PREFLIGHTED: [(&str, &str); 3] = [
    ("apollo-require-preflight", "true"),
    ("x-apollo-operation-name", "Q"),
    ("content-type", "application/json"),
];

/// A cookie-authenticated app must not let another site spend its users'
/// reads (or read-only data the answer's side effects reveal): by default a
/// `GET` a page could send cross-site is refused before anything runs,
/// under both integrations, as Apollo Router refuses it; a GraphQL client's
/// `GET` runs.
#[tokio::test]
async fn by_default_a_get_a_page_could_send_cross_site_is_refused() {
    let upstream = Upstream::start().await;
    let engine = Engine::new(Config::default());
    for (way, app) in [
        ("FanoutGraphQL", app(&engine, &upstream)),
        ("FanoutLayer", layered(&engine, &upstream)),
    ] {
        let read = upstream.seen.requests();
        for headers in [
            &[][..],
            &[("cookie", "session=victim")],
            &[("accept", "application/json")],
            &[("content-type", "text/plain")],
            &[("content-type", "application/x-www-form-urlencoded")],
            &[("apollo-require-preflight", "")],
        ] {
            let answer = fanout_testkit::call(&app, get(ITEM, headers)).await;
            assert_eq!(answer.status, 400, "{way} {headers:?}: {:?}", answer.json());
            assert_eq!(
                codes(&answer.json()),
                vec!["BAD_REQUEST"],
                "{way} {headers:?}"
            );
            let message = answer.json()["errors"][0]["message"].to_string();
            assert!(message.contains("cross-site"), "{way}: {message}");
        }
        assert_eq!(upstream.seen.requests(), read, "{way}: a refused GET read");
        for header in PREFLIGHTED {
            let answer = fanout_testkit::call(&app, get(ITEM, &[header])).await;
            assert_eq!(answer.status, 200, "{way} {header:?}: {:?}", answer.json());
            assert_eq!(
                answer.json()["data"]["item"]["detail"]["value"],
                "item-1",
                "{way} {header:?}"
            );
        }
    }
    // A browser's navigation without a query still gets GraphiQL.
    let page = axum::http::Request::get("/graphql")
        .header("accept", "text/html")
        .body(axum::body::Body::empty())
        .unwrap();
    let answer = fanout_testkit::call(&app(&engine, &upstream), page).await;
    assert_eq!(answer.status, 200);
}

/// `http.csrf_get = "allow"` (an endpoint with no ambient credentials, as
/// the gateway): a plain `GET` runs, under both integrations.
#[tokio::test]
async fn csrf_get_allow_runs_a_plain_get() {
    let upstream = Upstream::start().await;
    let mut config = Config::default();
    config.http.csrf_get = Some(CsrfGet::Allow);
    let engine = Engine::new(config);
    for (way, app) in [
        ("FanoutGraphQL", app(&engine, &upstream)),
        ("FanoutLayer", layered(&engine, &upstream)),
    ] {
        let answer = fanout_testkit::call(&app, get(ITEM, &[])).await;
        assert_eq!(answer.status, 200, "{way}: {:?}", answer.json());
        assert_eq!(answer.json()["data"]["item"]["detail"]["value"], "item-1");
    }
}

#[test]
fn csrf_get_is_read_from_the_config_and_a_bad_value_names_the_key() {
    assert_eq!(Config::default().http.csrf_get, None);
    assert_eq!(
        Config::default().http.csrf_get_or_default(),
        CsrfGet::RequirePreflight
    );
    for (text, want) in [
        ("allow", CsrfGet::Allow),
        ("require_preflight", CsrfGet::RequirePreflight),
    ] {
        let config = Config::from_toml(&format!("[http]\ncsrf_get = \"{text}\"\n")).unwrap();
        assert_eq!(config.http.csrf_get, Some(want));
        assert_eq!(config.http.csrf_get_or_default(), want);
    }
    for bad in ["\"sideways\"", "true", "\"Allow\""] {
        let err = Config::from_toml(&format!("[http]\ncsrf_get = {bad}\n")).unwrap_err();
        assert_eq!(err.key(), Some("http.csrf_get"), "{bad}: {err}");
        assert!(
            err.to_string().starts_with("http.csrf_get:"),
            "{bad}: {err}"
        );
    }
}
