//! One budget and one de-duplication cache per HTTP request, whichever way
//! the schema runs: a 5-operation batch whose operations share keys reads
//! each distinct key once —
//!
//! 1. async-graphql-axum's stock `GraphQL` service under `FanoutLayer`, the
//!    extension on the schema;
//! 2. `FanoutGraphQL`;
//! 3. `schema.execute_batch` with one `FanoutRequest` in the batch's data.
mod common;

use async_graphql::{
    BatchRequest, BatchResponse, EmptyMutation, EmptySubscription, Request, Schema,
};
use axum::Router;
use common::*;
use fanout_budget::{inbound::Caller, Config, Engine, FanoutExtension, FanoutLayer};
use serde_json::Value;

/// Operation `i` reads items `i` and `i + 1`: 10 reads asked, 6 distinct.
fn operations() -> Vec<String> {
    (0..5)
        .map(|i| format!("{{ a: item(id: {i}) {{ detail {{ value }} }} b: item(id: {}) {{ detail {{ value }} }} }}", i + 1))
        .collect()
}
const DISTINCT: u64 = 6;

fn with_extension(engine: &Engine, upstream: &Upstream) -> TestSchema {
    Schema::build(Query, EmptyMutation, EmptySubscription)
        .data(Base(upstream.base()))
        .extension(FanoutExtension::new(engine))
        .finish()
}

fn stock_service(engine: &Engine, upstream: &Upstream) -> Router {
    let schema = with_extension(engine, upstream);
    Router::new()
        .route_service("/graphql", async_graphql_axum::GraphQL::new(schema))
        .layer(FanoutLayer::new(engine.clone()))
}

/// Every operation answered, each row's detail present; the reads the
/// operations report sum to what the upstream saw.
fn check(responses: &[Value], upstream: &Upstream, way: &str) {
    assert_eq!(responses.len(), 5, "{way}: {responses:?}");
    for r in responses {
        assert!(r.get("errors").is_none(), "{way}: {r}");
        assert!(r["data"]["a"]["detail"]["value"].is_string(), "{way}: {r}");
        assert!(r["data"]["b"]["detail"]["value"].is_string(), "{way}: {r}");
    }
    assert_eq!(upstream.seen.requests(), DISTINCT, "{way}: reads sent");
    let own = fanout_testkit::operation_reads(responses);
    assert_eq!(own, DISTINCT, "{way}: operationReads summed");
    let used: Vec<u64> = responses
        .iter()
        .map(|r| r["extensions"]["fanout"]["used"].as_u64().unwrap())
        .collect();
    assert_eq!(
        used.iter().max(),
        Some(&DISTINCT),
        "{way}: one budget, {used:?}"
    );
    for r in responses {
        let fanout = &r["extensions"]["fanout"];
        assert!(
            fanout.get("requested").is_none(),
            "{way}: no cost table, no estimate: {fanout}"
        );
    }
}

#[tokio::test]
async fn a_batch_over_shared_keys_reads_each_key_once_all_three_ways() {
    let engine = Engine::new(Config::default());

    let upstream = Upstream::start().await;
    let (status, answer) = post(&stock_service(&engine, &upstream), batch(operations())).await;
    assert_eq!(status, 200);
    check(
        answer.as_array().expect("a batch answer"),
        &upstream,
        "stock service + layer",
    );

    let upstream = Upstream::start().await;
    let (status, answer) = post(&app(&engine, &upstream), batch(operations())).await;
    assert_eq!(status, 200);
    check(
        answer.as_array().expect("a batch answer"),
        &upstream,
        "FanoutGraphQL",
    );

    let upstream = Upstream::start().await;
    let schema = with_extension(&engine, &upstream);
    let fanout = engine.begin_request(Caller::Public);
    fanout.expect_operations(5);
    let batch = BatchRequest::Batch(operations().into_iter().map(Request::new).collect());
    let responses = match schema.execute_batch(batch.data(fanout)).await {
        BatchResponse::Batch(responses) => responses,
        single => panic!("a batch answered {single:?}"),
    };
    let responses: Vec<Value> = responses
        .iter()
        .map(|r| serde_json::to_value(r).unwrap())
        .collect();
    check(&responses, &upstream, "schema.execute_batch");
}

#[tokio::test]
async fn without_the_layer_the_stock_service_gives_each_operation_its_own_budget() {
    // What the layer answers: the stock service runs each operation of a
    // batch as its own request, so the extension alone opens five scopes.
    let engine = Engine::new(Config::default());
    let upstream = Upstream::start().await;
    let schema = with_extension(&engine, &upstream);
    let bare = Router::new().route_service("/graphql", async_graphql_axum::GraphQL::new(schema));
    let (status, _) = post(&bare, batch(operations())).await;
    assert_eq!(status, 200);
    assert_eq!(upstream.seen.requests(), 10, "no shared de-duplication");
}

/// The stock service under the layer, batches capped at 3 operations and
/// bodies at 4096 bytes.
async fn capped() -> (Upstream, Router) {
    let mut config = Config::default();
    config.http.max_batch_operations = 3;
    config.http.max_body_bytes = 4096;
    let engine = Engine::new(config);
    let upstream = Upstream::start().await;
    let app = stock_service(&engine, &upstream);
    (upstream, app)
}

#[tokio::test]
async fn the_layer_refuses_a_bad_batch_before_anything_runs() {
    let (upstream, app) = capped().await;
    let (status, answer) = post(&app, batch(operations())).await;
    assert_eq!(
        (status.as_u16(), codes(&answer)),
        (400, vec!["BATCH_TOO_LARGE".to_string()])
    );
    let (status, answer) = post(&app, "[]").await;
    assert_eq!(
        (status.as_u16(), codes(&answer)),
        (400, vec!["BAD_REQUEST".to_string()])
    );
    let huge = format!(
        "{{\"query\": \"{{ item(id: 1) {{ id }} }}\", \"x\": \"{}\"}}",
        "y".repeat(5000)
    );
    let (status, answer) = post(&app, huge).await;
    assert_eq!(
        (status.as_u16(), codes(&answer)),
        (413, vec!["PAYLOAD_TOO_LARGE".to_string()])
    );
    assert_eq!(upstream.seen.requests(), 0);
}

#[tokio::test]
async fn the_layer_refuses_what_a_page_could_send_cross_site_and_counts_any_other_body() {
    let (upstream, app) = capped().await;
    let send = |headers: &[(&str, &str)], body: String| {
        let mut request = axum::http::Request::post("/graphql");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        fanout_testkit::call(&app, request.body(axum::body::Body::from(body)).unwrap())
    };
    // A body a browser sends without a CORS preflight (CSRF): refused from
    // the headers, nothing read.
    for content_type in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
    ] {
        let headers: Vec<_> = content_type
            .map(|ct| ("content-type", ct))
            .into_iter()
            .collect();
        let answer = send(&headers, batch(operations())).await;
        assert_eq!(
            (answer.status.as_u16(), codes(&answer.json())),
            (400, vec!["BAD_REQUEST".to_string()]),
            "{content_type:?}"
        );
        assert_eq!(answer.headers["connection"], "close");
    }
    // Any other body is read as JSON, as async-graphql reads it, so its
    // batch is counted whatever the type says; so is a simple type sent by
    // a client that announces itself with a header a page cannot add.
    for headers in [
        &[("content-type", "application/graphql")][..],
        &[
            ("content-type", "text/plain"),
            ("apollo-require-preflight", "true"),
        ],
    ] {
        let answer = send(headers, batch(operations())).await;
        assert_eq!(
            (answer.status.as_u16(), codes(&answer.json())),
            (400, vec!["BATCH_TOO_LARGE".to_string()]),
            "{headers:?}"
        );
    }
    // An upload is refused even when announced.
    let upload = send(
        &[
            ("content-type", "multipart/form-data; boundary=x"),
            ("apollo-require-preflight", "true"),
        ],
        "--x--".into(),
    )
    .await;
    assert_eq!(
        (upload.status.as_u16(), codes(&upload.json())),
        (400, vec!["BAD_REQUEST".to_string()])
    );
    assert_eq!(upstream.seen.requests(), 0);
}

#[tokio::test]
async fn the_layer_counts_a_batch_sent_with_any_method_and_refuses_a_stream() {
    let (upstream, app) = capped().await;
    let send = |method: &str, accept: Option<&str>, body: String| {
        let mut request = axum::http::Request::builder()
            .method(method)
            .uri("/graphql")
            .header("content-type", "application/json");
        if let Some(accept) = accept {
            request = request.header("accept", accept);
        }
        fanout_testkit::call(&app, request.body(axum::body::Body::from(body)).unwrap())
    };
    for method in ["PUT", "PATCH", "DELETE"] {
        let answer = send(method, None, batch(operations())).await;
        assert_eq!(answer.status, 400, "{method}: a 5-operation batch");
        assert_eq!(codes(&answer.json()), vec!["BATCH_TOO_LARGE".to_string()]);
        let big = send(
            method,
            None,
            format!(
                "{{\"query\":\"{{ item(id: 1) {{ id }} }}\",\"x\":\"{}\"}}",
                "y".repeat(5000)
            ),
        )
        .await;
        assert_eq!(big.status, 413, "{method}: past max_body_bytes");
    }
    let stream = r#"multipart/mixed;boundary="graphql";subscriptionSpec="1.0""#;
    let answer = send(
        "POST",
        Some(stream),
        r#"{"query":"{ item(id: 1) { detail { value } } }"}"#.into(),
    )
    .await;
    assert_eq!(
        (answer.status.as_u16(), codes(&answer.json())),
        (400, vec!["BAD_REQUEST".to_string()])
    );
    assert_eq!(upstream.seen.requests(), 0);
}

/// Refuses every operation whose text carries `#deny`, before the
/// extensions registered after it run (as an allow-list would).
struct Deny;

impl async_graphql::extensions::ExtensionFactory for Deny {
    fn create(&self) -> std::sync::Arc<dyn async_graphql::extensions::Extension> {
        std::sync::Arc::new(Deny)
    }
}

#[async_graphql::async_trait::async_trait]
impl async_graphql::extensions::Extension for Deny {
    async fn prepare_request(
        &self,
        ctx: &async_graphql::extensions::ExtensionContext<'_>,
        request: Request,
        next: async_graphql::extensions::NextPrepareRequest<'_>,
    ) -> async_graphql::ServerResult<Request> {
        if request.query.contains("#deny") {
            return Err(async_graphql::ServerError::new("denied", None));
        }
        next.run(ctx, request).await
    }
}

#[tokio::test]
async fn under_the_layer_the_batch_is_priced_first_and_never_waits_for_a_refused_operation() {
    let costs = fanout_budget::cost::CostTable::new().field(
        "Item",
        "detail",
        fanout_budget::cost::FieldCost::reads(1),
    );
    let mut config = Config::default();
    config.budget.refuse_over_estimate = true;
    config.budget.max_reads = 6;
    config.budget.deadline_ms = 60_000;
    let engine = Engine::builder(config).costs(costs).build();
    let upstream = Upstream::start().await;
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .data(Base(upstream.base()))
        .extension(Deny)
        .extension(FanoutExtension::new(&engine))
        .finish();
    let app = Router::new()
        .route_service("/graphql", async_graphql_axum::GraphQL::new(schema))
        .layer(FanoutLayer::new(engine.clone()));
    // Priced 10 > 6: every operation refused before any read.
    let (_, answer) = post(&app, batch(operations())).await;
    let refused = codes(&answer);
    assert_eq!(refused.len(), 5, "{answer}");
    assert!(
        refused
            .iter()
            .all(|c| c == "FANOUT_ESTIMATE_EXCEEDS_BUDGET"),
        "{answer}"
    );
    assert_eq!(upstream.seen.requests(), 0);
    // An operation refused by the extension before ours still counts at
    // the barrier: the other runs at once, not at the deadline.
    let started = std::time::Instant::now();
    let ops = [
        operations()[0].clone(),
        format!("{} #deny", operations()[1]),
    ];
    let (_, answer) = post(&app, batch(ops)).await;
    // Real time, a 60 s deadline: anything near it is the wait.
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "waited for the deadline"
    );
    assert!(answer[0].get("errors").is_none(), "{answer}");
    assert_eq!(answer[1]["errors"][0]["message"], "denied");
}

#[tokio::test(start_paused = true)]
async fn under_the_layer_a_body_that_trickles_is_cut_at_its_bound() {
    let mut config = Config::default();
    config.http.body_read_timeout_ms = 500;
    let engine = Engine::new(config);
    let upstream = Upstream::start().await;
    let app = stock_service(&engine, &upstream);
    // One chunk, then nothing: a slow client holding its request open.
    let first = futures::stream::once(async {
        Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"[{\"query\":"))
    });
    let body =
        axum::body::Body::from_stream(futures::StreamExt::chain(first, futures::stream::pending()));
    let request = axum::http::Request::post("/graphql")
        .header("content-type", "application/json")
        .body(body)
        .unwrap();
    let started = tokio::time::Instant::now();
    let answer = fanout_testkit::call(&app, request).await;
    assert_eq!(started.elapsed(), std::time::Duration::from_millis(500));
    assert_eq!(
        (answer.status.as_u16(), codes(&answer.json())),
        (408, vec!["REQUEST_TIMEOUT".to_string()])
    );
    assert_eq!(answer.headers["connection"], "close");
    assert_eq!(upstream.seen.requests(), 0);
}

// What a hostile client tries under the layer.

/// A mutation that counts how often it ran.
struct Bump;

#[async_graphql::Object]
impl Bump {
    async fn bump(&self, ctx: &async_graphql::Context<'_>) -> u64 {
        let ran = ctx.data_unchecked::<std::sync::Arc<std::sync::atomic::AtomicU64>>();
        ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1
    }
}

type BumpSchema = Schema<Query, Bump, EmptySubscription>;

fn bump_schema(
    upstream: &Upstream,
    extension: Option<&Engine>,
) -> (BumpSchema, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    let ran = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut builder = Schema::build(Query, Bump, EmptySubscription)
        .data(Base(upstream.base()))
        .data(ran.clone());
    if let Some(engine) = extension {
        // Stands for a persisted-query lookup (async-graphql's APQ
        // extension): the text `#bump` becomes a mutation after the HTTP
        // request was read.
        let lookup = fanout_testkit::Rewrite {
            from: "#bump",
            to: "mutation { bump }".into(),
        };
        builder = builder
            .extension(FanoutExtension::new(engine))
            .extension(lookup);
    }
    (builder.finish(), ran)
}

/// What a page on any origin can make a browser send without a preflight:
/// `<img src="https://api.example/graphql?query=mutation{bump}">`.
fn cross_site_get(
    query: &str,
    operation_name: Option<&str>,
) -> axum::http::Request<axum::body::Body> {
    let mut params = form_urlencoded::Serializer::new(String::new());
    params.append_pair("query", query);
    if let Some(name) = operation_name {
        params.append_pair("operationName", name);
        // What async-graphql's `parse_query_string` reads (7.2.1).
        params.append_pair("operation_name", name);
    }
    axum::http::Request::get(format!("/graphql?{}", params.finish()))
        .body(axum::body::Body::empty())
        .unwrap()
}

const MUTATIONS_OVER_GET: [(&str, Option<&str>); 2] = [
    ("mutation { bump }", None),
    (
        "query Q { item(id: 1) { id } } mutation M { bump }",
        Some("M"),
    ),
];

/// Cross-site `GET`s allowed (`http.csrf_get = "allow"`, the gateway's
/// setting), so that what is checked is the guard behind it: over `GET`
/// only queries run. (By default such a `GET` is refused before it runs:
/// tests/http_input.rs.)
fn allowing_cross_site_gets() -> Engine {
    let mut config = Config::default();
    config.http.csrf_get = Some(fanout_budget::config::CsrfGet::Allow);
    Engine::new(config)
}

#[tokio::test]
async fn under_the_layer_a_mutation_over_get_does_not_run() {
    let engine = allowing_cross_site_gets();
    let upstream = Upstream::start().await;
    let (schema, ran) = bump_schema(&upstream, Some(&engine));
    let app = Router::new()
        .route_service("/graphql", async_graphql_axum::GraphQL::new(schema))
        .layer(FanoutLayer::new(engine.clone()));
    for (query, name) in MUTATIONS_OVER_GET.into_iter().chain([("#bump", None)]) {
        let answer = fanout_testkit::call(&app, cross_site_get(query, name)).await;
        assert_eq!(
            ran.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "a cross-site GET ran {query:?} under FanoutLayer: {} {:?}",
            answer.status,
            answer.json()
        );
    }
    // A query over GET still runs.
    let query = "query Q { item(id: 1) { detail { value } } } mutation M { bump }";
    let answer = fanout_testkit::call(&app, cross_site_get(query, Some("Q"))).await;
    assert_eq!(
        answer.json()["data"]["item"]["detail"]["value"],
        "item-1",
        "{:?}",
        answer.json()
    );
    assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 0);
}

#[tokio::test]
async fn fanout_graphql_runs_no_mutation_over_get_however_it_is_named() {
    let engine = allowing_cross_site_gets();
    let upstream = Upstream::start().await;
    let (schema, ran) = bump_schema(&upstream, Some(&engine));
    let app = Router::new().route_service(
        "/graphql",
        fanout_budget::FanoutGraphQL::new(schema, engine),
    );
    for (query, name) in MUTATIONS_OVER_GET {
        let answer = fanout_testkit::call(&app, cross_site_get(query, name)).await;
        assert_eq!(answer.status, 405, "{query}");
    }
    // An anonymous mutation named as something else, or a name that names nothing.
    for (query, name) in [
        ("mutation { bump }", Some("Q")),
        (
            "query Q { item(id: 1) { id } } mutation M { bump }",
            Some("Nope"),
        ),
    ] {
        let answer = fanout_testkit::call(&app, cross_site_get(query, name)).await;
        // Nothing runs: a request error (200 and `data: null` under application/json).
        assert!(
            answer.json()["data"].is_null(),
            "{query} {name:?}: {:?}",
            answer.json()
        );
    }
    // A persisted mutation, registered over GET (405, but kept), then hash-only.
    use sha2::Digest as _;
    let text = "mutation { bump }";
    let hash: String = sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let ext = serde_json::json!({"persistedQuery": {"version": 1, "sha256Hash": hash}}).to_string();
    for with_text in [true, false] {
        let mut params = form_urlencoded::Serializer::new(String::new());
        if with_text {
            params.append_pair("query", text);
        }
        params.append_pair("extensions", &ext);
        let request = axum::http::Request::get(format!("/graphql?{}", params.finish()))
            .body(axum::body::Body::empty())
            .unwrap();
        let answer = fanout_testkit::call(&app, request).await;
        assert_eq!(
            answer.status,
            405,
            "with text {with_text}: {:?}",
            answer.json()
        );
    }
    // HEAD and OPTIONS are no way in either.
    for method in ["HEAD", "OPTIONS"] {
        let request = axum::http::Request::builder()
            .method(method)
            .uri("/graphql?query=mutation%7Bbump%7D")
            .header("content-type", "application/json")
            .body(axum::body::Body::from(r#"{"query":"mutation { bump }"}"#))
            .unwrap();
        let answer = fanout_testkit::call(&app, request).await;
        assert_eq!(answer.status, 405, "{method}");
    }
    assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert_eq!(upstream.seen.requests(), 0);
}

/// async-graphql-axum reads the body of every method but `GET` — `HEAD`
/// included — so a `HEAD` with a body must be bounded and counted like a
/// `POST`, and refused like one when a page could send it.
#[tokio::test]
async fn the_layer_bounds_and_counts_a_head_with_a_body() {
    let (upstream, app) = capped().await;
    let head = |body: String| {
        let request = axum::http::Request::head("/graphql")
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body))
            .unwrap();
        fanout_testkit::call(&app, request)
    };
    let answer = head(batch(operations())).await;
    assert_eq!(answer.status, 400, "a 5-operation batch over HEAD");
    assert_eq!(upstream.seen.requests(), 0, "the batch ran past the cap");
    let big = head(format!(
        "{{\"query\":\"{{ item(id: 1) {{ detail {{ value }} }} }}\",\"x\":\"{}\"}}",
        "y".repeat(5000)
    ))
    .await;
    assert_eq!(big.status, 413, "past max_body_bytes over HEAD");
    assert_eq!(upstream.seen.requests(), 0);
}

/// A `GET`'s query string carries what a body would: under the layer it is
/// bounded like one (413), as `FanoutGraphQL` bounds it.
#[tokio::test]
async fn under_the_layer_a_get_is_bounded_like_a_body() {
    let (upstream, app) = capped().await;
    let padded = format!(
        "{{ {} }}",
        "a: item(id: 1) { detail { value } } ".repeat(150)
    );
    let mut params = form_urlencoded::Serializer::new(String::new());
    params.append_pair("query", &padded);
    let request = axum::http::Request::get(format!("/graphql?{}", params.finish()))
        .header("apollo-require-preflight", "true")
        .body(axum::body::Body::empty())
        .unwrap();
    let answer = fanout_testkit::call(&app, request).await;
    assert_eq!(answer.status, 413, "{:?}", answer.json());
    assert_eq!(upstream.seen.requests(), 0);
}

/// `FanoutGraphQL` over a schema without the extension cannot bound its
/// answers while they are built: it refuses every request (500, found out
/// once by the probe, then known), and no operation runs.
#[tokio::test]
async fn fanout_graphql_refuses_a_schema_without_the_extension_every_time() {
    let engine = Engine::new(Config::default());
    let upstream = Upstream::start().await;
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .data(Base(upstream.base()))
        .finish();
    let app = Router::new().route_service(
        "/graphql",
        fanout_budget::FanoutGraphQL::new(schema, engine.clone()),
    );
    for _ in 0..3 {
        let answer = fanout_testkit::post(
            &app,
            r#"{"query":"{ item(id: 1) { detail { value } } }"}"#,
            &[],
        )
        .await;
        assert_eq!(answer.status, 500, "{:?}", answer.json());
        assert!(
            answer.json().to_string().contains("FanoutExtension"),
            "{:?}",
            answer.json()
        );
    }
    assert_eq!(upstream.seen.requests(), 0, "no operation ran");
}
