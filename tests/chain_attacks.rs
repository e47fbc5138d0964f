//! Chains of services, attacked (`src/chain/`, `src/read/propagate.rs`,
//! `src/read/budget/grant.rs`): a hostile client's `Fanout-Budget`, a
//! hostile or broken downstream's `Fanout-Spent`, and the seams with the
//! other bounds — the read quota, measure mode, upstream shares, batches,
//! de-duplication, redirects, `FanoutLayer`.
//!
//! Each test pins a behaviour that holds and is subtle, or one a hostile
//! review found broken before 2026-12-06's fixes (the "Findings" below:
//! each comment says what went wrong, the test what holds now).
//!
//! The caller is an engine over real HTTP to a loopback stand-in service
//! (as in `tests/chain.rs`) that records each request's `Fanout-Budget` and
//! reports what it is told to. Its own test binary: the Prometheus recorder
//! is process-wide.

mod common;

use async_graphql::{Context, EmptyMutation, EmptySubscription, Object, Schema};
use axum::http::{HeaderMap, StatusCode};
use axum::Router;
use common::stand_in::*;
use fanout_budget::read::Transport;
use fanout_budget::{
    Config, Engine, FanoutContext, FanoutExtension, FanoutGraphQL, FanoutLayer, Read, ReadError,
    UpstreamResponse,
};
use futures::future::BoxFuture;
use serde_json::{json, Value};
use std::future::IntoFuture;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

// ---- the caller: an engine whose resolvers call stand-ins ----

/// The stand-in a field reads unless told another host.
struct Target(String);
struct Caller;

/// A read's outcome as a string: the body, or the error's code.
fn outcome(result: Result<Arc<UpstreamResponse>, ReadError>) -> String {
    match result {
        Ok(answer) => String::from_utf8_lossy(&answer.body).into_owned(),
        Err(err) => err.code().to_string(),
    }
}

#[Object]
impl Caller {
    /// `n` POSTs to `path` of `host` (else the target) at once.
    async fn call(
        &self,
        ctx: &Context<'_>,
        n: u64,
        #[graphql(default = "/call")] path: String,
        host: Option<String>,
    ) -> Vec<String> {
        let base = host.unwrap_or_else(|| ctx.data_unchecked::<Target>().0.clone());
        let upstream = ctx.upstream().unwrap();
        let rows = (0..n).map(|i| {
            let url = format!("http://{base}{path}").parse().unwrap();
            async move {
                let read = Read::new(http::Method::POST, url).body(i.to_string());
                outcome(upstream.read(read).await)
            }
        });
        futures::future::join_all(rows).await
    }

    /// `n` identical GETs of `path` of the target at once.
    async fn get(
        &self,
        ctx: &Context<'_>,
        #[graphql(default = 1)] n: u64,
        #[graphql(default = "/call")] path: String,
    ) -> Vec<String> {
        let base = &ctx.data_unchecked::<Target>().0;
        let upstream = ctx.upstream().unwrap();
        let rows = (0..n).map(|_| {
            let url = format!("http://{base}{path}").parse().unwrap();
            async move { outcome(upstream.read(Read::get(url)).await) }
        });
        futures::future::join_all(rows).await
    }

    /// One POST to each of `hosts`, one after the other.
    async fn seq(&self, ctx: &Context<'_>, hosts: Vec<String>) -> Vec<String> {
        let upstream = ctx.upstream().unwrap();
        let mut out = Vec::new();
        for host in hosts {
            let url = format!("http://{host}/call").parse().unwrap();
            out.push(outcome(
                upstream
                    .read(Read::new(http::Method::POST, url).body("seq"))
                    .await,
            ));
        }
        out
    }

    /// A GraphQL POST of `query` to `host`'s `/graphql`: its status and body.
    async fn graphql(&self, ctx: &Context<'_>, host: String, query: String) -> String {
        let upstream = ctx.upstream().unwrap();
        let url = format!("http://{host}/graphql").parse().unwrap();
        let read = Read::new(http::Method::POST, url)
            .header(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            )
            .body(json!({ "query": query }).to_string());
        match upstream.read(read).await {
            Ok(answer) => format!(
                "{} {}",
                answer.status.as_u16(),
                String::from_utf8_lossy(&answer.body)
            ),
            Err(err) => err.code().to_string(),
        }
    }

    /// The request's budget as it stands: `[limit, used, remaining]`.
    async fn budget(&self, ctx: &Context<'_>) -> Vec<u64> {
        let b = ctx.fanout_request().unwrap().budget().snapshot();
        vec![b.limit, b.used, b.remaining]
    }
}

fn engine(config: &str) -> Engine {
    Engine::new(Config::from_toml(config).unwrap())
}

/// The caller's app on `engine`, reading the stand-in at `host`.
fn app_on(engine: Engine, host: &str) -> Router {
    let schema = Schema::build(Caller, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .data(Target(host.to_string()))
        .finish();
    Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine))
}

fn caller(config: &str, host: &str) -> Router {
    app_on(engine(config), host)
}

/// `[hosts."HOST"] propagate = true` for `host`.
fn marked(host: &str) -> String {
    format!("[hosts.\"{host}\"]\npropagate = true\n")
}

async fn query(app: &Router, query: &str, headers: &[(&str, &str)]) -> fanout_testkit::Answer {
    fanout_testkit::post(app, json!({ "query": query }).to_string(), headers).await
}

fn used(body: &Value) -> u64 {
    body["extensions"]["fanout"]["used"].as_u64().unwrap()
}

fn grants(service: &Service) -> Vec<Option<u64>> {
    (service.budgets().iter())
        .map(|b| b.as_deref().and_then(|b| member(b, "reads")))
        .collect()
}

// =====================================================================
// Findings
// =====================================================================

/// `[budget] mode = "measure"` with `[quota]` enforcing. It was: a read to
/// a `propagate` host carried no `reads`, the service spent as its own
/// limit let it, and the client's quota was charged no more than its
/// reservation — the chain spent past an enforced read quota. Now the
/// grant is cut to the quota's reservation, which measure mode does not
/// lift.
#[tokio::test]
async fn in_measure_mode_a_chain_still_spends_within_an_enforced_read_quota() {
    let running = stand_in().await;
    let service = &running.service;
    // The service spends 50 reads for each read it is sent (its own limit).
    service.reports(Report::Reads(50));
    let config = format!(
        "[budget]\nmax_reads = 20\nmode = \"measure\"\n\
         [quota]\nreads = 5\nperiod_secs = 3600\nmode = \"enforce\"\n{}",
        marked(&running.host)
    );
    let app = caller(&config, &running.host);
    let answer = query(&app, "{ call(n: 1) }", &[]).await;
    let body = answer.json();
    assert_eq!(answer.status, 200, "{body}");
    // The edge's own reads are held to the quota's 5 (enforce), but the
    // service was not told any limit at all:
    let sent = service.budgets()[0].clone().unwrap();
    let quota = &body["extensions"]["fanout"]["quota"];
    // The read and the 4 of its grant the service is believed to have
    // spent: the quota's 5, no more.
    assert_eq!(used(&body), 5, "{body}");
    assert!(
        member(&sent, "reads").is_some_and(|r| r <= 4),
        "an enforced quota of 5 reserved 5: the service may spend at most 4, \
         but was sent `{sent}` and spent 50 (quota after: {quota})"
    );
}

/// `[upstreams."NAME"] max_reads` is that upstream's share of a request's
/// budget (§13: "past it, that upstream's reads are refused, the others go
/// on"). It was: a `propagate` upstream's grant ignored its share, one read
/// to it given the whole budget left, starving every other upstream of the
/// request. Now a grant is cut to what is left of the share, and taken
/// from it.
#[tokio::test]
async fn a_propagate_upstreams_grant_is_cut_to_its_share_and_the_others_go_on() {
    let search = stand_in().await;
    let registry = stand_in().await;
    search.service.reports(Report::Granted); // spends all it is given
    let config = format!(
        "[budget]\nmax_reads = 20\n\
         [upstreams.search]\nurl = \"http://{}\"\nmax_reads = 2\npropagate = true\n\
         [upstreams.registry]\nurl = \"http://{}\"\n",
        search.host, registry.host
    );
    let app = caller(&config, &search.host);
    let q = format!(
        "{{ seq(hosts: [\"{}\", \"{}\"]) }}",
        search.host, registry.host
    );
    let body = query(&app, &q, &[]).await.json();
    let grant = grants(&search.service)[0];
    let outcomes = body["data"]["seq"].clone();
    // search: at most 2 reads of the request's 20 are its share; the
    // registry's read after it should go on.
    assert_eq!(
        outcomes[1],
        "row 0",
        "search (share 2) was granted {grant:?} reads and spent them; the \
         registry's read after it: {outcomes} (used {})",
        used(&body)
    );
    assert!(
        grant.unwrap() <= 1,
        "grant {grant:?} past search's share of 2"
    );
}

/// A handler behind `FanoutLayer` that reads through the request's scope
/// (`Extension<FanoutRequest>`, which the layer documents) was never
/// refused past `max_hops`: the hop count was checked only where a GraphQL
/// operation runs. Now every read of such a request is refused
/// (`FANOUT_TOO_MANY_HOPS`), whichever way it is asked for.
#[tokio::test]
async fn a_read_through_the_layers_scope_is_refused_past_max_hops() {
    let running = stand_in().await;
    let config = format!("[budget]\nmax_hops = 3\n{}", marked(&running.host));
    let engine = engine(&config);
    let target = running.host.clone();
    let handler =
        move |axum::Extension(scope): axum::Extension<fanout_budget::request::FanoutRequest>| {
            let target = target.clone();
            async move {
                let op = scope.operation();
                let url = format!("http://{target}/call").parse().unwrap();
                outcome(op.upstream().read(Read::get(url)).await)
            }
        };
    let app = Router::new()
        .route("/graphql", axum::routing::get(handler))
        .layer(FanoutLayer::new(engine));
    let request = http::Request::get("/graphql")
        .header("fanout-budget", "hops=40")
        .body(axum::body::Body::empty())
        .unwrap();
    let answer = fanout_testkit::call(&app, request).await;
    let sent = running.service.budgets();
    assert!(
        sent.is_empty(),
        "hops=40 is past max_hops=3, yet a read was sent with {sent:?} ({:?})",
        answer.body
    );
}

/// An engine whose every read is answered at once, `Fanout-Spent` as given.
#[derive(Debug)]
struct Spends(&'static str, AtomicU64);

impl Transport for Spends {
    fn fetch<'a>(
        &'a self,
        _read: Read,
        host: &'a str,
    ) -> BoxFuture<'a, Result<UpstreamResponse, ReadError>> {
        self.1.fetch_add(1, SeqCst);
        let mut headers = HeaderMap::new();
        headers.insert("fanout-spent", self.0.parse().unwrap());
        let response = UpstreamResponse::new(host, StatusCode::OK, headers, "{}".into());
        Box::pin(async move { Ok(response) })
    }
}

/// Measure mode believes what a `propagate` host reports in full, with
/// nothing to cap it: each answer may add 999,999,999,999,999 (the largest
/// RFC 9651 integer) to `used`, and 18,447 of them pass `u64::MAX`. It
/// overflowed (a panic in a debug build; in release `used` wrapped to a
/// small number). Now every count saturates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lying_fanout_spent_in_measure_mode_saturates_used() {
    let transport = Arc::new(Spends("reads=999999999999999", AtomicU64::new(0)));
    let mut config = Config::from_toml(
        "[budget]\nmode = \"measure\"\nmax_reads = 10\nmax_concurrent_reads = 64\n\
         [hosts.\"svc.internal:80\"]\npropagate = true\n",
    )
    .unwrap();
    config.upstream.max_request_bytes = usize::MAX;
    let engine = Engine::builder(config).transport(transport.clone()).build();
    let run = tokio::spawn(async move {
        let request = engine.begin_request(fanout_budget::inbound::Caller::Public);
        let op = request.operation();
        let upstream = op.upstream();
        let mut last = 0u64;
        for i in 0..18_500u64 {
            let url = format!("http://svc.internal/{i}").parse().unwrap();
            let read = Read::new(http::Method::POST, url);
            let _ = upstream.read(read).await;
            let now = request.budget().used();
            if now < last {
                return Err(format!("used went from {last} back to {now} at read {i}"));
            }
            last = now;
        }
        Ok(last)
    });
    match run.await {
        Ok(Ok(used)) => assert_eq!(used, u64::MAX, "saturates"),
        Ok(Err(wrapped)) => panic!("{wrapped}"),
        Err(panicked) => panic!("the read path panicked: {panicked}"),
    }
}

/// The same over a WebSocket: with `[budget] mode = "measure"` and the
/// connection's budget (`[subscriptions]`) enforcing, an event's read to a
/// `propagate` host carried no `reads`, and what the service reported was
/// paid by the bucket only as far as it had reads: the chain spent past the
/// connection's burst. Now the grant is sized by the request's own limit
/// and cut to what the bucket pays, up front.
#[tokio::test]
async fn in_measure_mode_a_chain_still_spends_within_a_websockets_budget() {
    let running = stand_in().await;
    running.service.reports(Report::Reads(50));
    let config = format!(
        "[budget]\nmax_reads = 10\nmode = \"measure\"\n\
         [subscriptions]\nburst = 5\nreads_per_minute = 1\nmode = \"enforce\"\n{}",
        marked(&running.host)
    );
    let config = Config::from_toml(&config).unwrap();
    let engine = Engine::new(config.clone());
    let schema = Schema::build(Caller, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .data(Target(running.host.clone()))
        .finish();
    let router = Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let serving = fanout_budget::inbound::serve(listener, router, &config).into_future();
    let server = tokio::spawn(async move {
        let _ = serving.await;
    });
    let mut socket = fanout_testkit::ws::connect_from(address, std::net::Ipv4Addr::LOCALHOST)
        .await
        .unwrap();
    fanout_testkit::ws::init(&mut socket, json!({})).await;
    let mut spent = Vec::new();
    for id in ["1", "2", "3"] {
        fanout_testkit::ws::subscribe(&mut socket, id, "{ call(n: 1) }").await;
        let events = fanout_testkit::ws::until_complete(&mut socket, id).await;
        spent.push(events[0]["payload"].clone());
    }
    server.abort();
    let sent = running.service.budgets();
    // The connection's burst is 5 reads, enforced; the service was sent no
    // limit, and spent 50 for each read the connection paid.
    let behind: u64 = 50 * sent.len() as u64;
    assert!(
        sent.iter().all(|b| b
            .as_deref()
            .and_then(|b| member(b, "reads"))
            .is_some_and(|r| r <= 4)),
        "a connection with a burst of 5 (enforced): its reads were sent {sent:?}, \
         and the services behind spent {behind}; the events: {spent:?}"
    );
}

/// `app` served over loopback TCP as the engine serves it; its address
/// and the task (abort it to stop).
async fn serve(app: Router, config: &Config) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let serving = fanout_budget::inbound::serve(listener, app, config).into_future();
    let task = tokio::spawn(async move {
        let _ = serving.await;
    });
    (address, task)
}

/// `deadline-ms` is the time until the caller cuts the read less the 100 ms
/// a service may take to answer past its deadline. A `read_timeout_ms` of
/// 100 or less would give every service no time at all (a service on the
/// engine, opening its request with none, answers `408`): refused at start,
/// naming the key, when any host propagates.
#[test]
fn a_read_timeout_that_leaves_a_service_no_time_is_refused_at_start() {
    let config = format!("[budget]\nread_timeout_ms = 100\n{}", marked("svc:80"));
    let refused = Config::from_toml(&config).unwrap_err();
    assert_eq!(refused.key(), Some("budget.read_timeout_ms"), "{refused:?}");
    // Without a host that propagates, it is a read timeout like any other.
    assert!(Config::from_toml("[budget]\nread_timeout_ms = 100\n").is_ok());
    let config = format!("[budget]\nread_timeout_ms = 101\n{}", marked("svc:80"));
    assert!(Config::from_toml(&config).is_ok());
}

/// A read to a service with 100 ms or less before it is cut would give the
/// service no time: it is refused `DEADLINE_EXCEEDED` before it is charged
/// or sent, so no grant is held for a service that could spend nothing.
#[tokio::test]
async fn a_read_with_no_time_left_to_give_is_refused_before_it_is_charged() {
    let running = stand_in().await;
    let config = format!(
        "[budget]\nmax_reads = 20\n[quota]\nreads = 20\nperiod_secs = 3600\n{}",
        marked(&running.host)
    );
    let app = caller(&config, &running.host);
    // Its caller left it 60 ms.
    let answer = query(
        &app,
        "{ call(n: 1) }",
        &[("fanout-budget", "deadline-ms=60")],
    )
    .await;
    let body = answer.json();
    assert!(running.service.budgets().is_empty(), "nothing was sent");
    assert_eq!(used(&body), 0, "{body}");
    assert_eq!(answer.headers["fanout-spent"], "reads=0");
    assert_eq!(
        body["extensions"]["fanout"]["quota"]["remaining"], 20,
        "{body}"
    );
}

// =====================================================================
// What holds (subtle, pinned)
// =====================================================================

/// A caller's header only lowers, even written as 16 digits (not an RFC
/// 9651 integer: ignored, so the limit stays), as several lines, or with a
/// lower value hidden after a higher one in another line.
#[tokio::test]
async fn a_callers_header_never_raises_whatever_its_form() {
    let running = stand_in().await;
    let app = caller("[budget]\nmax_reads = 7\n", &running.host);
    for (value, limit) in [
        ("reads=1000000000000000", 7),
        ("reads=999999999999999", 7),
        ("reads=3, reads=9000", 7), // the last wins: 9000, lowered to 7
        ("reads=9000, reads=3", 3),
        ("reads=2;x=1000", 2),
        ("reads=?1", 7),
        ("reads=-0", 0),
        ("reads=0", 0),
        ("reads=5,,,,reads=1", 1), // not a dictionary: read piece by piece
    ] {
        let body = query(&app, "{ budget }", &[("fanout-budget", value)])
            .await
            .json();
        assert_eq!(body["data"]["budget"][0], limit, "{value}: {body}");
    }
    // Several lines: one field (the last value wins).
    let request = fanout_testkit::graphql_request(
        json!({"query": "{ budget }"}).to_string(),
        &[
            ("fanout-budget", "reads=9000"),
            ("fanout-budget", "reads=4"),
        ],
        None,
    );
    let body = fanout_testkit::call(&app, request).await.json();
    assert_eq!(body["data"]["budget"][0], 4, "{body}");
}

/// A 60 KB header of thousands of members, and bytes that are not UTF-8,
/// are read in linear time and lower nothing they should not.
#[tokio::test]
async fn a_huge_or_binary_header_is_read_and_ignored() {
    let running = stand_in().await;
    let app = caller("[budget]\nmax_reads = 7\n", &running.host);
    let huge = "x=1,".repeat(15_000) + "reads=2";
    let started = std::time::Instant::now();
    let body = query(&app, "{ budget }", &[("fanout-budget", &huge)])
        .await
        .json();
    assert_eq!(body["data"]["budget"][0], 2, "{body}");
    let commas = ",".repeat(60_000);
    let body = query(&app, "{ budget }", &[("fanout-budget", &commas)])
        .await
        .json();
    assert_eq!(body["data"]["budget"][0], 7, "{body}");
    assert!(started.elapsed() < Duration::from_secs(5));
    let mut request =
        fanout_testkit::graphql_request(json!({"query": "{ budget }"}).to_string(), &[], None);
    request.headers_mut().insert(
        "fanout-budget",
        http::HeaderValue::from_bytes(b"reads=\xff\xfe, hops=\x80").unwrap(),
    );
    let answer = fanout_testkit::call(&app, request).await;
    assert_eq!(answer.json()["data"]["budget"][0], 7);
    assert_eq!(answer.headers["fanout-spent"], "reads=0");
}

/// A `hops` of 15 digits is refused; one of 16 is not an integer RFC 9651
/// writes, ignored (as an absent `hops`: a client gains nothing it would
/// not have by sending none); the engine never writes more than 15.
#[tokio::test]
async fn hops_near_the_largest_integer() {
    let running = stand_in().await;
    let app = caller(
        &format!("[budget]\nmax_hops = 8\n{}", marked(&running.host)),
        &running.host,
    );
    let body = query(
        &app,
        "{ budget }",
        &[("fanout-budget", "hops=999999999999999")],
    )
    .await
    .json();
    assert_eq!(
        body["errors"][0]["extensions"]["code"], "FANOUT_TOO_MANY_HOPS",
        "{body}"
    );
    let body = query(&app, "{ call(n: 1) }", &[("fanout-budget", "hops=8")])
        .await
        .json();
    assert_eq!(body["data"]["call"][0], "row 0", "{body}");
    let sent = running.service.budgets()[0].clone().unwrap();
    assert_eq!(member(&sent, "hops"), Some(9), "{sent}");
}

/// A downstream's `Fanout-Spent` past its grant, malformed, repeated, 16
/// digits or negative never charges more than the grant; a garbled one
/// gives the grant back (as no answer header does).
#[tokio::test]
async fn a_lying_fanout_spent_is_believed_only_up_to_the_grant() {
    recorder();
    let running = stand_in().await;
    let service = &running.service;
    let app = caller(
        &format!("[budget]\nmax_reads = 10\n{}", marked(&running.host)),
        &running.host,
    );
    for (raw, expected) in [
        ("reads=999999999999999", 10),
        ("reads=9999999999999999", 1), // not an integer: ignored, all back
        ("reads=-5", 1),
        ("reads=3, reads=2", 3),
        ("reads=5, reads=@@", 6), // not a dictionary: piece by piece
        ("reads=3;x=99", 4),
        ("reads=(1 2 3)", 1),
    ] {
        service.reports(Report::Raw(raw));
        let body = query(&app, "{ call(n: 1) }", &[]).await.json();
        assert_eq!(used(&body), expected, "{raw}: {body}");
    }
    service.reports(Report::Nothing);
    let body = query(&app, "{ call(n: 1) }", &[]).await.json();
    assert_eq!(used(&body), 1, "{body}");
    // What was not believed is counted.
    let ignored = || counted("fanout_budget_header_ignored_total", &["member=\"spent\""]);
    let beyond = || counted("fanout_spent_beyond_grant_reads_total", &[]);
    let (ignored_before, beyond_before) = (ignored(), beyond());
    service.reports(Report::Raw("reads=-5"));
    query(&app, "{ call(n: 1) }", &[]).await;
    service.reports(Report::Raw("reads=109"));
    query(&app, "{ call(n: 1) }", &[]).await;
    assert!(ignored() - ignored_before >= 1.0);
    assert!(
        beyond() - beyond_before >= 100.0,
        "109 reported of a grant of 9"
    );
}

/// Two identical `GET`s to a `propagate` host in one request are one read
/// with one grant; a redirect from a marked host to a marked host gives
/// the hop a grant of its own, and `Fanout-Spent` on the `3xx` is settled
/// as any answer's.
#[tokio::test]
async fn dedup_and_a_redirect_between_marked_hosts() {
    let a = stand_in().await;
    let b = stand_in().await;
    let config = format!(
        "[budget]\nmax_reads = 20\n{}{}",
        marked(&a.host),
        marked(&b.host)
    );
    let app = caller(&config, &a.host);
    a.service.reports(Report::Reads(2));
    let body = query(&app, "{ get(n: 3) }", &[]).await.json();
    assert_eq!(a.service.arrived(), 1, "{body}");
    assert_eq!(used(&body), 3, "one read and the 2 it spent: {body}");
    // A (marked) redirects to B (marked): each hop granted, each settled.
    a.service.seen.lock().unwrap().clear();
    *a.service.elsewhere.lock().unwrap() = format!("http://{}/call", b.host);
    a.service.reports(Report::Reads(4));
    b.service.reports(Report::Reads(1));
    let body = query(&app, "{ get(path: \"/redirect\") }", &[])
        .await
        .json();
    assert_eq!(body["data"]["get"][0], "row 0", "{body}");
    assert_eq!(grants(&a.service), [Some(19)]);
    // The 3xx kept 4 of its 19; 20 - 2 reads - 4 = 14 left for the hop.
    assert_eq!(grants(&b.service), [Some(14)]);
    assert_eq!(used(&body), 2 + 4 + 1, "{body}");
}

/// An answer from a `cache_control` host that marks it cacheable is kept
/// and answers the next request without a read or a grant; the reads the
/// service spent making it were charged once.
#[tokio::test]
async fn a_cached_answer_of_a_marked_host_is_free_again() {
    let running = stand_in().await;
    running.service.reports(Report::Reads(3));
    let config = format!(
        "[budget]\nmax_reads = 20\n[hosts.\"{}\"]\npropagate = true\ncache_control = true\n",
        running.host
    );
    let app = caller(&config, &running.host);
    let first = query(&app, "{ get(path: \"/cached\") }", &[]).await.json();
    assert_eq!(used(&first), 4, "{first}");
    let again = query(&app, "{ get(path: \"/cached\") }", &[]).await.json();
    assert_eq!(again["data"]["get"][0], "cached", "{again}");
    assert_eq!(used(&again), 0, "{again}");
    assert_eq!(running.service.arrived(), 1);
}

/// The operations of a batch share one budget, and reads they start
/// together split what is left evenly, whichever operation they belong to.
#[tokio::test]
async fn a_batchs_operations_split_grants_evenly() {
    let running = stand_in().await;
    running.service.reports(Report::Reads(0));
    let app = caller(
        &format!("[budget]\nmax_reads = 20\n{}", marked(&running.host)),
        &running.host,
    );
    let batch = json!([
        {"query": "{ call(n: 1) }"},
        {"query": "{ call(n: 1) }"},
        {"query": "{ call(n: 2) }"}
    ]);
    let answer = fanout_testkit::post(&app, batch.to_string(), &[]).await;
    assert_eq!(answer.status, 200);
    // 4 reads charged, 16 left among 4 asking: 4 each.
    assert_eq!(grants(&running.service), [Some(4); 4], "{}", answer.json());
}

/// `coalesce = true` on a `propagate` host has no effect: two requests'
/// identical reads in flight together are two reads, each with its own
/// request's grant.
#[tokio::test]
async fn coalescing_is_skipped_for_a_marked_host() {
    let running = stand_in().await;
    let service = running.service.clone();
    service.held.store(true, SeqCst);
    let config = format!(
        "[budget]\nmax_reads = 10\n[hosts.\"{}\"]\npropagate = true\ncoalesce = true\n",
        running.host
    );
    let app = caller(&config, &running.host);
    let (a, b) = (app.clone(), app.clone());
    let first =
        tokio::spawn(async move { query(&a, "{ get }", &[("fanout-budget", "reads=4")]).await });
    let second = tokio::spawn(async move { query(&b, "{ get }", &[]).await });
    fanout_testkit::until("both reads sent", Duration::from_secs(10), async || {
        service.arrived() == 2
    })
    .await;
    let mut given = grants(&service);
    given.sort();
    assert_eq!(given, [Some(3), Some(9)]);
    service.release();
    let (first, second) = (first.await.unwrap().json(), second.await.unwrap().json());
    assert_eq!((used(&first), used(&second)), (4, 10), "{first} {second}");
}

/// Under `FanoutLayer` and the stock service, a request past `max_hops`
/// is refused as under `FanoutGraphQL`: HTTP 200, `data: null`,
/// `FANOUT_TOO_MANY_HOPS`, no read, `Fanout-Spent: reads=0`; a caller's
/// header lowers `X-Cost-Max` too.
#[tokio::test]
async fn the_layer_refuses_past_max_hops_and_lowers_the_limit() {
    let running = stand_in().await;
    let config = format!(
        "[budget]\nmax_hops = 2\nmax_reads = 9\n[http]\ncost_headers = true\n{}",
        marked(&running.host)
    );
    let engine = engine(&config);
    let schema = Schema::build(Caller, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .data(Target(running.host.clone()))
        .finish();
    let app = Router::new()
        .route_service("/graphql", async_graphql_axum::GraphQL::new(schema))
        .layer(FanoutLayer::new(engine));
    let answer = query(&app, "{ call(n: 1) }", &[("fanout-budget", "hops=3")]).await;
    let body = answer.json();
    assert_eq!(answer.status, 200, "{body}");
    assert!(body["data"].is_null(), "{body}");
    assert_eq!(
        body["errors"][0]["extensions"]["code"], "FANOUT_TOO_MANY_HOPS",
        "{body}"
    );
    assert_eq!(answer.headers["fanout-spent"], "reads=0");
    assert_eq!(running.service.arrived(), 0);
    let answer = query(
        &app,
        "{ call(n: 1) }",
        &[("fanout-budget", "reads=3, hops=2")],
    )
    .await;
    assert_eq!(answer.headers["x-cost-max"], "3", "{:?}", answer.headers);
    // The read and all of the grant of 2 it was given (reported whole).
    assert_eq!(answer.headers["fanout-spent"], "reads=3");
    assert_eq!(answer.headers["x-cost-actual"], "3");
    assert_eq!(grants(&running.service), [Some(2)]);
    let sent = running.service.budgets()[0].clone().unwrap();
    assert_eq!(member(&sent, "hops"), Some(3), "{sent}");
}

/// Under `application/graphql-response+json` the refusal past `max_hops`
/// is still HTTP 200 with `data: null`, and a `GET` carries the header
/// as a `POST` does.
#[tokio::test]
async fn past_max_hops_under_either_media_type_and_over_get() {
    let running = stand_in().await;
    let app = caller(
        &format!("[budget]\nmax_hops = 0\n{}", marked(&running.host)),
        &running.host,
    );
    let answer = query(
        &app,
        "{ call(n: 1) }",
        &[
            ("fanout-budget", "hops=1"),
            ("accept", "application/graphql-response+json"),
        ],
    )
    .await;
    assert_eq!(answer.status, 200);
    assert!(answer.json()["data"].is_null());
    let request = http::Request::get("/graphql?query=%7B%20get%20%7D")
        .header("fanout-budget", "hops=1")
        .header("apollo-require-preflight", "true")
        .body(axum::body::Body::empty())
        .unwrap();
    let answer = fanout_testkit::call(&app, request).await;
    assert_eq!(
        answer.json()["errors"][0]["extensions"]["code"],
        "FANOUT_TOO_MANY_HOPS",
        "{:?}",
        answer.body
    );
    assert_eq!(running.service.arrived(), 0);
}

/// A WebSocket event's grant, with every limit enforcing, is paid by the
/// connection's bucket up front and cut to what it pays; the upgrade's own
/// `Fanout-Budget` is ignored.
#[tokio::test]
async fn a_websocket_events_grant_is_cut_to_the_connections_bucket() {
    let running = stand_in().await;
    running.service.reports(Report::Reads(1));
    let config = format!(
        "[budget]\nmax_reads = 20\n[subscriptions]\nburst = 5\nreads_per_minute = 1\n{}",
        marked(&running.host)
    );
    let config = Config::from_toml(&config).unwrap();
    let engine = Engine::new(config.clone());
    let app = app_on(engine, &running.host);
    let (address, task) = serve(app, &config).await;
    let mut socket =
        fanout_testkit::ws::connect_from(address.parse().unwrap(), std::net::Ipv4Addr::LOCALHOST)
            .await
            .unwrap();
    fanout_testkit::ws::init(&mut socket, json!({})).await;
    fanout_testkit::ws::subscribe(&mut socket, "1", "{ call(n: 1) }").await;
    let events = fanout_testkit::ws::until_complete(&mut socket, "1").await;
    task.abort();
    // 1 read paid, 4 left in the bucket: the grant is 4, not 19.
    assert_eq!(grants(&running.service), [Some(4)]);
    let fanout = &events[0]["payload"]["extensions"]["fanout"];
    // The bucket paid the grant up front and has no give-back.
    assert_eq!(fanout["used"], 5, "{fanout}");
}

/// A caller's `deadline-ms=0` opens a request with no time: nothing is
/// read, and its answer (a POST's body cannot be read in 0 ms: 408)
/// carries `Fanout-Spent: reads=0`, which gives the grant back.
#[tokio::test]
async fn deadline_ms_0_reads_nothing_and_gives_the_grant_back() {
    let running = stand_in().await;
    let app = caller(
        &format!("[budget]\nmax_reads = 20\n{}", marked(&running.host)),
        &running.host,
    );
    let answer = query(
        &app,
        "{ call(n: 1) }",
        &[("fanout-budget", "deadline-ms=0, reads=3")],
    )
    .await;
    assert_eq!(answer.headers["fanout-spent"], "reads=0");
    assert_eq!(running.service.arrived(), 0, "{:?}", answer.body);
}

/// A `401` from a marked host is an answer: its `Fanout-Spent` is charged
/// up to its grant, and the rest given back.
#[tokio::test]
async fn a_401_from_a_marked_host_settles_its_grant() {
    let running = stand_in().await;
    running.service.reports(Report::Reads(2));
    let app = caller(
        &format!("[budget]\nmax_reads = 20\n{}", marked(&running.host)),
        &running.host,
    );
    let body = query(&app, "{ call(n: 1, path: \"/auth\") }", &[])
        .await
        .json();
    assert_eq!(body["data"]["call"][0], "UPSTREAM_UNAUTHORIZED", "{body}");
    assert_eq!(used(&body), 3, "{body}");
}

/// The header is believed from an internal caller too, only lowering its
/// `internal_max_reads`; the internal token does not lift `max_hops`.
#[tokio::test]
async fn an_internal_callers_header_only_lowers() {
    let running = stand_in().await;
    let config = "[budget]\nmax_reads = 5\ninternal_max_reads = 50\nmax_hops = 1\n\
                  [rate_limit]\ninternal_token = \"s3cret\"\n";
    let app = caller(config, &running.host);
    let token = ("x-internal-token", "s3cret");
    let limit = |body: Value| body["data"]["budget"][0].clone();
    let body = query(&app, "{ budget }", &[token]).await.json();
    assert_eq!(limit(body), 50);
    let body = query(&app, "{ budget }", &[token, ("fanout-budget", "reads=7")])
        .await
        .json();
    assert_eq!(limit(body), 7);
    let body = query(&app, "{ budget }", &[token, ("fanout-budget", "reads=70")])
        .await
        .json();
    assert_eq!(limit(body), 50);
    let body = query(&app, "{ budget }", &[token, ("fanout-budget", "hops=2")])
        .await
        .json();
    assert_eq!(
        body["errors"][0]["extensions"]["code"], "FANOUT_TOO_MANY_HOPS",
        "{body}"
    );
}

/// A service in `budget.mode = "measure"` rules its own limit (the book's
/// "Measure mode"): given a grant of 2 it still sends all its reads, and
/// its caller believes it only up to the grant. So the guarantee "the
/// reads the far end sends ≤ the edge's max_reads" holds only while every
/// service of the chain enforces.
#[tokio::test]
async fn a_measuring_service_spends_past_its_grant_and_is_believed_up_to_it() {
    let far = stand_in().await;
    let service_config = Config::from_toml("[budget]\nmode = \"measure\"\n").unwrap();
    let service = app_on(Engine::new(service_config.clone()), &far.host);
    let (b, task) = serve(service, &service_config).await;
    let app = caller(&format!("[budget]\nmax_reads = 3\n{}", marked(&b)), &b);
    let q = format!("{{ graphql(host: \"{b}\", query: \"{{ call(n: 5) }}\") }}");
    let body = query(&app, &q, &[]).await.json();
    task.abort();
    assert!(
        body["data"]["graphql"]
            .as_str()
            .unwrap()
            .starts_with("200 "),
        "{body}"
    );
    // The edge's budget is 3; the far end received 5.
    assert_eq!(far.service.arrived(), 5);
    assert_eq!(used(&body), 3, "{body}");
}

/// A marked host's `3xx` to a host that is not marked: the `3xx`'s
/// `Fanout-Spent` is settled against its grant, and the hop — which gets
/// no header — is not believed whatever it reports.
#[tokio::test]
async fn a_redirect_to_an_unmarked_host_is_charged_only_the_marked_hops_report() {
    let a = stand_in().await;
    let c = stand_in().await;
    let app = caller(
        &format!("[budget]\nmax_reads = 20\n{}", marked(&a.host)),
        &a.host,
    );
    *a.service.elsewhere.lock().unwrap() = format!("http://{}/call", c.host);
    a.service.reports(Report::Reads(3));
    c.service.reports(Report::Reads(7));
    let body = query(&app, "{ get(path: \"/redirect\") }", &[])
        .await
        .json();
    assert_eq!(body["data"]["get"][0], "row 0", "{body}");
    assert_eq!(c.service.budgets(), [None]);
    // Two reads sent, the 3xx's 3 of its grant; the third party's 7 ignored.
    assert_eq!(used(&body), 5, "{body}");
}
