//! The read quota per client (`[quota]`, `src/inbound/quota.rs`), through
//! `FanoutGraphQL` in process on paused time, against a model of the
//! quota's arithmetic (`Rate`): every request's answer — admitted with the
//! budget it reserved, or 429 `QUOTA_EXHAUSTED` with what is left and when
//! it fits — is the model's, over 30 s of a client whose requests spend
//! varying reads; the estimate is reserved when a cost table prices the
//! request, else the budget, and what is not spent comes back; a request
//! larger than the burst runs on the burst (or, with
//! `refuse_over_estimate`, is refused having reserved nothing); the
//! internal token's class is apart; a cancelled request settles, and a
//! client that aborts its requests gains nothing.
use async_graphql::{Context, EmptyMutation, EmptySubscription, Object, Schema};
use fanout_budget::config::QuotaConfig;
use fanout_budget::cost::{CostTable, FieldCost};
use fanout_budget::inbound::quota::Rate;
use fanout_budget::{Config, Engine, FanoutContext, FanoutExtension, FanoutGraphQL, Read};
use fanout_testkit::{call, graphql_request, Answer, MemTransport};
use serde_json::json;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

struct Query;

#[Object]
impl Query {
    /// `n` items, each of whose `ok` makes a read of its own (the one
    /// numbered `hang` never answers).
    async fn spend(&self, n: u64, tag: String, hang: Option<u64>) -> Vec<Item> {
        (0..n)
            .map(|i| Item {
                url: format!(
                    "http://up.test/{tag}/{i}/{}",
                    if hang == Some(i) { "hang" } else { "ok" }
                ),
            })
            .collect()
    }

    /// Waits `ms` (the request runs that long; unpriced).
    async fn nap(&self, ms: u64) -> bool {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        true
    }
}

struct Item {
    url: String,
}

#[Object]
impl Item {
    /// One read.
    async fn ok(&self, ctx: &Context<'_>) -> async_graphql::Result<bool> {
        ctx.upstream()?.read(Read::get(self.url.parse()?)).await?;
        Ok(true)
    }

    /// Waits `ms`, then one read (unpriced: the estimate does not see it).
    async fn nap_then_ok(&self, ctx: &Context<'_>, ms: u64) -> async_graphql::Result<bool> {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        self.ok(ctx).await
    }

    /// Two reads, priced as one (as a token fetch and its retry are, or a
    /// redirect's hop: sent, charged, not in the estimate).
    async fn twice(&self, ctx: &Context<'_>) -> async_graphql::Result<bool> {
        ctx.upstream()?.read(Read::get(self.url.parse()?)).await?;
        let again = format!("{}/again/ok", self.url.trim_end_matches("/ok"));
        ctx.upstream()?.read(Read::get(again.parse()?)).await?;
        Ok(true)
    }
}

const TOKEN: &str = "internal-secret";

struct App {
    router: axum::Router,
    transport: Arc<MemTransport>,
}

/// `reads` a minute (one read's share: `60 s / reads`), `burst`, budgets
/// of `max_reads`; `spend` priced at `n` reads when `costs`.
fn new_app(quota: QuotaConfig, max_reads: u64, costs: bool, refuse_over: bool) -> App {
    app_with(quota, max_reads, costs, refuse_over, false)
}

/// The same app, served by async-graphql-axum's stock `GraphQL` under
/// `FanoutLayer` when `layer`.
fn app_with(
    quota: QuotaConfig,
    max_reads: u64,
    costs: bool,
    refuse_over: bool,
    layer: bool,
) -> App {
    let mut config = Config::default();
    config.quota = quota;
    config.budget.max_reads = max_reads;
    config.budget.refuse_over_estimate = refuse_over;
    config.rate_limit.internal_token = TOKEN.into();
    let transport = Arc::new(MemTransport::new().scripted());
    let mut engine = Engine::builder(config).transport(transport.clone());
    if costs {
        let costs = CostTable::new()
            .field("Query", "spend", FieldCost::reads(0).times_arg("n"))
            .field("Item", "ok", FieldCost::reads(1))
            .field("Item", "twice", FieldCost::reads(1));
        engine = engine.costs(costs);
    }
    let engine = engine.build();
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .finish();
    let router = if layer {
        axum::Router::new()
            .route_service("/graphql", async_graphql_axum::GraphQL::new(schema))
            .layer(fanout_budget::FanoutLayer::new(engine))
    } else {
        axum::Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine))
    };
    App { router, transport }
}

fn per_minute(reads: u64, burst: u64) -> QuotaConfig {
    QuotaConfig::default()
        .reads(reads)
        .period_secs(60)
        .burst(burst)
}

const CLIENT: &str = "192.0.2.7:40000";

async fn spend(app: &App, n: u64, tag: &str, internal: bool) -> Answer {
    let body =
        json!({ "query": format!("{{ spend(n: {n}, tag: \"{tag}\") {{ ok }} }}") }).to_string();
    let token = [("x-internal-token", TOKEN)];
    let headers: &[(&str, &str)] = if internal { &token } else { &[] };
    let peer: SocketAddr = CLIENT.parse().unwrap();
    call(&app.router, graphql_request(body, headers, Some(peer))).await
}

/// `body` (a request or a batch) from the client.
async fn post(app: &App, body: &serde_json::Value) -> Answer {
    let peer: SocketAddr = CLIENT.parse().unwrap();
    call(
        &app.router,
        graphql_request(body.to_string(), &[], Some(peer)),
    )
    .await
}

/// The quota as the model keeps it: the instant (ns since the engine was
/// made) the client's bucket is full again.
struct Model {
    rate: Rate,
    full_at: u64,
    started: Instant,
}

impl Model {
    fn now(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }
}

/// A client sends a request every 250 ms for 30 s, each spending 0 to 5
/// reads, reserving its estimate (`costs`) or its budget of 5: each answer
/// is the model's, and the reads sent are within burst + 30 s of refill.
async fn thirty_seconds(costs: bool) {
    let (reads, burst, max_reads) = (60, 10, 5);
    let app = new_app(per_minute(reads, burst), max_reads, costs, false);
    let mut model = Model {
        rate: Rate::new(reads, Duration::from_secs(60), burst),
        full_at: 0,
        started: Instant::now(),
    };
    let (mut admitted, mut refused, mut spent) = (0, 0, 0);
    for step in 0..120u64 {
        let n = (step * 7 + step / 3) % 6;
        let reserve = if costs { n } else { max_reads };
        let now = model.now();
        let answer = spend(&app, n, &format!("s{step}"), false).await;
        let body = answer.json();
        match model.rate.take(model.full_at, now, reserve) {
            Ok(after) => {
                admitted += 1;
                let spends = n.min(reserve);
                model.full_at = model.rate.give_back(after, now, reserve - spends);
                assert_eq!(answer.status, 200, "step {step}: {body}");
                assert_eq!(
                    body["data"]["spend"],
                    json!(vec![json!({"ok": true}); n as usize]),
                    "step {step}: {body}"
                );
                let fanout = &body["extensions"]["fanout"];
                assert_eq!(
                    fanout["limit"],
                    json!(reserve),
                    "the budget is the reservation"
                );
                assert_eq!(fanout["used"], json!(n));
                let left = model.rate.left(model.full_at, now);
                assert_eq!(fanout["quota"]["limit"], json!(burst));
                assert_eq!(
                    fanout["quota"]["remaining"],
                    json!(left),
                    "step {step}: {body}"
                );
                spent += n;
            }
            Err(wait_ns) => {
                refused += 1;
                assert_eq!(answer.status, 429, "step {step}: {body}");
                let ext = &body["errors"][0]["extensions"];
                assert_eq!(ext["code"], "QUOTA_EXHAUSTED");
                assert_eq!(ext["limit"], json!(burst));
                assert_eq!(ext["remaining"], json!(model.rate.left(model.full_at, now)));
                assert_eq!(ext["retryAfterMs"], json!(wait_ns.div_ceil(1_000_000)));
                let secs = wait_ns.div_ceil(1_000_000_000).max(1).to_string();
                assert_eq!(answer.headers["retry-after"], secs.as_str());
                assert_eq!(answer.headers["ratelimit-policy"], "\"reads\";q=10;w=10");
                let left = model.rate.left(model.full_at, now);
                let field = format!("\"reads\";r={left};t={secs}");
                assert_eq!(answer.headers["ratelimit"], field.as_str());
            }
        }
        tokio::time::advance(Duration::from_millis(250)).await;
    }
    let sent = app.transport.sent().len() as u64;
    assert_eq!(sent, spent, "every read sent was reserved and counted");
    assert!(
        sent <= burst + 30,
        "{sent} reads in 30 s past burst {burst} + 30 refilled"
    );
    assert!(
        refused > 0 && admitted > 0,
        "{admitted} admitted, {refused} refused"
    );
    println!("costs {costs}: {admitted} admitted, {refused} refused, {sent} reads sent in 30 s");
}

#[tokio::test(start_paused = true)]
async fn over_thirty_seconds_the_estimate_is_reserved_and_each_answer_is_the_models() {
    thirty_seconds(true).await;
}

#[tokio::test(start_paused = true)]
async fn over_thirty_seconds_the_budget_is_reserved_and_what_is_not_spent_comes_back() {
    thirty_seconds(false).await;
}

#[tokio::test(start_paused = true)]
async fn a_request_larger_than_the_burst_runs_on_the_burst() {
    let app = new_app(per_minute(60, 10), 100, true, false);
    let answer = spend(&app, 15, "big", false).await;
    let body = answer.json();
    assert_eq!(answer.status, 200, "{body}");
    let errors = body["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 5, "{body}");
    assert!(errors
        .iter()
        .all(|e| e["extensions"]["code"] == "FANOUT_BUDGET_EXHAUSTED"));
    assert_eq!(body["extensions"]["fanout"]["limit"], 10, "{body}");
    assert_eq!(body["extensions"]["fanout"]["quota"]["remaining"], 0);
    assert_eq!(app.transport.sent().len(), 10);
}

#[tokio::test(start_paused = true)]
async fn with_refuse_over_estimate_a_request_larger_than_the_burst_reserves_nothing() {
    let app = new_app(per_minute(60, 10), 100, true, true);
    let answer = spend(&app, 15, "big", false).await;
    let body = answer.json();
    let error = &body["errors"][0]["extensions"];
    assert_eq!(error["code"], "FANOUT_ESTIMATE_EXCEEDS_BUDGET", "{body}");
    assert_eq!(
        (error["requested"].clone(), error["limit"].clone()),
        (json!(15), json!(10))
    );
    assert_eq!(app.transport.sent().len(), 0);
    // The whole burst is still there.
    let answer = spend(&app, 10, "fits", false).await;
    assert_eq!(answer.status, 200, "{}", answer.json());
    assert_eq!(
        answer.json()["extensions"]["fanout"]["quota"]["remaining"],
        0
    );
}

/// A batch whose operations' estimates add past `u64::MAX` (one priced at
/// nearly that, skipped): the sum saturates, it is refused whole having
/// reserved and read nothing, under both integrations — it did not wrap to
/// a small reservation the extension path then grows to the whole burst.
#[tokio::test(start_paused = true)]
async fn estimates_that_add_past_the_largest_number_are_refused_whole() {
    for layer in [false, true] {
        let app = app_with(per_minute(60, 10), 100, true, true, layer);
        let batch = json!([
            { "query": "{ spend(n: 18446744073709551601, tag: \"x\") @skip(if: true) { ok } }" },
            { "query": "{ spend(n: 15, tag: \"y\") { ok } }" },
        ]);
        let answer = post(&app, &batch).await;
        let body = answer.json();
        assert_eq!(app.transport.sent().len(), 0, "layer {layer}: {body}");
        // The first fails validation (`n` is no `Int`) but was priced.
        for op in body.as_array().expect("a batch answer") {
            assert_eq!(op["data"], json!(null), "layer {layer}: {body}");
        }
        assert_eq!(
            body[1]["errors"][0]["extensions"]["code"], "FANOUT_ESTIMATE_EXCEEDS_BUDGET",
            "layer {layer}: {body}"
        );
        // Nothing was reserved: the whole burst is still there.
        let answer = spend(&app, 10, "fits", false).await;
        assert_eq!(answer.status, 200, "layer {layer}: {}", answer.json());
    }
}

/// A request that runs 5 s at a read a second: the quota it shows counts
/// what refilled meanwhile, as the next request finds it.
#[tokio::test(start_paused = true)]
async fn the_quota_shown_counts_what_refilled_while_the_request_ran() {
    let app = new_app(per_minute(60, 10), 100, true, false);
    let query = json!({ "query": "{ spend(n: 5, tag: \"r\") { ok } nap(ms: 5000) }" });
    let answer = post(&app, &query).await;
    let body = answer.json();
    assert_eq!(answer.status, 200, "{body}");
    assert_eq!(app.transport.sent().len(), 5);
    // 5 spent at the start, 5 refilled since: full again.
    assert_eq!(
        body["extensions"]["fanout"]["quota"]["remaining"], 10,
        "{body}"
    );
    let answer = spend(&app, 10, "next", false).await;
    assert_eq!(answer.status, 200, "{}", answer.json());
}

/// A request larger than the burst runs on the burst, however long it
/// runs: reads past it find none, though the quota refilled meanwhile.
#[tokio::test(start_paused = true)]
async fn a_request_never_spends_more_than_the_burst() {
    let app = new_app(per_minute(60, 10), 100, true, false);
    // Priced at 11 (the late reads are not priced): it reserves the burst.
    let query = json!({ "query": "{ spend(n: 11, tag: \"b\") { ok } late: spend(n: 5, tag: \"l\") { napThenOk(ms: 5000) } }" });
    let answer = post(&app, &query).await;
    let body = answer.json();
    assert_eq!(answer.status, 200, "{body}");
    assert_eq!(app.transport.sent().len(), 10, "{body}");
    let errors = body["errors"].as_array().expect("reads past the burst");
    assert_eq!(errors.len(), 6, "{body}");
    assert!(
        errors
            .iter()
            .all(|e| e["extensions"]["code"] == "FANOUT_BUDGET_EXHAUSTED"),
        "{body}"
    );
    assert_eq!(body["extensions"]["fanout"]["limit"], 10, "{body}");
}

#[tokio::test(start_paused = true)]
async fn the_internal_class_is_apart() {
    // Internal callers without a quota of their own: never refused, and
    // their reads are not the public client's.
    let app = new_app(per_minute(60, 10), 10, true, false);
    for i in 0..20 {
        let answer = spend(&app, 10, &format!("i{i}"), true).await;
        assert_eq!(answer.status, 200, "{}", answer.json());
        assert!(answer.json()["extensions"]["fanout"].get("quota").is_none());
    }
    let answer = spend(&app, 10, "public", false).await;
    assert_eq!(answer.status, 200, "{}", answer.json());
    assert_eq!(spend(&app, 1, "public2", false).await.status, 429);
    // With `internal_reads`: a quota of their own, its burst a period's.
    let both = new_app(per_minute(60, 10).internal_reads(30), 1000, true, false);
    assert_eq!(spend(&both, 10, "public", false).await.status, 200);
    assert_eq!(spend(&both, 1, "public2", false).await.status, 429);
    let answer = spend(&both, 30, "internal", true).await;
    let body = answer.json();
    assert_eq!(answer.status, 200, "{body}");
    assert_eq!(
        body["extensions"]["fanout"]["quota"],
        json!({
            "limit": 30, "remaining": 0, "resetAt": body["extensions"]["fanout"]["quota"]["resetAt"]
        })
    );
    let answer = spend(&both, 1, "internal2", true).await;
    assert_eq!(answer.status, 429);
    assert_eq!(
        answer.headers["ratelimit-policy"],
        "\"internal-reads\";q=30;w=60"
    );
}

/// Sends a request of five reads, the third of which never answers, and
/// drops it once the five are sent: five reads charged, of the eight its
/// budget reserved.
async fn abort_after_five_reads(app: &App, tag: &str) {
    let before = app.transport.sent().len();
    let body = json!({ "query": format!("{{ spend(n: 5, tag: \"{tag}\", hang: 2) {{ ok }} }}") });
    let peer: SocketAddr = CLIENT.parse().unwrap();
    let request = graphql_request(body.to_string(), &[], Some(peer));
    // On paused time the clock only moves when nothing else can: the
    // hanging read is in flight when this times out.
    let out = tokio::time::timeout(Duration::from_millis(500), call(&app.router, request)).await;
    if let Ok(answer) = out {
        panic!("the request did not hang: {}", answer.json());
    }
    assert_eq!(app.transport.sent().len() - before, 5);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_request_settles_and_aborting_gains_nothing() {
    // 60 a minute (a read a second), burst 20, budgets of 8 reserved whole.
    let app = new_app(per_minute(60, 20), 8, false, false);
    let mut model = Model {
        rate: Rate::new(60, Duration::from_secs(60), 20),
        full_at: 0,
        started: Instant::now(),
    };
    for i in 0..3 {
        let now = model.now();
        let took = model.rate.take(model.full_at, now, 8).expect("fits");
        abort_after_five_reads(&app, &format!("a{i}")).await;
        // The five reads sent are spent; the other three came back.
        model.full_at = model.rate.give_back(took, now, 3);
    }
    // 15 reads spent in 1.5 s, 1 refilled: 6 left, fewer than a budget.
    // Nothing was gained by aborting, and nothing leaked.
    let now = model.now();
    let left = model.rate.left(model.full_at, now);
    assert_eq!(left, 6);
    let answer = spend(&app, 0, "after", false).await;
    let body = answer.json();
    assert_eq!(answer.status, 429, "{body}");
    assert_eq!(
        body["errors"][0]["extensions"]["remaining"],
        json!(left),
        "{body}"
    );
    assert_eq!(app.transport.sent().len(), 15);
}

#[tokio::test(start_paused = true)]
async fn a_read_past_the_estimate_takes_one_more_from_the_quota_if_it_has_one() {
    let app = new_app(per_minute(60, 10), 100, true, false);
    let query =
        |tag: &str| json!({ "query": format!("{{ spend(n: 3, tag: \"{tag}\") {{ twice }} }}") });
    // Estimated 3, sends 6: each read past the reservation takes one more.
    let answer = post(&app, &query("t1")).await;
    let body = answer.json();
    assert_eq!(answer.status, 200, "{body}");
    assert!(body.get("errors").is_none(), "{body}");
    let fanout = &body["extensions"]["fanout"];
    assert_eq!(
        (fanout["requested"].clone(), fanout["used"].clone()),
        (json!(3), json!(6))
    );
    assert_eq!(
        fanout["limit"], 6,
        "the budget grew one read at a time: {body}"
    );
    assert_eq!(fanout["quota"]["remaining"], 4);
    // 4 left: 3 reserved, 1 more taken, then none: the last reads are refused.
    let answer = post(&app, &query("t2")).await;
    let body = answer.json();
    assert_eq!(answer.status, 200, "{body}");
    assert_eq!(body["extensions"]["fanout"]["used"], 4, "{body}");
    let codes: Vec<_> = body["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["extensions"]["code"].clone())
        .collect();
    assert!(!codes.is_empty(), "{body}");
    assert!(
        codes.iter().all(|c| *c == "FANOUT_BUDGET_EXHAUSTED"),
        "{body}"
    );
    assert_eq!(
        app.transport.sent().len(),
        10,
        "never a read past the quota"
    );
}

/// A batch of two operations of 4 reads each, twice from one client with a
/// burst of 10, served by `FanoutGraphQL` or (`layer`) under `FanoutLayer`:
/// one reservation of 8, then the whole batch refused.
async fn a_batch_reserves_once(layer: bool) {
    let app = app_with(per_minute(60, 10), 100, true, false, layer);
    let peer: SocketAddr = CLIENT.parse().unwrap();
    let batch = json!([
        { "query": "{ spend(n: 4, tag: \"b1\") { ok } }" },
        { "query": "{ spend(n: 4, tag: \"b2\") { ok } }" },
    ]);
    let send = || {
        call(
            &app.router,
            graphql_request(batch.to_string(), &[], Some(peer)),
        )
    };
    let answer = send().await;
    let body = answer.json();
    assert_eq!(answer.status, 200, "{body}");
    let mut lefts = Vec::new();
    for op in body.as_array().unwrap() {
        let fanout = &op["extensions"]["fanout"];
        assert_eq!(fanout["limit"], 8, "one reservation of 4 + 4: {body}");
        lefts.push(fanout["quota"]["remaining"].as_u64().unwrap());
    }
    // Each operation shows the quota as it stands when it finished, what
    // the batch has not spent yet counted as given back: the last, 10 − 8.
    lefts.sort_unstable();
    assert_eq!(lefts[0], 2, "{body}");
    let answer = send().await;
    let body = answer.json();
    assert_eq!(answer.status, 429, "{body}");
    assert_eq!(body["errors"][0]["extensions"]["code"], "QUOTA_EXHAUSTED");
    assert_eq!(answer.headers["ratelimit-policy"], "\"reads\";q=10;w=10");
    let sent = app.transport.sent().len();
    assert_eq!(sent, 8, "nothing of the refused batch ran");
}

#[tokio::test(start_paused = true)]
async fn a_batch_reserves_once_and_is_refused_whole() {
    a_batch_reserves_once(false).await;
}

#[tokio::test(start_paused = true)]
async fn under_fanout_layer_the_batch_reserves_once_and_is_refused_whole() {
    a_batch_reserves_once(true).await;
}

#[tokio::test(start_paused = true)]
async fn without_the_tcp_peer_a_quota_cannot_key_its_client() {
    let app = new_app(per_minute(60, 10), 10, false, false);
    let body = json!({ "query": "{ spend(n: 1, tag: \"x\") { ok } }" }).to_string();
    let answer = call(&app.router, graphql_request(body, &[], None)).await;
    assert_eq!(answer.status, 500, "{}", answer.json());
    assert_eq!(app.transport.sent().len(), 0);
}

#[test]
fn the_quota_reads_its_config_and_rejects_impossible_values() {
    let config =
        Config::from_toml("[quota]\nreads = 5000\nperiod_secs = 3600\nburst = 500\n").unwrap();
    assert_eq!(config.quota, QuotaConfig::default().reads(5000).burst(500));
    let zero = Config::from_toml("[quota]\nreads = 10\nperiod_secs = 0\n").unwrap_err();
    assert_eq!(zero.key(), Some("quota.period_secs"));
    let typo = Config::from_toml("[quota]\nread = 10\n").unwrap_err();
    assert_eq!(typo.key(), Some("quota.read"));
    assert!(!Config::default().quota.is_enabled(), "off by default");
}

#[tokio::test(start_paused = true)]
async fn a_scope_that_never_reserved_sends_no_read() {
    // An app reading through a scope of its own (`begin_request`), or a
    // handler under `FanoutLayer` reading through the scope it was handed
    // without running an operation: no reservation, so no read.
    let mut config = Config::default();
    config.quota = per_minute(60, 10);
    let transport = Arc::new(MemTransport::new());
    let engine = Engine::builder(config).transport(transport.clone()).build();
    let request = engine.begin_request(fanout_budget::inbound::Caller::Public);
    let op = request.operation();
    let read = op
        .upstream()
        .read(Read::get("http://up.test/x".parse().unwrap()))
        .await;
    let err = read.expect_err("a read without a reservation");
    assert_eq!(err.code(), "FANOUT_BUDGET_EXHAUSTED", "{err:?}");
    assert_eq!(transport.sent().len(), 0);
}

#[tokio::test(start_paused = true)]
async fn retry_after_rounds_up_so_the_retry_fits() {
    // 7 a minute: a read's share is 8571.43 ms, never whole milliseconds.
    let app = new_app(per_minute(7, 3), 100, true, false);
    assert_eq!(spend(&app, 3, "all", false).await.status, 200);
    let answer = spend(&app, 1, "one", false).await;
    assert_eq!(answer.status, 429);
    let wait = answer.json()["errors"][0]["extensions"]["retryAfterMs"]
        .as_u64()
        .unwrap();
    assert_eq!(answer.headers["ratelimit-policy"], "\"reads\";q=3;w=26");
    tokio::time::advance(Duration::from_millis(wait)).await;
    let answer = spend(&app, 1, "again", false).await;
    assert_eq!(
        answer.status,
        200,
        "retried after {wait} ms: {}",
        answer.json()
    );
}
