//! The gateway bounded in memory, with the defaults, against the shapes a
//! hostile review used to abort the process: each runs in a child process
//! under a 4 GiB address-space limit (the gateway alone; the registry, with
//! the hostile content planted, runs in this parent process), which reports
//! the answer and how far its peak resident memory rose during the request.
//!
//! - aliases × a 256-layer manifest, as hash-only persisted operations:
//!   `RESPONSE_TOO_LARGE`, the process never aborts, under 256 MiB;
//!   20 such operations: their texts pass the body's bound (413);
//! - a config blob whose `os` is 15 MB, aliased 1,990 times (the selection bound allows 2,000): the value is
//!   refused where it is parsed (`UPSTREAM_ERROR`);
//! - a legitimate batch of 20 operations of ~7,000 answer fields: answered;
//! - a 12 MB tag list: parsed into at most 8× its bytes;
//! - 16 of the aliased-layers batches in parallel: each stopped, or
//!   refused `OVERLOADED` once the requests in flight hold
//!   `http.max_inflight_bytes`; under 1 GiB together.

use fanout_budget::Config;
use fanout_gateway::app;
use fanout_gateway::embedded::store::{digest, Image, Store, OCI_CONFIG, OCI_LAYER, OCI_MANIFEST};
use fanout_gateway::embedded::EmbeddedRegistry;
use fanout_testkit::child;
use fanout_testkit::sha256_hex;
use serde_json::{json, Value};
use std::time::Duration;

/// The registry's base URL, in the child.
const UPSTREAM_VAR: &str = "FANOUT_TEST_UPSTREAM";
/// Tags in `acme/many` (its list is about 12 MB of JSON).
const MANY_TAGS: usize = 1_000_000;

/// The fixture, plus the planted content: `acme/wide:t` lists 256 layers,
/// `acme/evil:t`'s config has a 15 MB `os`, `acme/many` has a million tags.
fn hostile_store() -> Store {
    let mut store = Store::fixture();
    store.put_image("acme/wide", Some("t"), &Image::with_layers(256));
    let config = json!({ "os": "x".repeat(15 << 20), "architecture": "amd64" })
        .to_string()
        .into_bytes();
    let config_size = config.len();
    let config_digest = store.put_blob("acme/evil", config);
    let layer = store.put_blob("acme/evil", b"layer".to_vec());
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": { "mediaType": OCI_CONFIG, "digest": config_digest, "size": config_size },
        "layers": [{ "mediaType": OCI_LAYER, "digest": layer, "size": 5 }],
    })
    .to_string()
    .into_bytes();
    let manifest_digest = digest(&manifest);
    store.put_manifest("acme/evil", Some("t"), OCI_MANIFEST, manifest);
    let many = store.repos.entry("acme/many".into()).or_default();
    for i in 0..MANY_TAGS {
        many.tags
            .insert(format!("v{i:07}"), manifest_digest.clone());
    }
    store
}

/// 130 aliases of the 256-layer manifest's layers: priced just under the
/// complexity limit, about 133,000 answer values.
fn layers_query() -> String {
    let aliases: String = (0..130)
        .map(|i| format!("l{i}: layers {{ digest mediaType size }} "))
        .collect();
    format!("{{ repository(name: \"acme/wide\") {{ tag(name: \"t\") {{ manifest {{ {aliases}}} }} }} }}")
}

/// A batch of `n` hash-only persisted operations of `query` (registered
/// first with its text, as Apollo's link does).
async fn persisted_batch(router: &axum::Router, query: &str, n: usize) -> String {
    let ext = json!({ "persistedQuery": { "version": 1, "sha256Hash": sha256_hex(query) } });
    let register = json!({ "query": query, "extensions": ext }).to_string();
    let answer = fanout_testkit::post(router, register, &[]).await;
    assert_eq!(answer.status, 200, "registering: {:?}", answer.json());
    Value::Array(vec![json!({ "extensions": ext }); n]).to_string()
}

/// The request body of `shape` (registering what it needs first).
async fn body(router: &axum::Router, shape: &str) -> String {
    match shape {
        "layers" | "parallel" => persisted_batch(router, &layers_query(), 12).await,
        "layers20" => persisted_batch(router, &layers_query(), 20).await,
        "os" => {
            let aliases: String = (0..1990).map(|i| format!("o{i}: os ")).collect();
            let query = format!(
                "{{ repository(name: \"acme/evil\") {{ tag(name: \"t\") {{ manifest {{ config {{ {aliases}}} }} }} }} }}"
            );
            json!({ "query": query }).to_string()
        }
        "legit" => {
            let pages: String = (0..20)
                .map(|i| {
                    format!(
                        "p{i}: tags(first: 40) {{ nodes {{ name manifest {{ digest mediaType config {{ os architecture created }} }} }} }} "
                    )
                })
                .collect();
            let query = format!("{{ repository(name: \"acme/app\") {{ {pages}}} }}");
            Value::Array(vec![json!({ "query": query }); 20]).to_string()
        }
        "tags" => json!({ "query": "{ repository(name: \"acme/many\") { tags(first: 1) { totalCount } } }" }).to_string(),
        other => panic!("no shape {other}"),
    }
}

/// The first error's code of an answer, `answered` when it has none.
fn code_of(answer: &Value) -> String {
    let first = if answer.is_array() {
        &answer[0]
    } else {
        answer
    };
    let path = |e: &Value| e["extensions"]["code"].as_str().map(str::to_string);
    first["errors"]
        .as_array()
        .and_then(|errors| errors.iter().find_map(path))
        .unwrap_or_else(|| "answered".into())
}

/// In the child: the gateway with the defaults over the parent's registry;
/// reports `status code rise_mib` for each request of the shape.
fn run_case(shape: &str) {
    let upstream: reqwest::Url = std::env::var(UPSTREAM_VAR).unwrap().parse().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let gateway = app::build(Config::default(), upstream, None);
        let router = gateway.router;
        let body = body(&router, shape).await;
        let copies = if shape == "parallel" { 16 } else { 1 };
        let before = child::rss_mib();
        child::reset_peak();
        let requests = (0..copies).map(|_| fanout_testkit::post(&router, body.clone(), &[]));
        let answers = futures::future::join_all(requests).await;
        let rise = child::peak_mib() - before;
        for answer in answers {
            child::report(format!(
                "{} {} {rise:.0}",
                answer.status.as_u16(),
                code_of(&answer.json())
            ));
        }
    });
}

/// Runs `shape` in a child against `registry`: (status, code) of each
/// request, and the peak's rise in MiB.
fn measure(test: &str, shape: &str, registry: &str) -> (Vec<(u16, String)>, f64) {
    let run = child::run_with(
        test,
        shape,
        4096,
        Duration::from_secs(180),
        &[(UPSTREAM_VAR, registry)],
    );
    assert!(
        run.success && !run.reports.is_empty(),
        "{shape}: the child ended {}:\n{}",
        run.ended,
        run.output
            .lines()
            .rev()
            .take(8)
            .collect::<Vec<_>>()
            .join("\n")
    );
    let mut rise = 0.0;
    let answers = run
        .reports
        .iter()
        .map(|r| {
            let mut parts = r.split(' ');
            let status = parts.next().unwrap().parse().unwrap();
            let code = parts.next().unwrap().to_string();
            rise = parts.next().unwrap().parse().unwrap();
            (status, code)
        })
        .collect();
    (answers, rise)
}

/// One test, so the registry (a million tags) is built once: every shape
/// against it, one child each.
#[test]
fn hostile_shapes_stay_within_the_memory_bounds() {
    let test = "hostile_shapes_stay_within_the_memory_bounds";
    if let Some(shape) = child::case() {
        return run_case(&shape);
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let registry = runtime
        .block_on(EmbeddedRegistry::start(hostile_store()))
        .unwrap();
    let url = registry.url();
    let mib = |bytes: usize| bytes as f64 / f64::from(1 << 20);

    let (answers, rise) = measure(test, "layers", &url);
    eprintln!(
        "130 aliases × 256 layers, 12 persisted operations: {answers:?}, peak +{rise:.0} MiB"
    );
    assert_eq!(answers, [(200, "RESPONSE_TOO_LARGE".to_string())]);
    assert!(rise < 256.0, "peak rose {rise:.0} MiB");

    let (answers, rise) = measure(test, "layers20", &url);
    eprintln!("the same, 20 operations: {answers:?}, peak +{rise:.0} MiB");
    assert_eq!(answers, [(413, "PAYLOAD_TOO_LARGE".to_string())]);

    let (answers, rise) = measure(test, "os", &url);
    eprintln!("a 15 MB os, 1,990 aliases: {answers:?}, peak +{rise:.0} MiB");
    assert_eq!(answers, [(200, "UPSTREAM_ERROR".to_string())]);
    assert!(rise < 256.0, "peak rose {rise:.0} MiB");

    let (answers, rise) = measure(test, "legit", &url);
    eprintln!("20 operations of ~7,000 fields: {answers:?}, peak +{rise:.0} MiB");
    assert_eq!(answers, [(200, "answered".to_string())]);
    assert!(rise < 256.0, "peak rose {rise:.0} MiB");

    let list_bytes = json!({ "name": "acme/many", "tags": registry.with_store(|s| {
        s.repos["acme/many"].tags.keys().cloned().collect::<Vec<_>>()
    }) })
    .to_string()
    .len();
    let (answers, rise) = measure(test, "tags", &url);
    eprintln!(
        "a {:.1} MiB tag list: {answers:?}, peak +{rise:.0} MiB ({:.1}× its bytes)",
        mib(list_bytes),
        rise / mib(list_bytes)
    );
    assert_eq!(answers, [(200, "answered".to_string())]);
    assert!(rise < 8.0 * mib(list_bytes), "peak rose {rise:.0} MiB");

    let (answers, rise) = measure(test, "parallel", &url);
    eprintln!("16 of the aliased-layers batches in parallel: {answers:?}, peak +{rise:.0} MiB");
    assert_eq!(answers.len(), 16);
    // Each stopped by its own bound, or refused `OVERLOADED` once the
    // requests in flight hold the process's (on a loaded machine some may
    // meet a read timeout first: still a GraphQL answer).
    for (status, code) in &answers {
        assert!(
            *status == 200 || (*status, code.as_str()) == (503, "OVERLOADED"),
            "{answers:?}"
        );
    }
    assert!(rise < 1024.0, "peak rose {rise:.0} MiB");
}
