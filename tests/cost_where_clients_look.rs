//! Cost where clients look (`[http] cost_headers`, `cost_extension`),
//! under both integrations (`FanoutGraphQL`, and async-graphql-axum's stock
//! `GraphQL` under `FanoutLayer`), in process on paused time against an
//! in-memory upstream:
//!
//! - off by default: no `X-Cost-*` header, no `extensions.cost`;
//! - `X-Cost-Estimated` / `X-Cost-Actual` / `X-Cost-Max` on single requests
//!   and batches (the batch's sums, its one budget), on requests refused
//!   before they are read and on 429 `QUOTA_EXHAUSTED`; unpriced, the
//!   estimate is the budget;
//! - `extensions.cost` per operation, `throttleStatus` only with a read
//!   quota and equal to `extensions.fanout.quota`;
//! - a Shopify-style client that paces on `extensions.cost.throttleStatus`
//!   is never refused, where the same loop not pacing is.
use async_graphql::{Context, EmptyMutation, EmptySubscription, Object, Schema};
use fanout_budget::config::QuotaConfig;
use fanout_budget::cost::{CostTable, FieldCost};
use fanout_budget::{Config, Engine, FanoutContext, FanoutExtension, FanoutGraphQL, Read};
use fanout_testkit::{call, graphql_request, Answer, MemTransport};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

struct Query;

#[Object]
impl Query {
    /// `n` items, each of whose `ok` makes a read of its own.
    async fn spend(&self, n: u64, tag: String) -> Vec<Item> {
        (0..n)
            .map(|i| Item {
                url: format!("http://up.test/{tag}/{i}/ok"),
            })
            .collect()
    }

    /// Priced at 2 reads, sends none.
    async fn idle(&self) -> bool {
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
}

const TOKEN: &str = "internal-secret";
const CLIENT: &str = "192.0.2.7:40000";
const MAX_READS: u64 = 10;
const INTERNAL_MAX_READS: u64 = 40;

struct App {
    router: axum::Router,
    transport: Arc<MemTransport>,
}

/// An app on `config` (budgets of [`MAX_READS`] and [`INTERNAL_MAX_READS`]),
/// priced when `costs`, served by async-graphql-axum under `FanoutLayer`
/// when `layer`, else by `FanoutGraphQL`.
fn app(mut config: Config, costs: bool, layer: bool) -> App {
    config.budget.max_reads = MAX_READS;
    config.budget.internal_max_reads = INTERNAL_MAX_READS;
    config.rate_limit.internal_token = TOKEN.into();
    let transport = Arc::new(MemTransport::new().scripted());
    let mut engine = Engine::builder(config).transport(transport.clone());
    if costs {
        let costs = CostTable::new()
            .field("Query", "spend", FieldCost::reads(0).times_arg("n"))
            .field("Query", "idle", FieldCost::reads(2))
            .field("Item", "ok", FieldCost::reads(1));
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

fn spend(n: u64, tag: &str) -> Value {
    json!({ "query": format!("{{ spend(n: {n}, tag: \"{tag}\") {{ ok }} }}") })
}

async fn post(app: &App, body: &Value, headers: &[(&str, &str)]) -> Answer {
    let peer: SocketAddr = CLIENT.parse().unwrap();
    let request = graphql_request(body.to_string(), headers, Some(peer));
    call(&app.router, request).await
}

/// The three cost headers, as numbers (`None`: absent).
fn cost_headers(answer: &Answer) -> [Option<u64>; 3] {
    ["x-cost-estimated", "x-cost-actual", "x-cost-max"].map(|name| {
        let value = answer.headers.get(name)?;
        Some(value.to_str().unwrap().parse().unwrap())
    })
}

fn with_headers(extension: bool) -> Config {
    let mut config = Config::default();
    config.http.cost_headers = true;
    config.http.cost_extension = extension;
    config
}

const BOTH: [(bool, &str); 2] = [(false, "FanoutGraphQL"), (true, "FanoutLayer")];

#[tokio::test(start_paused = true)]
async fn off_by_default_nothing_is_added() {
    for (layer, name) in BOTH {
        let app = app(Config::default(), true, layer);
        let answer = post(&app, &spend(3, "a"), &[]).await;
        let body = answer.json();
        assert_eq!(answer.status, 200, "{name}: {body}");
        assert_eq!(body["extensions"]["fanout"]["used"], 3, "{name}: {body}");
        assert_eq!(cost_headers(&answer), [None; 3], "{name}");
        assert!(body["extensions"].get("cost").is_none(), "{name}: {body}");
        // One key without the other.
        let app = self::app(with_headers(false), true, layer);
        let answer = post(&app, &spend(3, "b"), &[]).await;
        assert_eq!(cost_headers(&answer), [Some(3), Some(3), Some(MAX_READS)]);
        assert!(answer.json()["extensions"].get("cost").is_none(), "{name}");
        let mut config = Config::default();
        config.http.cost_extension = true;
        let app = self::app(config, true, layer);
        let answer = post(&app, &spend(3, "c"), &[]).await;
        assert_eq!(cost_headers(&answer), [None; 3], "{name}");
        let cost = &answer.json()["extensions"]["cost"];
        assert_eq!(cost["actualQueryCost"], 3, "{name}: {cost}");
    }
}

#[tokio::test(start_paused = true)]
async fn single_requests_and_batches_report_the_request() {
    for (layer, name) in BOTH {
        let app = app(with_headers(true), true, layer);
        // Priced 2, sends nothing: estimated and actual differ.
        let answer = post(&app, &json!({ "query": "{ idle }" }), &[]).await;
        let body = answer.json();
        assert_eq!(body["data"]["idle"], true, "{name}: {body}");
        assert_eq!(cost_headers(&answer), [Some(2), Some(0), Some(MAX_READS)]);
        let cost = &body["extensions"]["cost"];
        assert_eq!(
            *cost,
            json!({ "requestedQueryCost": 2, "actualQueryCost": 0 }),
            "{name}: no quota, no throttleStatus"
        );
        // A batch shares one budget: the sums over its operations, one max.
        let batch = json!([spend(2, "x"), spend(3, "y"), { "query": "{ idle }" }]);
        let answer = post(&app, &batch, &[]).await;
        let body = answer.json();
        assert_eq!(answer.status, 200, "{name}: {body}");
        assert_eq!(
            cost_headers(&answer),
            [Some(7), Some(5), Some(MAX_READS)],
            "{name}"
        );
        let costs: Vec<_> = (0..3)
            .map(|i| body[i]["extensions"]["cost"].clone())
            .collect();
        assert_eq!(
            costs,
            [
                json!({ "requestedQueryCost": 2, "actualQueryCost": 2 }),
                json!({ "requestedQueryCost": 3, "actualQueryCost": 3 }),
                json!({ "requestedQueryCost": 2, "actualQueryCost": 0 }),
            ],
            "{name}: {body}"
        );
        for (i, cost) in costs.iter().enumerate() {
            let fanout = &body[i]["extensions"]["fanout"];
            assert_eq!(cost["requestedQueryCost"], fanout["requested"], "{name}");
            assert_eq!(cost["actualQueryCost"], fanout["operationReads"], "{name}");
        }
        assert_eq!(
            app.transport.sent().len(),
            5,
            "{name}: X-Cost-Actual is what was sent"
        );
        // Over the budget: the reads sent stop at it, the estimate does not.
        let answer = post(&app, &spend(12, "z"), &[]).await;
        assert_eq!(
            cost_headers(&answer),
            [Some(12), Some(MAX_READS), Some(MAX_READS)]
        );
        // The internal token's budget.
        let token = [("x-internal-token", TOKEN)];
        let answer = post(&app, &spend(12, "t"), &token).await;
        assert_eq!(
            cost_headers(&answer),
            [Some(12), Some(12), Some(INTERNAL_MAX_READS)],
            "{name}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn unpriced_the_estimate_is_the_budget() {
    for (layer, name) in BOTH {
        let app = app(with_headers(true), false, layer);
        let answer = post(&app, &spend(3, "u"), &[]).await;
        let body = answer.json();
        assert!(
            body["extensions"]["fanout"].get("requested").is_none(),
            "{body}"
        );
        assert_eq!(
            cost_headers(&answer),
            [Some(MAX_READS), Some(3), Some(MAX_READS)],
            "{name}"
        );
        let cost = &body["extensions"]["cost"];
        assert_eq!(cost["requestedQueryCost"], MAX_READS, "{name}: {body}");
        assert_eq!(cost["actualQueryCost"], 3, "{name}: {body}");
    }
}

#[tokio::test(start_paused = true)]
async fn refusals_carry_the_headers_too() {
    for (layer, name) in BOTH {
        let mut config = with_headers(true);
        config.quota = QuotaConfig::default().reads(60).period_secs(60).burst(5);
        let app = app(config, true, layer);
        // Refused before it is read (CSRF prevention): nothing estimated
        // or sent, the caller's budget.
        let peer: SocketAddr = CLIENT.parse().unwrap();
        let plain = |headers: &[(&str, &str)]| {
            let mut request = http::Request::post("/graphql").header("content-type", "text/plain");
            for (k, v) in headers {
                request = request.header(*k, *v);
            }
            let mut request = request
                .body(axum::body::Body::from(spend(1, "p").to_string()))
                .unwrap();
            request
                .extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
            request
        };
        let answer = call(&app.router, plain(&[])).await;
        assert_eq!(answer.status, 400, "{name}");
        assert_eq!(cost_headers(&answer), [Some(0), Some(0), Some(MAX_READS)]);
        let answer = call(&app.router, plain(&[("x-internal-token", TOKEN)])).await;
        assert_eq!(answer.status, 400, "{name}");
        let expected = [Some(0), Some(0), Some(INTERNAL_MAX_READS)];
        assert_eq!(cost_headers(&answer), expected, "{name}");
        // A method no GraphQL request uses (`FanoutGraphQL` refuses it; the
        // stock service under the layer answers as it does).
        let mut put = graphql_request(spend(1, "m").to_string(), &[], Some(peer));
        *put.method_mut() = http::Method::PUT;
        let answer = call(&app.router, put).await;
        let (status, ran) = if layer { (200, 1) } else { (405, 0) };
        assert_eq!(answer.status, status, "{name}");
        let expected = [Some(ran), Some(ran), Some(MAX_READS)];
        assert_eq!(cost_headers(&answer), expected, "{name}");
        // 429: the quota cannot cover the estimate; nothing sent.
        let answer = post(&app, &spend(4, "q1"), &[]).await;
        assert_eq!(answer.status, 200, "{name}");
        let answer = post(&app, &spend(4, "q2"), &[]).await;
        let body = answer.json();
        assert_eq!(answer.status, 429, "{name}: {body}");
        assert_eq!(body["errors"][0]["extensions"]["code"], "QUOTA_EXHAUSTED");
        assert_eq!(cost_headers(&answer), [Some(4), Some(0), Some(MAX_READS)]);
        assert_eq!(app.transport.sent().len() as u64, 4 + ran, "{name}");
    }
}

/// A Shopify-style client: 20 requests of 4 reads each, one every 250 ms
/// of its own; when `pace`, before each request it waits
/// `(requestedQueryCost - currentlyAvailable) / restoreRate` seconds if
/// the last answer's `extensions.cost` says the request would not fit.
/// The server: a quota of 1 read a second, a burst of 10. Returns the
/// requests refused 429, and the time the loop took.
async fn client_loop(layer: bool, pace: bool) -> (usize, Duration) {
    let mut config = Config::default();
    config.http.cost_extension = true;
    config.quota = QuotaConfig::default().reads(60).period_secs(60).burst(10);
    let app = app(config, true, layer);
    let started = Instant::now();
    let (mut refused, mut last_cost): (usize, Option<Value>) = (0, None);
    for step in 0..20 {
        if let Some(cost) = last_cost.as_ref().filter(|_| pace) {
            let requested = cost["requestedQueryCost"].as_f64().unwrap();
            let status = &cost["throttleStatus"];
            let available = status["currentlyAvailable"].as_f64().unwrap();
            let rate = status["restoreRate"].as_f64().unwrap();
            if requested > available {
                let wait = (requested - available) / rate;
                tokio::time::sleep(Duration::from_secs_f64(wait)).await;
            }
        }
        let answer = post(&app, &spend(4, &format!("c{step}")), &[]).await;
        let body = answer.json();
        match answer.status.as_u16() {
            200 => {
                assert_eq!(body["extensions"]["fanout"]["used"], 4, "{body}");
                let cost = body["extensions"]["cost"].clone();
                let quota = &body["extensions"]["fanout"]["quota"];
                let status = &cost["throttleStatus"];
                assert_eq!(status["maximumAvailable"], 10, "the burst: {body}");
                assert_eq!(status["currentlyAvailable"], quota["remaining"], "{body}");
                assert_eq!(status["restoreRate"].as_f64(), Some(1.0), "{body}");
                assert_eq!(cost["requestedQueryCost"], 4, "{body}");
                assert_eq!(cost["actualQueryCost"], 4, "{body}");
                last_cost = Some(cost);
            }
            429 => {
                assert_eq!(body["errors"][0]["extensions"]["code"], "QUOTA_EXHAUSTED");
                refused += 1;
            }
            status => panic!("step {step}: {status} {body}"),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let sent = app.transport.sent().len();
    assert_eq!(
        sent,
        4 * (20 - refused),
        "every admitted request sent its 4"
    );
    (refused, started.elapsed())
}

#[tokio::test(start_paused = true)]
async fn a_client_pacing_on_the_envelope_is_never_refused() {
    for (layer, name) in BOTH {
        let (refused, took) = client_loop(layer, true).await;
        assert_eq!(refused, 0, "{name}: the pacing client was refused");
        // 80 reads at 1 a second past a burst of 10: at least 70 s; a
        // client told nothing useful (waiting 4 s each time) would take 85.
        assert!(
            took >= Duration::from_secs(70) && took < Duration::from_secs(80),
            "{name}: took {took:?}"
        );
        let (refused, took) = client_loop(layer, false).await;
        assert!(
            refused >= 10,
            "{name}: the same loop not pacing was refused {refused} times in {took:?}"
        );
    }
}

#[tokio::test]
async fn over_a_websocket_each_event_carries_its_envelope() {
    use fanout_testkit::ws::{connect_from, init, subscribe, until_complete};
    use std::future::IntoFuture;
    let mut config = Config::default();
    config.http.cost_extension = true;
    let app = app(config.clone(), true, false);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let serving = fanout_budget::inbound::serve(listener, app.router.clone(), &config);
    let task = tokio::spawn(serving.into_future());
    let from = std::net::Ipv4Addr::LOCALHOST;
    let mut socket = connect_from(address, from).await.unwrap();
    init(&mut socket, json!({})).await;
    subscribe(&mut socket, "q", "{ spend(n: 3, tag: \"w\") { ok } }").await;
    let events = until_complete(&mut socket, "q").await;
    task.abort();
    let extensions = &events[0]["payload"]["extensions"];
    assert_eq!(extensions["fanout"]["operationReads"], 3, "{extensions}");
    assert_eq!(
        extensions["cost"],
        json!({ "requestedQueryCost": 3, "actualQueryCost": 3 }),
        "{extensions}"
    );
}
