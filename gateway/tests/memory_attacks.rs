//! Shapes that got past the memory bounds (`http.max_answer_bytes`,
//! `http.max_inflight_bytes`) with one small request and the defaults. Each
//! runs in a child process under a 4 GiB address-space limit (the gateway
//! alone; the registries, with their content planted, run in this parent),
//! which reports the answer and how far its peak resident memory rose; each
//! must end its child normally and stay under 256 MiB, what the book (memory)
//! promises for one request.
//!
//! - `typename`: 20 operations of 45 aliases × 256 layers × 8 `__typename`
//!   (small objects: their maps' growth slack, and the type name's string,
//!   are not in the weight of an entry);
//! - `first0`: 4 operations of 495 aliases of `tags(first: 0)` on a catalog
//!   page of 100 repositories: 198,000 field errors, each weighed far below
//!   what it holds;
//! - `invalid_tags`: 20 operations of 47 aliases × 100 rows × 10 `manifest`
//!   on a tag list whose names are outside the grammar (an error per
//!   manifest, no read): 940,000 field errors;
//! - `fat_tags`: 200 aliases of a page of 100 tags of 160 KB (a 16 MB list,
//!   under the upstream response cap): each page copied the names and held
//!   them while its last row waited on a read, uncounted;
//! - `fat_catalog`: a registry whose catalog ignores `n` (1.5 M names),
//!   asked for one: every name became a row.
//!
//! `FANOUT_ATTACKS=a,b` runs only those shapes (any shape `body` knows).

use fanout_budget::Config;
use fanout_gateway::app;
use fanout_gateway::embedded::store::{Image, Store};
use fanout_gateway::embedded::EmbeddedRegistry;
use fanout_testkit::child;
use serde_json::{json, Value};
use std::time::Duration;

/// The registry's base URL, in the child.
const UPSTREAM_VAR: &str = "FANOUT_TEST_UPSTREAM";

/// The shapes the test runs, each with the registry it reads.
const SHAPES: &[&str] = &[
    "typename/20/45/8",
    "first0/4/495",
    "invalid_tags/20/47/10",
    "fat_tags/200",
    "fat_catalog",
];

/// The fixture, plus: `acme/wide:t` lists 256 layers; 100 repositories in
/// all; `acme/fat` has a tag `a` and 99 tags of 160 KB outside the tag
/// grammar; `acme/bad` has a tag `a` and 99 short tags outside the grammar.
fn store() -> Store {
    let mut store = Store::fixture();
    store.put_image("acme/wide", Some("t"), &Image::with_layers(256));
    let demo = Image::demo("linux", "amd64", "f");
    for i in 30..96 {
        store.put_image(&format!("filler/r{i:02}"), Some("latest"), &demo);
    }
    for (repo, len) in [("acme/fat", 160_000), ("acme/bad", 0)] {
        let (digest, _) = store.put_image(repo, Some("a"), &demo);
        let tags = &mut store.repos.get_mut(repo).unwrap().tags;
        for i in 0..99 {
            // `-` first: not a tag, so its `manifest` fails without a read.
            tags.insert(format!("-{i:02}{}", "x".repeat(len)), digest.clone());
        }
    }
    store
}

/// A registry whose catalog ignores `n`: 1.5 M names (about 15 MB, under
/// the upstream response cap), whatever the page asked for.
async fn catalog_ignoring_n() -> String {
    let names: Vec<String> = (0..1_500_000).map(|i| format!("r{i:07}")).collect();
    let body = bytes::Bytes::from(json!({ "repositories": names }).to_string());
    let app = axum::Router::new().route(
        "/v2/_catalog",
        axum::routing::get(move || {
            let body = body.clone();
            async move { ([("content-type", "application/json")], body) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// `<name>/<n>/<n>…`: the name and its numbers.
fn numbers(shape: &str) -> (&str, Vec<usize>) {
    let mut parts = shape.split('/');
    let name = parts.next().unwrap();
    (name, parts.map(|n| n.parse().unwrap()).collect())
}

fn batch(query: String, ops: usize) -> String {
    Value::Array(vec![json!({ "query": query }); ops]).to_string()
}

fn aliases(n: usize, each: impl Fn(usize) -> String) -> String {
    (0..n).map(each).collect::<Vec<_>>().join(" ")
}

/// The request body of `shape`.
fn body(shape: &str) -> String {
    match numbers(shape) {
        ("typename", n) => {
            let layers = aliases(n[1], |i| format!("l{i}:layers{{...F}}"));
            let names = aliases(n[2], |i| format!("t{i}:__typename"));
            let query = format!(
                "{{repository(name:\"acme/wide\"){{tag(name:\"t\"){{manifest{{{layers}}}}}}}}} \
                 fragment F on Descriptor{{{names}}}"
            );
            batch(query, n[0])
        }
        ("first0", n) => {
            let tags = aliases(n[1], |i| format!("a{i}:tags(first:0){{totalCount}}"));
            batch(
                format!("{{repositories(first:100){{nodes{{{tags}}}}}}}"),
                n[0],
            )
        }
        ("invalid_tags", n) => {
            let pages = aliases(n[1], |i| format!("a{i}:tags(first:100){{...N}}"));
            let manifests = aliases(n[2], |i| format!("m{i}:manifest{{digest}}"));
            let query = format!(
                "{{repository(name:\"acme/bad\"){{{pages}}}}} \
                 fragment N on TagConnection{{nodes{{{manifests}}}}}"
            );
            batch(query, n[0])
        }
        ("fat_tags", n) => {
            let pages = aliases(n[0], |i| {
                format!("a{i}:tags(first:100){{nodes{{manifest{{digest}}}}}}")
            });
            json!({ "query": format!("{{repository(name:\"acme/fat\"){{{pages}}}}}") }).to_string()
        }
        ("fat_catalog", _) => {
            json!({ "query": "{ repositories(first: 1) { nodes { name } } }" }).to_string()
        }
        _ => panic!("no shape {shape}"),
    }
}

/// The answer's first error (its code and `max`), `answered` when it has none.
fn outcome(answer: &Value) -> String {
    let first = if answer.is_array() {
        &answer[0]
    } else {
        answer
    };
    let error = &first["errors"][0];
    match error["extensions"]["code"].as_str() {
        None => "answered".into(),
        Some(code) => match error["extensions"]["max"].as_u64() {
            Some(max) => format!("{code}(max={max})"),
            None => code.into(),
        },
    }
}

/// In the child: the gateway with the defaults over the registry it was
/// given; reports `status outcome rise_mib`.
fn run_case(shape: &str) {
    let upstream: reqwest::Url = std::env::var(UPSTREAM_VAR).unwrap().parse().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let gateway = app::build(Config::default(), upstream, None);
        let body = if shape.starts_with("held/") {
            String::new()
        } else {
            body(shape)
        };
        let before = child::rss_mib();
        child::reset_peak();
        if let Some(n) = shape.strip_prefix("held/") {
            // `held/<n>`: n answers of about 11 MB whose bodies are not read
            // yet (slow clients), one after another.
            let body = self::body("typename/6/45/8");
            let mut held = Vec::new();
            for _ in 0..n.parse::<usize>().unwrap() {
                let request = fanout_testkit::graphql_request(
                    body.clone(),
                    &[],
                    Some(fanout_testkit::PEER.parse().unwrap()),
                );
                let response = tower::ServiceExt::oneshot(gateway.router.clone(), request)
                    .await
                    .unwrap();
                held.push(response);
            }
            let rise = child::peak_mib() - before;
            child::report(format!("{} held {rise:.0}", held[0].status().as_u16()));
            return;
        }
        let answer = fanout_testkit::post(&gateway.router, body.clone(), &[]).await;
        let rise = child::peak_mib() - before;
        child::report(format!(
            "{} {} {rise:.0} ({} bytes asked)",
            answer.status.as_u16(),
            outcome(&answer.json()),
            body.len()
        ));
    });
}

#[test]
fn small_requests_stay_within_the_memory_bounds() {
    let test = "small_requests_stay_within_the_memory_bounds";
    if let Some(shape) = child::case() {
        return run_case(&shape);
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let registry = runtime.block_on(EmbeddedRegistry::start(store())).unwrap();
    let catalog = runtime.block_on(catalog_ignoring_n());
    let only = std::env::var("FANOUT_ATTACKS").ok();
    let shapes: Vec<&str> = match only.as_deref() {
        Some(only) => only.split(',').collect(),
        None => SHAPES.to_vec(),
    };
    let mut escaped = Vec::new();
    for shape in shapes {
        let upstream = match shape {
            "fat_catalog" => catalog.clone(),
            _ => registry.url(),
        };
        let run = child::run_with(
            test,
            shape,
            4096,
            Duration::from_secs(240),
            &[(UPSTREAM_VAR, upstream.as_str())],
        );
        let report = run.reports.first().cloned();
        eprintln!("{shape}: ended {}, {report:?}", run.ended);
        let rise: Option<f64> = report
            .as_deref()
            .and_then(|r| r.split(' ').nth(2))
            .and_then(|r| r.parse().ok());
        if !run.success || rise.is_none_or(|rise| rise >= 256.0) {
            escaped.push(format!("{shape}: ended {}, {report:?}", run.ended));
        }
    }
    assert!(
        escaped.is_empty(),
        "past the bounds:\n{}",
        escaped.join("\n")
    );
}
