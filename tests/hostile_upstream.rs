//! Hostile upstreams: redirect loops and chains, redirects to other hosts,
//! bodies that never end. Every HTTP request sent upstream is a charged
//! read, capped per host; nothing runs past its bounds.
use async_graphql::{Context, EmptyMutation, EmptySubscription, Object, Schema};
use axum::http::StatusCode;
use fanout_budget::config::{Config, HostConfig};
use fanout_budget::{Engine, FanoutContext, FanoutExtension, FanoutGraphQL, Read};
// The hostile routes (`/loop`, `/chain`, `/to`, `/file`, `/endless`,
// `/trickle`, `/numbers`) are the testkit upstream's.
use fanout_testkit::Upstream as Hostile;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Query;

#[Object]
impl Query {
    /// Reads `url`; its status and body length.
    async fn fetch(&self, ctx: &Context<'_>, url: String) -> async_graphql::Result<Vec<u64>> {
        let response = ctx.upstream()?.read(Read::get(url.parse()?)).await?;
        Ok(vec![
            response.status.as_u16() as u64,
            response.body.len() as u64,
        ])
    }

    /// Reads `url` again and again for ever: after the first, every read is
    /// answered at once by de-duplication (the shape of a self-linking
    /// pagination walk). Only the deadline ends it.
    async fn spin(&self, ctx: &Context<'_>, url: String) -> async_graphql::Result<u64> {
        let url: reqwest::Url = url.parse()?;
        loop {
            ctx.upstream()?.read(Read::get(url.clone())).await?;
        }
    }

    /// Reads `url` and parses its body as a list of numbers, the parse
    /// shared by every field of the request that reads the same URL.
    async fn numbers(&self, ctx: &Context<'_>, url: String) -> async_graphql::Result<u64> {
        let response = ctx.upstream()?.read(Read::get(url.parse()?)).await?;
        let parses = ctx.data::<Arc<AtomicU64>>()?.clone();
        let numbers = response
            .derived(|| async {
                parses.fetch_add(1, SeqCst);
                response.json::<Vec<u64>>()
            })
            .await?;
        Ok(numbers.len() as u64)
    }

    /// Waits for ever on something that is not a read.
    async fn stall(&self) -> u64 {
        std::future::pending().await
    }
}

async fn ask(engine: &Engine, url: &str) -> Value {
    run(engine, &format!("{{ fetch(url: {url:?}) }}")).await
}

async fn run(engine: &Engine, query: &str) -> Value {
    run_counting(engine, query, Arc::default()).await
}

async fn run_counting(engine: &Engine, query: &str, parses: Arc<AtomicU64>) -> Value {
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(engine))
        .data(parses)
        .finish();
    let app =
        axum::Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine.clone()));
    let body = json!({ "query": query }).to_string();
    let answer = fanout_testkit::post(&app, body, &[]).await;
    serde_json::from_slice(&answer.body).unwrap()
}

fn code(answer: &Value) -> &str {
    answer["errors"][0]["extensions"]["code"]
        .as_str()
        .unwrap_or("<none>")
}

fn used(answer: &Value) -> u64 {
    answer["extensions"]["fanout"]["used"].as_u64().unwrap()
}

#[tokio::test]
async fn a_redirect_is_followed_and_each_hop_is_charged() {
    let ok = Hostile::start().await;
    let hop = Hostile::start().await;
    let engine = Engine::new(Config::default());
    let answer = ask(&engine, &hop.url(&format!("/to/{}", ok.addr.port()))).await;
    assert_eq!(answer["data"]["fetch"], json!([200, 4]), "{answer}");
    assert_eq!((hop.requests(), ok.requests()), (1, 1));
    assert_eq!(used(&answer), 2, "{answer}");
}

#[tokio::test]
async fn a_redirect_loop_ends_with_upstream_error() {
    let hostile = Hostile::start().await;
    let engine = Engine::new(Config::default());
    let answer = ask(&engine, &hostile.url("/loop/a")).await;
    assert_eq!(code(&answer), "UPSTREAM_ERROR", "{answer}");
    assert!(answer["data"].is_null());
    // a, b, then back to a: found in the chain, not sent again.
    assert_eq!(hostile.requests(), 2);
    assert_eq!(used(&answer), 2);
}

#[tokio::test]
async fn an_endless_redirect_chain_stops_at_max_redirects() {
    let hostile = Hostile::start().await;
    let engine = Engine::new(Config::default());
    let answer = ask(&engine, &hostile.url("/chain/0")).await;
    assert_eq!(code(&answer), "UPSTREAM_ERROR", "{answer}");
    // The first request and five hops, every one charged.
    assert_eq!(hostile.requests(), 6);
    assert_eq!(used(&answer), 6);
}

#[tokio::test]
async fn redirect_hops_are_bounded_by_the_budget() {
    let hostile = Hostile::start().await;
    let mut config = Config::default();
    config.budget.max_reads = 3;
    config.upstream.max_redirects = 100;
    let answer = ask(&Engine::new(config), &hostile.url("/chain/0")).await;
    assert_eq!(code(&answer), "FANOUT_BUDGET_EXHAUSTED", "{answer}");
    assert_eq!(hostile.requests(), 3, "a budget of 3 sent more");
    assert_eq!(used(&answer), 3);
}

#[tokio::test]
async fn a_hop_to_another_host_takes_that_hosts_slot() {
    let hop = Hostile::start().await;
    let capped = Hostile::start().await;
    let mut config = Config::default();
    config.hosts.insert(
        format!("127.0.0.1:{}", capped.addr.port()),
        HostConfig::default().max_concurrent(0).acquire_wait_ms(10),
    );
    let answer = ask(
        &Engine::new(config),
        &hop.url(&format!("/to/{}", capped.addr.port())),
    )
    .await;
    assert_eq!(code(&answer), "HOST_SATURATED", "{answer}");
    assert_eq!(
        capped.requests(),
        0,
        "a capped host was read through a redirect"
    );
    assert_eq!(used(&answer), 1);
}

#[tokio::test]
async fn a_redirect_out_of_http_is_refused() {
    let hostile = Hostile::start().await;
    let answer = ask(&Engine::new(Config::default()), &hostile.url("/file")).await;
    assert_eq!(code(&answer), "UPSTREAM_ERROR", "{answer}");
    assert_eq!(hostile.requests(), 1);
}

#[tokio::test]
async fn redirects_off_returns_the_redirect_itself() {
    let hostile = Hostile::start().await;
    let mut config = Config::default();
    config.upstream.max_redirects = 0;
    let answer = ask(&Engine::new(config), &hostile.url("/chain/0")).await;
    assert_eq!(answer["data"]["fetch"][0], 302, "{answer}");
    assert_eq!(hostile.requests(), 1);
}

#[tokio::test]
async fn a_client_that_follows_redirects_itself_is_refused() {
    let ok = Hostile::start().await;
    let hop = Hostile::start().await;
    // reqwest's default policy follows up to 10 redirects, uncharged.
    let engine = Engine::builder(Config::default())
        .client(reqwest::Client::new())
        .build();
    let answer = ask(&engine, &hop.url(&format!("/to/{}", ok.addr.port()))).await;
    assert_eq!(code(&answer), "UPSTREAM_ERROR", "{answer}");
    assert!(
        answer["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("Policy::none"),
        "{answer}"
    );
}

#[tokio::test]
async fn an_endless_body_is_cut_at_the_byte_cap_and_the_stream_stops() {
    let hostile = Hostile::start().await;
    let mut config = Config::default();
    config.upstream.max_response_bytes = 256 * 1024;
    let started = Instant::now();
    let answer = ask(&Engine::new(config), &hostile.url("/endless")).await;
    assert_eq!(code(&answer), "UPSTREAM_ERROR", "{answer}");
    assert!(started.elapsed() < Duration::from_secs(10));
    // The connection is dropped: the server stops streaming soon after.
    let at_answer = hostile.seen.streamed.load(SeqCst);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = hostile.seen.streamed.load(SeqCst);
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = hostile.seen.streamed.load(SeqCst);
        if now == last {
            break;
        }
        last = now;
        assert!(
            Instant::now() < deadline,
            "the upstream body is still being read"
        );
    }
    // Socket buffers hold a few MiB at most; the stream did not go on.
    assert!(
        last < at_answer + (16 << 20),
        "streamed {last} bytes, {at_answer} at the answer"
    );
}

#[tokio::test]
async fn a_trickled_endless_body_is_cut_by_the_read_timeout() {
    let hostile = Hostile::start().await;
    let mut config = Config::default();
    config.budget.read_timeout_ms = 300;
    let started = Instant::now();
    let answer = ask(&Engine::new(config), &hostile.url("/trickle")).await;
    assert_eq!(code(&answer), "UPSTREAM_TIMEOUT", "{answer}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

fn deadline(ms: u64) -> Engine {
    let mut config = Config::default();
    config.budget.deadline_ms = ms;
    Engine::new(config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_spinning_on_answered_reads_is_cut_at_the_deadline() {
    let hostile = Hostile::start().await;
    let started = Instant::now();
    let query = format!("{{ spin(url: {:?}) }}", hostile.url("/ok"));
    let answer = run(&deadline(300), &query).await;
    let took = started.elapsed();
    assert_eq!(code(&answer), "DEADLINE_EXCEEDED", "{answer}");
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(took < Duration::from_secs(5), "not cut: {took:?}");
    assert_eq!(hostile.requests(), 1, "the repeated read was sent again");
}

#[tokio::test]
async fn an_operation_waiting_on_something_else_is_cut_at_the_deadline() {
    let started = Instant::now();
    let answer = run(&deadline(300), "{ stall }").await;
    let took = started.elapsed();
    assert_eq!(code(&answer), "DEADLINE_EXCEEDED", "{answer}");
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(took < Duration::from_secs(5), "not cut: {took:?}");
}

#[tokio::test]
async fn many_fields_reading_one_large_body_parse_it_once() {
    let hostile = Hostile::start().await;
    let url = hostile.url("/numbers");
    let fields: String = (0..300)
        .map(|i| format!("n{i}: numbers(url: {url:?}) "))
        .collect();
    let parses = Arc::new(AtomicU64::new(0));
    let answer = run_counting(
        &Engine::new(Config::default()),
        &format!("{{ {fields}}}"),
        parses.clone(),
    )
    .await;
    assert_eq!(answer["data"]["n299"], 100_000, "{answer}");
    assert_eq!(hostile.requests(), 1);
    assert_eq!(
        parses.load(SeqCst),
        1,
        "the shared body was parsed more than once"
    );
}

#[tokio::test]
async fn the_answers_one_request_keeps_are_bounded_in_bytes_together() {
    let hostile = Hostile::start().await;
    let mut config = Config::default();
    // Each /numbers answer is about 590 KB: two fit, the third does not.
    config.upstream.max_request_bytes = 1_500_000;
    let fields: String = (0..3)
        .map(|i| {
            format!(
                "n{i}: numbers(url: {:?}) ",
                hostile.url(&format!("/numbers?copy={i}"))
            )
        })
        .collect();
    let answer = run(&Engine::new(config), &format!("{{ {fields}}}")).await;
    let errors = answer["errors"].as_array().expect("one read refused");
    assert_eq!(errors.len(), 1, "{answer}");
    assert_eq!(errors[0]["extensions"]["code"], "UPSTREAM_ERROR");
    assert_eq!(hostile.requests(), 3, "each distinct read was sent");
}

#[tokio::test]
async fn a_cancelled_first_deriver_hands_over_to_the_next_caller() {
    use fanout_budget::UpstreamResponse;
    let response = Arc::new(UpstreamResponse::new(
        "upstream:1",
        StatusCode::OK,
        axum::http::HeaderMap::new(),
        bytes::Bytes::from_static(b"[1,2,3]"),
    ));
    // The first caller starts deriving, then never finishes: it is dropped.
    let first = {
        let response = response.clone();
        tokio::spawn(async move {
            response
                .derived::<Vec<u64>, fanout_budget::ReadError, _, _>(std::future::pending)
                .await
        })
    };
    tokio::task::yield_now().await;
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    // The next caller derives (within a bound, not waiting on the dead one).
    let made = tokio::time::timeout(
        Duration::from_secs(5),
        response.derived(|| async { response.json::<Vec<u64>>() }),
    )
    .await
    .expect("the next caller was not left waiting")
    .unwrap();
    assert_eq!(*made, vec![1, 2, 3]);
}
