//! An upstream's share of the request's budget (`[upstreams."NAME"]
//! max_reads`): two registries by name on loopback, one capped. Past its
//! share only that upstream's reads are refused (`FANOUT_BUDGET_EXHAUSTED`
//! naming it, nothing sent, nothing charged); the other's go on under the
//! request's budget, and a batch shares one share.
use async_graphql::{Context, EmptyMutation, EmptySubscription, Object, Schema};
use axum::Router;
use fanout_budget::config::UpstreamTable;
use fanout_budget::{
    inbound::Caller, Config, Engine, FanoutContext, FanoutExtension, FanoutGraphQL, OrNull, Read,
    ReadError,
};
use fanout_testkit::Upstream;
use proptest::prelude::*;
use serde_json::{json, Value};
use std::collections::HashMap;

/// The registries' base URLs by name.
struct Bases(HashMap<String, String>);

struct Row {
    base: String,
    id: u64,
}

#[Object]
impl Row {
    async fn id(&self) -> u64 {
        self.id
    }
    /// One read of `/item/{id}` on the row's registry.
    async fn value(&self, ctx: &Context<'_>) -> Option<String> {
        let read = async {
            let url = format!("{}/item/{}", self.base, self.id).parse()?;
            let response = ctx.upstream()?.read(Read::get(url)).await?;
            let body: Value = response.json()?;
            Ok(body["value"].as_str().unwrap_or_default().to_string())
        };
        let value: async_graphql::Result<String> = read.await;
        value.or_null(ctx)
    }
}

struct Query;

#[Object]
impl Query {
    /// The rows `ids` of the registry named `upstream` (no read of their own).
    async fn rows(&self, ctx: &Context<'_>, upstream: String, ids: Vec<u64>) -> Vec<Row> {
        let base = ctx.data_unchecked::<Bases>().0[&upstream].clone();
        ids.into_iter()
            .map(|id| Row {
                base: base.clone(),
                id,
            })
            .collect()
    }
}

struct Two {
    a: Upstream,
    b: Upstream,
    app: Router,
}

/// Registries `a` (its share `cap`, 0: none) and `b`, in a request budget
/// of `max_reads`.
async fn two(cap: u64, max_reads: u64) -> Two {
    let (a, b) = (Upstream::start().await, Upstream::start().await);
    let config = config(&a, &b, cap, max_reads);
    let engine = Engine::new(config);
    let bases = HashMap::from([("a".to_string(), a.base()), ("b".to_string(), b.base())]);
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .data(Bases(bases))
        .finish();
    let app = Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine));
    Two { a, b, app }
}

fn config(a: &Upstream, b: &Upstream, cap: u64, max_reads: u64) -> Config {
    let text = format!(
        "[budget]\nmax_reads = {max_reads}\nmax_concurrent_reads = 64\n\
         [upstreams.a]\nurl = \"{}\"\nmax_reads = {cap}\n\
         [upstreams.b]\nurl = \"{}\"\n",
        a.base(),
        b.base()
    );
    Config::from_toml(&text).unwrap()
}

fn rows(name: &str, upstream: &str, ids: impl IntoIterator<Item = u64>) -> String {
    let ids: Vec<String> = ids.into_iter().map(|i| i.to_string()).collect();
    format!(
        "{name}: rows(upstream: \"{upstream}\", ids: [{}]) {{ id value }}",
        ids.join(",")
    )
}

async fn post(app: &Router, body: String) -> Value {
    let answer = fanout_testkit::post(app, body, &[]).await;
    assert_eq!(answer.status, 200);
    answer.json()
}

/// How many rows under `data[field]` have a value, and how many are null.
fn answered(data: &Value, field: &str) -> (usize, usize) {
    let rows = data[field].as_array().expect("a list of rows");
    let ok = rows.iter().filter(|r| r["value"].is_string()).count();
    let null = rows.iter().filter(|r| r["value"].is_null()).count();
    (ok, null)
}

/// The errors of one response, at the field `field` (`a` or `b`).
fn errors_at<'v>(response: &'v Value, field: &str) -> Vec<&'v Value> {
    let errors = response["errors"].as_array().map(Vec::as_slice);
    (errors.unwrap_or_default().iter())
        .filter(|e| e["path"][0] == field)
        .collect()
}

#[tokio::test]
async fn past_its_share_only_the_capped_upstream_s_rows_are_null_with_the_code() {
    let two = two(3, 100).await;
    let query = format!("{{ {} {} }}", rows("a", "a", 0..10), rows("b", "b", 0..10));
    let response = post(&two.app, json!({ "query": query }).to_string()).await;
    let data = &response["data"];
    assert_eq!(answered(data, "a"), (3, 7), "{response}");
    assert_eq!(answered(data, "b"), (10, 0), "{response}");
    // Refused reads are never sent.
    assert_eq!(two.a.requests(), 3);
    assert_eq!(two.b.requests(), 10);
    let refused = errors_at(&response, "a");
    assert_eq!(refused.len(), 7, "{response}");
    for error in refused {
        let ext = &error["extensions"];
        assert_eq!(ext["code"], "FANOUT_BUDGET_EXHAUSTED", "{error}");
        assert_eq!(ext["limit"], 3, "{error}");
        assert_eq!(ext["upstream"], "a", "{error}");
        assert_eq!(
            error["path"][2], "value",
            "the error sits at the row's field"
        );
        assert!(error["message"].as_str().unwrap().contains("upstream a"));
    }
    assert!(errors_at(&response, "b").is_empty(), "{response}");
    // Refused reads are charged nothing: `used` is what was sent.
    let fanout = &response["extensions"]["fanout"];
    assert_eq!(fanout["used"], 13, "{fanout}");
    assert_eq!(fanout["limit"], 100, "{fanout}");
    assert_eq!(fanout["remaining"], 87, "{fanout}");
    assert_eq!(fanout["operationReads"], 13, "{fanout}");
}

#[tokio::test]
async fn without_a_share_the_upstream_reads_under_the_request_s_budget_alone() {
    let two = two(0, 100).await;
    let query = format!("{{ {} {} }}", rows("a", "a", 0..10), rows("b", "b", 0..10));
    let response = post(&two.app, json!({ "query": query }).to_string()).await;
    assert_eq!(answered(&response["data"], "a"), (10, 0), "{response}");
    assert_eq!(answered(&response["data"], "b"), (10, 0), "{response}");
    assert_eq!(response["extensions"]["fanout"]["used"], 20);
}

#[tokio::test]
async fn the_other_upstreams_still_meet_the_request_s_budget() {
    // The request's 5 reads: 3 to `a` (its share), then 2 to `b`.
    let two = two(3, 5).await;
    let query = format!("{{ {} }}", rows("a", "a", 0..10));
    let first = post(&two.app, json!({ "query": query }).to_string()).await;
    assert_eq!(answered(&first["data"], "a"), (3, 7));
    let batch = json!([
        { "query": format!("{{ {} }}", rows("a", "a", 0..10)) },
        { "query": format!("{{ {} }}", rows("b", "b", 0..10)) },
    ]);
    let both = post(&two.app, batch.to_string()).await;
    let (a_ok, _) = answered(&both[0]["data"], "a");
    let (b_ok, _) = answered(&both[1]["data"], "b");
    assert_eq!(a_ok, 3, "{both}");
    assert_eq!(b_ok, 2, "{both}");
    // `b`'s refusals are the request's: its limit, no upstream named.
    for error in errors_at(&both[1], "b") {
        let ext = &error["extensions"];
        assert_eq!(ext["code"], "FANOUT_BUDGET_EXHAUSTED");
        assert_eq!(ext["limit"], 5, "{error}");
        assert!(ext.get("upstream").is_none(), "{error}");
    }
    assert_eq!(both[1]["extensions"]["fanout"]["used"], 5);
    assert_eq!(two.a.requests(), 6);
    assert_eq!(two.b.requests(), 2);
}

#[tokio::test]
async fn a_batch_shares_one_share_and_de_duplicated_reads_cost_nothing() {
    let two = two(3, 100).await;
    // `a` 0 and 1, then `a` 0..4 (0 and 1 de-duplicated: free; 2 the
    // third read; 3 refused), then `b` 0..4.
    let batch = json!([
        { "query": format!("{{ {} }}", rows("a", "a", 0..2)) },
        { "query": format!("{{ {} }}", rows("a", "a", 0..4)) },
        { "query": format!("{{ {} }}", rows("b", "b", 0..4)) },
    ]);
    let response = post(&two.app, batch.to_string()).await;
    let ok: Vec<(usize, usize)> = (0..2)
        .map(|i| answered(&response[i]["data"], "a"))
        .collect();
    // The first operation may run after the second: either way the share
    // answers `a` 0, 1 and 2 once, and refuses 3.
    assert_eq!(ok[0].0 + ok[0].1, 2, "{response}");
    assert_eq!(ok[1], (3, 1), "{response}");
    assert_eq!(ok[0], (2, 0), "{response}");
    assert_eq!(answered(&response[2]["data"], "b"), (4, 0), "{response}");
    assert_eq!(two.a.requests(), 3);
    assert_eq!(two.b.requests(), 4);
    let refused = errors_at(&response[1], "a");
    assert_eq!(refused.len(), 1, "{response}");
    assert_eq!(refused[0]["path"], json!(["a", 3, "value"]));
    assert_eq!(refused[0]["extensions"]["upstream"], "a");
    for op in 0..3 {
        assert_eq!(
            response[op]["extensions"]["fanout"]["used"], 7,
            "{response}"
        );
    }
}

#[tokio::test]
async fn each_request_has_a_share_of_its_own() {
    let two = two(3, 100).await;
    for round in 0..3 {
        let query = format!("{{ {} }}", rows("a", "a", round * 10..round * 10 + 5));
        let response = post(&two.app, json!({ "query": query }).to_string()).await;
        assert_eq!(answered(&response["data"], "a"), (3, 2), "{response}");
    }
    assert_eq!(two.a.requests(), 9);
}

#[tokio::test]
async fn a_redirect_hop_counts_against_the_share_of_the_upstream_it_is_sent_to() {
    let (a, b) = (Upstream::start().await, Upstream::start().await);
    let engine = Engine::new(config(&a, &b, 1, 100));
    let request = engine.begin_request(Caller::Public);
    let op = request.operation();
    // `a`'s share: one read.
    let upstream = op.upstream();
    let first = upstream.read(Read::get(a.url("/item/1").parse().unwrap()));
    assert!(first.await.is_ok());
    // `b` answers with a redirect to `a`'s `/ok`: the hop is `a`'s, and
    // refused (sent, and not de-duplicated, it would be `a`'s second).
    let to_a = b.url(&format!("/to/{}", a.addr.port())).parse().unwrap();
    let err = op.upstream().read(Read::get(to_a)).await.unwrap_err();
    assert_eq!(
        err,
        ReadError::UpstreamBudgetExhausted {
            upstream: "a".into(),
            limit: 1
        }
    );
    assert_eq!((a.requests(), b.requests()), (1, 1));
    assert_eq!(request.budget().used(), 2);
    let counts = request.budget().counts();
    assert_eq!((counts.issued, counts.refused_budget), (2, 1));
}

#[tokio::test]
async fn an_origin_is_matched_whatever_the_case_of_its_host_and_with_its_default_port() {
    let a = Upstream::start().await;
    let port = a.addr.port();
    let config = Config::default().upstream_named(
        "local",
        UpstreamTable::default()
            .url(format!("http://LocalHost:{port}/v2/"))
            .max_reads(1),
    );
    let engine = Engine::new(config);
    let request = engine.begin_request(Caller::Public);
    let op = request.operation();
    let read = |path: &str| Read::get(format!("http://localhost:{port}{path}").parse().unwrap());
    assert!(op.upstream().read(read("/ok")).await.is_ok());
    let err = op.upstream().read(read("/item/1")).await.unwrap_err();
    assert_eq!(err.code(), "FANOUT_BUDGET_EXHAUSTED");
    assert_eq!(err.extensions().get("upstream"), Some(&"local".into()));
    // Another origin (another port) is not the table's.
    let b = Upstream::start().await;
    let other = Read::get(b.url("/ok").parse().unwrap());
    assert!(op.upstream().read(other).await.is_ok());
    assert_eq!(request.budget().used(), 2);
}

#[test]
fn the_key_parses_defaults_to_no_share_and_is_documented() {
    let config = Config::from_toml(
        "[upstreams.a]\nurl = \"http://127.0.0.1:1\"\nmax_reads = 3\n\
         [upstreams.b]\nurl = \"http://127.0.0.1:2\"\n",
    )
    .unwrap();
    assert_eq!(config.upstreams["a"].max_reads, 3);
    assert_eq!(config.upstreams["b"].max_reads, 0);
    assert_eq!(UpstreamTable::default().max_reads, 0);
    let wrong = Config::from_toml("[upstreams.a]\nurl = \"http://127.0.0.1:1\"\nmax_reads = -1\n");
    assert!(wrong.is_err());
    let book = include_str!("../book/src/configuration.md");
    assert!(book.contains("| `upstreams.<name>.max_reads` | 0 |"));
}

/// `n_a` reads to `a` (share `cap`) and `n_b` to `b`, all at once, in a
/// request of `budget` reads; what each upstream saw, and the request's `used`.
async fn concurrent(cap: u64, budget: u64, n_a: u64, n_b: u64) -> (u64, u64, u64) {
    let (a, b) = (Upstream::start().await, Upstream::start().await);
    let engine = Engine::new(config(&a, &b, cap, budget));
    let request = engine.begin_request(Caller::Public);
    let urls = (0..n_a).map(|i| a.url(&format!("/item/{i}")));
    let urls = urls.chain((0..n_b).map(|i| b.url(&format!("/item/{i}"))));
    let tasks: Vec<_> = urls
        .map(|url| {
            let request = request.clone();
            tokio::spawn(async move {
                let op = request.operation();
                let read = op.upstream().read(Read::get(url.parse().unwrap())).await;
                if let Err(err) = &read {
                    assert_eq!(err.code(), "FANOUT_BUDGET_EXHAUSTED");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert!(request.budget().counts().balanced());
    (a.requests(), b.requests(), request.budget().used())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// However concurrent reads interleave, the capped upstream is sent at
    /// most its share, and the request exactly what both could take.
    #[test]
    fn concurrent_reads_never_pass_the_share(
        cap in 1u64..12,
        budget in 1u64..40,
        n_a in 0u64..40,
        n_b in 0u64..40,
    ) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .unwrap();
        let (sent_a, sent_b, used) = runtime.block_on(concurrent(cap, budget, n_a, n_b));
        let wanted = n_a.min(cap) + n_b;
        prop_assert!(sent_a <= cap, "{sent_a} reads sent to a, its share {cap}");
        prop_assert_eq!(sent_a + sent_b, used);
        prop_assert_eq!(used, wanted.min(budget));
        if wanted <= budget {
            prop_assert_eq!((sent_a, sent_b), (n_a.min(cap), n_b));
        }
    }
}
