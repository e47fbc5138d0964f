//! An answer is bounded in memory while it is built, under both
//! integrations: a small request whose answer would be huge (aliases of a
//! long string, a long list, a batch of them) stops at
//! `http.max_answer_bytes` with `RESPONSE_TOO_LARGE`, and the process's peak
//! memory grows by a bounded amount — measured by the kernel, in a child
//! process under a 4 GiB address-space limit, so a shape that escaped the
//! bound would end only its child. Each test also runs its shape with the
//! bound lifted, to show the shape would have taken the memory.

use async_graphql::{Context, EmptyMutation, EmptySubscription, Object, Schema, SimpleObject};
use axum::Router;
use fanout_budget::{Config, Engine, FanoutExtension, FanoutGraphQL, FanoutLayer};
use fanout_testkit::child;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// A long string, as an upstream body would hold it (shared, cloned into
/// the answer by every alias that selects it).
struct Long(Arc<String>);

#[derive(SimpleObject)]
struct Item {
    name: String,
    size: u64,
}

struct Query;

#[Object]
impl Query {
    /// The shared long string (1 MiB).
    async fn long(&self, ctx: &Context<'_>) -> String {
        ctx.data_unchecked::<Long>().0.as_str().to_owned()
    }

    /// One upstream read (of the testkit's loopback upstream, whose base
    /// URL is in the schema's data when a test puts it there).
    async fn page(&self, ctx: &Context<'_>) -> Option<String> {
        use fanout_budget::{FanoutContext, OrNull, Read};
        let base = ctx.data_opt::<Base>()?;
        let url = format!("{}/item/1", base.0).parse().unwrap();
        let read =
            async { Ok::<_, async_graphql::Error>(ctx.upstream()?.read(Read::get(url)).await?) };
        read.await
            .map(|r| String::from_utf8_lossy(&r.body).into_owned())
            .or_null(ctx)
    }

    /// `n` small rows.
    async fn items(&self, n: u32) -> Vec<Item> {
        (0..n)
            .map(|i| Item {
                name: format!("item-{i:08}"),
                size: u64::from(i),
            })
            .collect()
    }
}

fn schema(engine: &Engine) -> Schema<Query, EmptyMutation, EmptySubscription> {
    Schema::build(Query, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(engine))
        .data(Long(Arc::new("x".repeat(1 << 20))))
        .finish()
}

fn router(integration: &str, config: Config) -> Router {
    let engine = Engine::new(config);
    let schema = schema(&engine);
    match integration {
        "service" => Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine)),
        _ => Router::new()
            .route_service("/graphql", async_graphql_axum::GraphQL::new(schema))
            .layer(FanoutLayer::new(engine)),
    }
}

/// The upstream's base URL.
struct Base(String);

/// Nothing is read past the bound: once the answer has tripped, a field
/// that would read parks instead (its sibling aliases tripped it first), and
/// the upstream sees nothing, though the same field reads in a request that
/// does not trip (its connection kept warm, so a read could go out at once).
#[tokio::test]
async fn nothing_is_read_past_the_bound() {
    let upstream = fanout_testkit::Upstream::start().await;
    let mut config = Config::default();
    config.http.max_answer_bytes = 8 << 20;
    let engine = Engine::new(config);
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .data(Long(Arc::new("x".repeat(1 << 20))))
        .data(Base(upstream.base()))
        .finish();
    let app = Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine));
    let aliases: String = (0..20).map(|i| format!("a{i}: long ")).collect();
    let tripped = json!({ "query": format!("{{ {aliases} page }}") }).to_string();
    let page = json!({ "query": "{ page }" }).to_string();
    for _ in 0..3 {
        let before = upstream.seen.requests();
        let answer = fanout_testkit::post(&app, page.clone(), &[]).await;
        assert!(
            answer.json()["data"]["page"].is_string(),
            "{:?}",
            answer.json()
        );
        assert_eq!(
            upstream.seen.requests() - before,
            1,
            "a request that does not trip reads"
        );
        let answer = fanout_testkit::post(&app, tripped.clone(), &[]).await;
        assert_eq!(
            answer.json()["errors"][0]["extensions"]["code"],
            "RESPONSE_TOO_LARGE"
        );
        assert_eq!(
            upstream.seen.requests() - before,
            1,
            "nothing read past the bound"
        );
    }
}

/// The shapes: (name, body).
fn body(shape: &str) -> String {
    match shape {
        // 400 aliases of a 1 MiB string: 400 MiB of answer.
        "aliases" => {
            let aliases: String = (0..400).map(|i| format!("a{i}: long ")).collect();
            json!({ "query": format!("{{ {aliases}}}") }).to_string()
        }
        // 3 operations of 300 aliased pages of 1,000 rows: 2.7 M values.
        "batch" => {
            let pages: String = (0..300)
                .map(|i| format!("p{i}: items(n: 1000) {{ name size }} "))
                .collect();
            let op = json!({ "query": format!("{{ {pages}}}") });
            Value::Array(vec![op; 3]).to_string()
        }
        // 2,000 rows of 1,990 aliases of `__typename` (async-graphql
        // inserts those without a resolve): 4 M object entries.
        "typename" => {
            let names: String = (0..1990).map(|i| format!("t{i}: __typename ")).collect();
            json!({ "query": format!("{{ items(n: 2000) {{ {names}}} }}") }).to_string()
        }
        // A page anyone may ask for: answered.
        _ => json!({ "query": "{ items(n: 1000) { name size } a: long }" }).to_string(),
    }
}

/// In the child: runs `shape` once and reports the answer's code (or
/// `answered`) and how far the peak RSS rose above the resident memory
/// before the request, in MiB.
fn run_case(case: &str) {
    let (integration, shape, bounded) = {
        let mut parts = case.split(':');
        let mut next = || parts.next().unwrap_or("").to_string();
        (next(), next(), next() == "bounded")
    };
    let mut config = Config::default();
    if !bounded {
        config.http.max_answer_bytes = usize::MAX;
        config.http.max_inflight_bytes = usize::MAX;
        config.http.max_response_bytes = usize::MAX;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let app = router(&integration, config);
        let body = body(&shape);
        let before = child::rss_mib();
        child::reset_peak();
        let answer = fanout_testkit::post(&app, body, &[]).await;
        let rise = child::peak_mib() - before;
        let json = answer.json();
        let first = if json.is_array() { &json[0] } else { &json };
        let code = first["errors"][0]["extensions"]["code"]
            .as_str()
            .unwrap_or(if first["data"].is_null() {
                "no-data"
            } else {
                "answered"
            })
            .to_string();
        child::report(format!("{} {code} {rise:.0}", answer.status.as_u16()));
    });
}

/// Runs `shape` under `integration` in a child, bounded (the defaults) or
/// not; (status code rise_mib), or how the child ended.
fn measure(
    test: &str,
    integration: &str,
    shape: &str,
    bounded: bool,
) -> Result<(u16, String, f64), String> {
    let case = format!(
        "{integration}:{shape}:{}",
        if bounded { "bounded" } else { "unbounded" }
    );
    let run = child::run(test, &case, 4096, Duration::from_secs(120));
    let report = run.reports.first().filter(|_| run.success).ok_or_else(|| {
        format!(
            "child {case} ended {} without a report:\n{}",
            run.ended,
            run.output
                .lines()
                .rev()
                .take(5)
                .collect::<Vec<_>>()
                .join("\n")
        )
    })?;
    let mut parts = report.split(' ');
    let status = parts.next().unwrap().parse().unwrap();
    let code = parts.next().unwrap().to_string();
    let rise = parts.next().unwrap().parse().unwrap();
    Ok((status, code, rise))
}

/// The bound's promise for one shape: stopped with `RESPONSE_TOO_LARGE`
/// (the whole request, `data: null`, 200) within 256 MiB of peak growth,
/// under both integrations; without the bound the same shape takes more
/// than that (or ends the child), so the test can fail.
fn stopped_within_bounds(test: &str, shape: &str) {
    let mut rise = 0.0_f64;
    for integration in ["service", "layer"] {
        let (status, code, r) = measure(test, integration, shape, true).unwrap();
        eprintln!("{integration} {shape}: {status} {code}, peak +{r:.0} MiB");
        assert_eq!(
            (status, code.as_str()),
            (200, "RESPONSE_TOO_LARGE"),
            "{integration}"
        );
        assert!(r < 256.0, "{integration}: peak rose {r:.0} MiB");
        rise = rise.max(r);
    }
    let integration = "service";
    match measure(test, integration, shape, false) {
        Ok((_, code, unbounded)) => {
            eprintln!("{integration} {shape} without the bound: {code}, peak +{unbounded:.0} MiB");
            assert!(
                unbounded > 256.0 + rise,
                "without the bound the shape took only {unbounded:.0} MiB"
            );
        }
        // Ended by the address-space limit: it would have taken more.
        Err(ended) => eprintln!("{integration} {shape} without the bound: {ended}"),
    }
}

#[test]
fn aliases_of_a_long_string_stop_at_the_bound() {
    let test = "aliases_of_a_long_string_stop_at_the_bound";
    if let Some(case) = child::case() {
        return run_case(&case);
    }
    stopped_within_bounds(test, "aliases");
}

#[test]
fn a_batch_of_long_lists_stops_at_the_bound() {
    let test = "a_batch_of_long_lists_stops_at_the_bound";
    if let Some(case) = child::case() {
        return run_case(&case);
    }
    stopped_within_bounds(test, "batch");
}

#[test]
fn typename_entries_count_too() {
    let test = "typename_entries_count_too";
    if let Some(case) = child::case() {
        return run_case(&case);
    }
    stopped_within_bounds(test, "typename");
}

#[test]
fn a_page_within_the_bound_is_answered() {
    let test = "a_page_within_the_bound_is_answered";
    if let Some(case) = child::case() {
        return run_case(&case);
    }
    for integration in ["service", "layer"] {
        let (status, code, rise) = measure(test, integration, "page", true).unwrap();
        assert_eq!((status, code.as_str()), (200, "answered"), "{integration}");
        assert!(rise < 64.0, "{integration}: peak rose {rise:.0} MiB");
    }
}

/// An answer a client has not read yet still holds its bytes in the pool:
/// unread answers fill it, the next request is refused `OVERLOADED`, and
/// once they are read (or dropped) their bytes come back.
#[tokio::test]
async fn unread_answers_hold_their_bytes_until_they_are_sent() {
    use tower::ServiceExt;
    let mut config = Config::default();
    config.http.max_inflight_bytes = 4 << 20;
    for integration in ["service", "layer"] {
        let app = router(integration, config.clone());
        let send = || {
            let body = json!({ "query": "{ long }" }).to_string();
            app.clone()
                .oneshot(fanout_testkit::graphql_request(body, &[], None))
        };
        let mut unread = Vec::new();
        let refused = loop {
            let answer = send().await.unwrap();
            if answer.status() != 200 {
                break answer;
            }
            unread.push(answer);
            assert!(
                unread.len() < 10,
                "{integration}: 10 MiB held in a 4 MiB pool"
            );
        };
        assert_eq!(refused.status(), 503, "{integration}");
        assert_eq!(
            unread.len(),
            3,
            "{integration}: three 1 MiB answers fit in 4 MiB"
        );
        let body = axum::body::to_bytes(refused.into_body(), usize::MAX)
            .await
            .unwrap();
        let json: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["errors"][0]["extensions"]["code"], "OVERLOADED");
        // Read: given back.
        for answer in unread.drain(..) {
            let body = axum::body::to_bytes(answer.into_body(), usize::MAX)
                .await
                .unwrap();
            assert!(body.len() > 1 << 20);
        }
        assert_eq!(send().await.unwrap().status(), 200, "{integration}");
    }
}
