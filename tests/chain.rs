//! Chains of services (`src/chain/`, `src/read/propagate.rs`): what an
//! engine sends a service on the engine (`Fanout-Budget`), what it believes
//! of its answer (`Fanout-Spent`), and what it does with a caller's header.
//!
//! The caller is an engine over real HTTP to a loopback stand-in service
//! that records each request's `Fanout-Budget` and reports what it is told
//! to; the callee is the tests' app with a caller's header on its request.
//!
//! Its own test binary: the Prometheus recorder is process-wide.

mod common;

use async_graphql::{Context, EmptyMutation, EmptySubscription, Object, Schema};
use axum::Router;
use common::stand_in::*;
use common::*;
use fanout_budget::{Config, Engine, FanoutContext, FanoutExtension, FanoutGraphQL, Read};
use proptest::prelude::*;
use serde_json::{json, Value};
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

// ---- the caller: an engine whose resolver calls the stand-in ----

struct Target(String);
struct Caller;

#[Object]
impl Caller {
    /// `n` POSTs to `path` of the target at once (row `i`'s body is `i`):
    /// each its answer, or null.
    async fn call(&self, ctx: &Context<'_>, n: u64, path: String) -> Vec<Option<String>> {
        let base = &ctx.data_unchecked::<Target>().0;
        let upstream = ctx.upstream().unwrap();
        let rows = (0..n).map(|i| {
            let url = format!("http://{base}{path}").parse().unwrap();
            async move {
                let read = Read::new(http::Method::POST, url).body(i.to_string());
                let answer = upstream.read(read).await.ok()?;
                Some(String::from_utf8_lossy(&answer.body).into_owned())
            }
        });
        futures::future::join_all(rows).await
    }
}

/// The caller's app, on `config` (TOML), reading the stand-in at `host`.
fn caller(config: &str, host: &str) -> Router {
    let config = Config::from_toml(config).unwrap();
    let engine = Engine::new(config);
    let schema = Schema::build(Caller, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .data(Target(host.to_string()))
        .finish();
    Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine))
}

/// A caller of `max_reads` whose reads to `host` propagate (`[hosts]`).
fn marked(host: &str, max_reads: u64) -> Router {
    let config =
        format!("[budget]\nmax_reads = {max_reads}\n[hosts.\"{host}\"]\npropagate = true\n");
    caller(&config, host)
}

async fn call(app: &Router, n: u64, path: &str) -> Value {
    let query = format!("{{ call(n: {n}, path: \"{path}\") }}");
    let (status, body) = post(app, json!({ "query": query }).to_string()).await;
    assert_eq!(status, 200, "{body}");
    body
}

fn used(body: &Value) -> u64 {
    body["extensions"]["fanout"]["used"].as_u64().unwrap()
}

#[tokio::test]
async fn a_read_alone_is_given_all_that_is_left_and_charged_what_was_spent() {
    let running = stand_in().await;
    let service = &running.service;
    service.reset(vec![Report::Reads(2)]);
    let app = marked(&running.host, 20);
    let body = call(&app, 1, "/call").await;
    assert_eq!(body["data"]["call"][0], "row 0", "{body}");
    let budgets = service.budgets();
    let sent = budgets[0]
        .as_deref()
        .expect("a marked host gets the header");
    // The read itself is charged first: 19 of 20 left, all for it.
    assert_eq!(member(sent, "reads"), Some(19), "{sent}");
    assert_eq!(member(sent, "hops"), Some(1), "{sent}");
    // Cut at min(read_timeout 5 s, deadline 30 s).
    let deadline = member(sent, "deadline-ms").unwrap();
    assert!((4000..=5000).contains(&deadline), "{sent}");
    // The read, and the 2 reads the service said it spent.
    assert_eq!(used(&body), 3, "{body}");
}

#[tokio::test]
async fn reads_sent_together_split_what_is_left_evenly() {
    let running = stand_in().await;
    let service = &running.service;
    service.reset(Vec::new()); // each reports all it was given
    let app = marked(&running.host, 20);
    let body = call(&app, 4, "/call").await;
    let grants: Vec<u64> = (service.budgets().iter())
        .map(|b| member(b.as_deref().unwrap(), "reads").unwrap())
        .collect();
    // 4 reads charged, 16 left, asked for by 4 at once: 4 each.
    assert_eq!(grants, [4, 4, 4, 4], "{body}");
    assert_eq!(used(&body), 20, "{body}");
}

/// Held by the tests that report reads spent beyond a grant: the counter
/// of them is the process's, so one test's reports must not land in
/// another's count.
static SPENT_BEYOND: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn an_answer_without_fanout_spent_gives_the_grant_back_and_more_than_given_is_not_believed() {
    let _counted = SPENT_BEYOND.lock().await;
    recorder();
    let running = stand_in().await;
    let service = &running.service;
    service.reset(vec![Report::Nothing]);
    let app = marked(&running.host, 20);
    assert_eq!(used(&call(&app, 1, "/call").await), 1);
    // Reported past its grant of 19: believed up to 19, the rest counted.
    let before = counted("fanout_spent_beyond_grant_reads_total", &[]);
    service.reset(vec![Report::Reads(1000)]);
    assert_eq!(used(&call(&app, 1, "/call").await), 20);
    let after = counted("fanout_spent_beyond_grant_reads_total", &[]);
    assert_eq!(after - before, 981.0);
}

#[tokio::test]
async fn a_read_with_no_answer_keeps_its_whole_grant() {
    let running = stand_in().await;
    running.service.hang.store(true, SeqCst);
    let config = format!(
        "[budget]\nmax_reads = 20\nread_timeout_ms = 200\n[hosts.\"{}\"]\npropagate = true\n",
        running.host
    );
    let app = caller(&config, &running.host);
    let body = call(&app, 1, "/call").await;
    assert!(body["data"]["call"][0].is_null(), "{body}");
    // The service may have spent all of it: all of it stays charged.
    assert_eq!(used(&body), 20, "{body}");
}

#[tokio::test]
async fn a_host_not_marked_and_a_redirect_off_a_marked_host_receive_nothing() {
    let marked_service = stand_in().await;
    let other = stand_in().await;
    *marked_service.service.elsewhere.lock().unwrap() = format!("http://{}/call", other.host);
    // Not marked at all.
    let app = caller("[budget]\nmax_reads = 20\n", &other.host);
    call(&app, 1, "/call").await;
    assert_eq!(other.service.budgets(), [None]);
    // Marked, redirecting to a host that is not.
    other.service.reset(Vec::new());
    // The 302 reports nothing spent, so its grant comes back for the hop.
    marked_service.service.reports(Report::Nothing);
    let app = marked(&marked_service.host, 20);
    let body = call(&app, 1, "/redirect").await;
    assert_eq!(body["data"]["call"][0], "row 0", "{body}");
    assert!(marked_service.service.budgets()[0].is_some());
    assert_eq!(
        other.service.budgets(),
        [None],
        "the redirect's target is a third party"
    );
}

#[tokio::test]
async fn an_upstream_marked_by_its_upstreams_table_gets_the_header() {
    let running = stand_in().await;
    let config = format!(
        "[budget]\nmax_reads = 9\n[upstreams.next]\nurl = \"http://{}\"\npropagate = true\n",
        running.host
    );
    let app = caller(&config, &running.host);
    call(&app, 1, "/call").await;
    let budgets = running.service.budgets();
    assert_eq!(member(budgets[0].as_deref().unwrap(), "reads"), Some(8));
}

#[tokio::test]
async fn measure_mode_sends_no_reads_and_charges_what_is_reported() {
    let running = stand_in().await;
    running.service.reset(vec![Report::Reads(10)]);
    let config = format!(
        "[budget]\nmax_reads = 5\nmode = \"measure\"\n[hosts.\"{}\"]\npropagate = true\n",
        running.host
    );
    let app = caller(&config, &running.host);
    let body = call(&app, 1, "/call").await;
    let budgets = running.service.budgets();
    let sent = budgets[0].as_deref().unwrap();
    assert_eq!(member(sent, "reads"), None, "{sent}");
    assert_eq!(member(sent, "hops"), Some(1), "{sent}");
    // The read and the 10 reported; 6 of them past the limit of 5.
    assert_eq!(used(&body), 11, "{body}");
    assert_eq!(body["extensions"]["fanout"]["wouldRefuse"], 6, "{body}");
}

// ---- grants of reads in flight together ----

/// `n` reads at once from a caller of `max_reads` (at most `concurrent` in
/// flight), each row reported as `reports` says: the stand-in holds every
/// answer until all the reads that could be charged have arrived, so their
/// grants are all out at once.
async fn together(running: &Running, max_reads: u64, n: u64, reports: Vec<Report>) {
    let service = running.service.clone();
    service.reset(reports.clone());
    service.held.store(true, SeqCst);
    let config = format!(
        "[budget]\nmax_reads = {max_reads}\nmax_concurrent_reads = 8\n[hosts.\"{}\"]\npropagate = true\n",
        running.host
    );
    let app = caller(&config, &running.host);
    let asked = tokio::spawn(async move { call(&app, n, "/call").await });
    // Each read is charged before any asks for a grant: `min(n, max_reads)` arrive.
    let expected = n.min(max_reads).min(8) as usize;
    fanout_testkit::until("the reads in flight", Duration::from_secs(10), async || {
        service.arrived() == expected
    })
    .await;
    let grants: Vec<u64> = (service.budgets().iter())
        .map(|b| member(b.as_deref().unwrap(), "reads").unwrap())
        .collect();
    let out: u64 = grants.iter().sum();
    assert!(
        out + expected as u64 <= max_reads,
        "grants {grants:?} and {expected} reads past {max_reads}"
    );
    service.release();
    let body = asked.await.unwrap();
    // What was charged: every read sent, and what each reported of its grant.
    let reports = service.rows.lock().unwrap().clone();
    let charged: u64 = (service.seen.lock().unwrap().iter())
        .map(|seen| {
            let granted = member(seen.budget.as_deref().unwrap(), "reads").unwrap();
            let Report::Reads(spent) = reports[seen.row] else {
                unreachable!("every row reports a number")
            };
            1 + spent.min(granted)
        })
        .sum();
    assert_eq!(used(&body), charged, "{body}");
    assert!(used(&body) <= max_reads, "{body}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn reads_in_flight_together_never_give_more_than_was_left(
        max_reads in 1u64..60,
        n in 1u64..=8,
        spent in proptest::collection::vec(0u64..40, 8),
    ) {
        let _counted = SPENT_BEYOND.blocking_lock();
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let running = stand_in().await;
            let reports = spent.iter().map(|s| Report::Reads(*s)).collect();
            together(&running, max_reads, n, reports).await;
        });
    }
}

// ---- the callee: a caller's header on an inbound request ----

async fn callee(max_reads: u64, max_hops: u32) -> (Router, Upstream) {
    let upstream = Upstream::start().await;
    let mut config = Config::default();
    config.budget.max_reads = max_reads;
    config.budget.max_hops = max_hops;
    (app(&Engine::new(config), &upstream), upstream)
}

const ITEMS: &str = r#"{"query":"{ items { detail { value } } budget }"}"#;

#[tokio::test]
async fn a_callers_header_lowers_the_limits_and_is_answered_with_what_was_spent() {
    let (app, upstream) = callee(5, 8).await;
    let answer = fanout_testkit::post(&app, ITEMS, &[("fanout-budget", "reads=3, hops=1")]).await;
    let body = answer.json();
    assert_eq!(body["extensions"]["fanout"]["limit"], 3, "{body}");
    assert_eq!(upstream.requests(), 3);
    assert!(
        codes(&body).iter().any(|c| c == "FANOUT_BUDGET_EXHAUSTED"),
        "{body}"
    );
    assert_eq!(answer.headers["fanout-spent"], "reads=3");
    // One that would raise the limit is believed only as far as it lowers.
    let answer = fanout_testkit::post(&app, ITEMS, &[("fanout-budget", "reads=500")]).await;
    assert_eq!(answer.json()["extensions"]["fanout"]["limit"], 5);
    assert_eq!(answer.headers["fanout-spent"], "reads=5");
    // Without the header: no `Fanout-Spent`.
    let answer = fanout_testkit::post(&app, ITEMS, &[]).await;
    assert!(answer.headers.get("fanout-spent").is_none());
}

#[tokio::test]
async fn a_callers_deadline_cuts_the_reads() {
    let (app, upstream) = callee(100, 8).await;
    *upstream.seen.default_delay.lock().unwrap() = Some(Duration::from_secs(20));
    let started = Instant::now();
    let answer = fanout_testkit::post(&app, ITEMS, &[("fanout-budget", "deadline-ms=300")]).await;
    let took = started.elapsed();
    let body = answer.json();
    // Its own deadline is 30 s and its read timeout 5 s: the caller's 300 ms cut it.
    assert!(took < Duration::from_secs(4), "{took:?}");
    assert!(
        codes(&body).iter().any(|c| c == "DEADLINE_EXCEEDED"),
        "{body}"
    );
}

#[tokio::test]
async fn past_max_hops_a_request_is_refused_before_any_read() {
    let (app, upstream) = callee(100, 3).await;
    let answer = fanout_testkit::post(&app, ITEMS, &[("fanout-budget", "reads=50, hops=4")]).await;
    let body = answer.json();
    assert_eq!(answer.status, 200);
    assert!(body["data"].is_null(), "{body}");
    let error = &body["errors"][0]["extensions"];
    assert_eq!(error["code"], "FANOUT_TOO_MANY_HOPS", "{body}");
    assert_eq!(
        (error["hops"].as_u64(), error["max"].as_u64()),
        (Some(4), Some(3))
    );
    assert_eq!(upstream.requests(), 0, "refused before any read");
    assert_eq!(answer.headers["fanout-spent"], "reads=0");
    // At the limit it runs.
    let answer = fanout_testkit::post(&app, ITEMS, &[("fanout-budget", "hops=3")]).await;
    assert!(codes(&answer.json()).is_empty(), "{}", answer.json());
}

#[tokio::test]
async fn malformed_members_are_ignored_and_counted_the_others_apply() {
    recorder();
    let (app, upstream) = callee(100, 8).await;
    let ignored = |member: &str| {
        counted(
            "fanout_budget_header_ignored_total",
            &[&format!("member=\"{member}\"")],
        )
    };
    let (reads, hops) = (ignored("reads"), ignored("hops"));
    let header = ("fanout-budget", "reads=-4, hops=abc, deadline-ms=20000");
    let answer = fanout_testkit::post(&app, ITEMS, &[header]).await;
    let body = answer.json();
    assert_eq!(answer.status, 200);
    assert_eq!(body["extensions"]["fanout"]["limit"], 100, "{body}");
    assert!(codes(&body).is_empty(), "{body}");
    assert_eq!(upstream.requests(), 11);
    assert_eq!(ignored("reads") - reads, 1.0);
    assert_eq!(ignored("hops") - hops, 1.0);
    // Not a dictionary at all: every member ignored, the request answered.
    let unparsable = ignored("unparsable");
    let answer = fanout_testkit::post(&app, ITEMS, &[("fanout-budget", "((")]).await;
    assert_eq!(answer.json()["extensions"]["fanout"]["limit"], 100);
    assert_eq!(ignored("unparsable") - unparsable, 1.0);
}
