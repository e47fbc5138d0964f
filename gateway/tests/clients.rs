//! Real GraphQL clients against the gateway over real HTTP: graphql-http's
//! GraphQL-over-HTTP audits, urql (`@urql/core`) and Apollo Client 4, each a
//! Node script under `tests/clients/` that records every HTTP exchange it made
//! and prints one JSON document, which these tests check.
//!
//! Needs `node` (Debian package nodejs) and `npm ci --prefix gateway/tests/clients`;
//! without them each test prints `SKIPPED: …` and passes, unless
//! `FANOUT_REQUIRE_EXTERNAL=1`.
mod common;

use common::{require_binary, require_path, EmbeddedRegistry};
use fanout_budget::Config;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::future::IntoFuture;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;

/// How long one client script may run before it is killed.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(90);

/// The gateway on the embedded fixture registry, served on a loopback port
/// exactly as the binary serves it; stopped on drop.
struct Served {
    registry: EmbeddedRegistry,
    base: String,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Served {
    async fn start() -> Self {
        let registry = EmbeddedRegistry::fixture().await.unwrap();
        let config = Config::default();
        let gateway =
            fanout_gateway::app::build(config.clone(), registry.url().parse().unwrap(), None);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let serve = fanout_budget::serve(listener, gateway.router, &config);
        let addr = serve.local_addr().unwrap();
        let server = tokio::spawn(serve.into_future());
        Self {
            registry,
            base: format!("http://{addr}"),
            server,
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

/// `node` and the installed packages, or `None` (with a `SKIPPED:` line).
fn node() -> Option<PathBuf> {
    let node = require_binary("node", "nodejs")?;
    require_path(
        &clients_dir().join("node_modules"),
        "gateway/tests/clients/node_modules",
        "npm ci --prefix gateway/tests/clients",
    )
    .then_some(node)
}

/// Runs `node tests/clients/<script> <base>` (killed after
/// [`SCRIPT_TIMEOUT`], and whenever this returns or panics) and parses the
/// JSON document it printed.
async fn run_script(node: &Path, script: &str, base: &str) -> Value {
    let started = Instant::now();
    let mut child = tokio::process::Command::new(node)
        .arg(clients_dir().join(script))
        .arg(base)
        .current_dir(clients_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node starts");
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let finished = tokio::time::timeout(SCRIPT_TIMEOUT, async {
        let (read_out, read_err, status) = tokio::join!(
            stdout.read_to_end(&mut out),
            stderr.read_to_end(&mut err),
            child.wait()
        );
        read_out.unwrap();
        read_err.unwrap();
        status.unwrap()
    })
    .await;
    let status = match finished {
        Ok(status) => status,
        Err(_) => {
            let _ = child.kill().await;
            panic!(
                "{script} still running after {SCRIPT_TIMEOUT:?}; killed. stdout so far:\n{}\nstderr so far:\n{}",
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&err)
            );
        }
    };
    let stderr = String::from_utf8_lossy(&err);
    assert!(
        status.success(),
        "{script} crashed ({status}):\n{stderr}\nstdout:\n{}",
        String::from_utf8_lossy(&out)
    );
    if !stderr.trim().is_empty() {
        eprintln!("{script} stderr:\n{stderr}");
    }
    eprintln!("{script} ran in {:?}", started.elapsed());
    serde_json::from_slice(&out).unwrap_or_else(|e| {
        panic!(
            "{script} printed no JSON document ({e}):\n{}",
            String::from_utf8_lossy(&out)
        )
    })
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap()
}

/// The query parameters of a recorded request's URL.
fn params(exchange: &Value) -> Vec<(String, String)> {
    let url = reqwest::Url::parse(exchange["url"].as_str().unwrap()).unwrap();
    url.query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

fn param(exchange: &Value, name: &str) -> Option<String> {
    params(exchange)
        .into_iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
}

/// A JSON-valued query parameter, parsed.
fn json_param(exchange: &Value, name: &str) -> Value {
    param(exchange, name)
        .map(|v| serde_json::from_str(&v).unwrap_or_else(|e| panic!("{name}={v}: {e}")))
        .unwrap_or(Value::Null)
}

/// A recorded request's body, parsed.
fn body(exchange: &Value) -> Value {
    let text = exchange["body"]
        .as_str()
        .unwrap_or_else(|| panic!("no request body: {}", pretty(exchange)));
    serde_json::from_str(text).unwrap()
}

fn path_of(exchange: &Value) -> String {
    reqwest::Url::parse(exchange["url"].as_str().unwrap())
        .unwrap()
        .path()
        .to_string()
}

fn sha256_hex(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `acme/app` with its first five tags, as a client that adds `__typename`
/// to every selection set below the root (urql's cacheExchange, Apollo's
/// InMemoryCache) asks for it.
fn acme_app_five_tags() -> Value {
    let nodes: Vec<Value> = (0..5)
        .map(|i| json!({ "__typename": "Tag", "name": format!("t{i:02}") }))
        .collect();
    json!({
        "repository": {
            "__typename": "Repository",
            "name": "acme/app",
            "tags": { "__typename": "TagConnection", "nodes": nodes }
        }
    })
}

/// The whole-operation error codes of a GraphQL response.
fn codes(response: &Value) -> Vec<String> {
    response["errors"]
        .as_array()
        .map(|errors| {
            errors
                .iter()
                .map(|e| e["extensions"]["code"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// `extensions.fanout.operationReads` of one answer.
fn operation_reads(response: &Value) -> u64 {
    response["extensions"]["fanout"]["operationReads"]
        .as_u64()
        .unwrap_or_else(|| panic!("no extensions.fanout.operationReads in {response}"))
}

#[tokio::test]
async fn graphql_http_audits_find_no_warning_and_no_error() {
    let Some(node) = node() else { return };
    let served = Served::start().await;
    let report = run_script(&node, "audit.mjs", &served.base).await;
    let results = report["results"].as_array().expect("results");
    // graphql-http 1.23.1 has 60-odd server audits.
    assert!(results.len() >= 40, "only {} audits ran", results.len());
    let listing: Vec<String> = results
        .iter()
        .map(|r| {
            format!(
                "{:6} {} {}{}",
                r["status"].as_str().unwrap_or("?"),
                r["id"].as_str().unwrap_or("?"),
                r["name"].as_str().unwrap_or("?"),
                r["reason"]
                    .as_str()
                    .map(|reason| format!(" — {reason}"))
                    .unwrap_or_default()
            )
        })
        .collect();
    let failed: Vec<&Value> = results
        .iter()
        .filter(|r| !matches!(r["status"].as_str(), Some("ok" | "notice")))
        .collect();
    let exchanges: Vec<String> = failed
        .iter()
        .map(|r| {
            format!(
                "{} {}:\n{}",
                r["id"].as_str().unwrap_or("?"),
                r["name"].as_str().unwrap_or("?"),
                pretty(&r["exchanges"])
            )
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} audits warn or fail:\n{}\n\nall results:\n{}\n\nthe failing audits' exchanges:\n{}",
        failed.len(),
        failed
            .iter()
            .map(|r| r["id"].as_str().unwrap_or("?"))
            .collect::<Vec<_>>()
            .join(", "),
        listing.join("\n"),
        exchanges.join("\n\n")
    );
    println!("{}", listing.join("\n"));
}

#[tokio::test]
async fn urql_queries_over_get_with_its_defaults() {
    let Some(node) = node() else { return };
    let served = Served::start().await;
    let report = run_script(&node, "urql.mjs", &served.base).await;
    let runs = report["runs"].as_array().expect("runs");
    let run = |name: &str| -> &Value {
        runs.iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("no run {name}: {}", pretty(&report)))
    };

    // Its default: the query goes as a GET, everything in the URL.
    let default = run("default");
    let all = pretty(default);
    assert!(default["error"].is_null(), "urql reports errors: {all}");
    assert_eq!(default["data"], acme_app_five_tags(), "{all}");
    let exchanges = default["exchanges"].as_array().unwrap();
    assert_eq!(exchanges.len(), 1, "one HTTP request: {all}");
    let get = &exchanges[0];
    assert_eq!(get["method"], "GET", "{all}");
    assert_eq!(path_of(get), "/graphql", "{all}");
    assert!(get["body"].is_null(), "{all}");
    let query = param(get, "query").unwrap_or_else(|| panic!("no query= in the URL: {all}"));
    assert!(query.contains("query Repo($name: String!)"), "{query}");
    assert_eq!(
        param(get, "operationName").as_deref(),
        Some("Repo"),
        "{all}"
    );
    assert_eq!(
        json_param(get, "variables"),
        json!({ "name": "acme/app" }),
        "{all}"
    );
    // What urql sends: its Accept list, and no Content-Type on a GET.
    let accept = get["headers"]["accept"].as_str().unwrap_or("");
    assert!(
        accept.starts_with("application/graphql-response+json"),
        "{accept}"
    );
    assert!(get["headers"]["content-type"].is_null(), "{all}");
    let response = &get["response"];
    assert_eq!(response["status"], 200, "{all}");
    assert!(
        response["headers"]["content-type"]
            .as_str()
            .unwrap_or("")
            .starts_with("application/graphql-response+json"),
        "urql prefers application/graphql-response+json: {all}"
    );
    assert!(response["json"]["errors"].is_null(), "{all}");
    // One read: the tag list of acme/app.
    assert_eq!(operation_reads(&response["json"]), 1, "{all}");

    // The same operation as POST (urql's path for long queries and mutations).
    let post = run("post");
    let all = pretty(post);
    assert!(post["error"].is_null(), "urql reports errors: {all}");
    assert_eq!(post["data"], acme_app_five_tags(), "{all}");
    let exchanges = post["exchanges"].as_array().unwrap();
    assert_eq!(exchanges.len(), 1, "{all}");
    let sent = &exchanges[0];
    assert_eq!(sent["method"], "POST", "{all}");
    assert_eq!(sent["headers"]["content-type"], "application/json", "{all}");
    let sent_body = body(sent);
    assert_eq!(sent_body["operationName"], "Repo", "{all}");
    assert_eq!(
        sent_body["variables"],
        json!({ "name": "acme/app" }),
        "{all}"
    );
    assert_eq!(sent["response"]["status"], 200, "{all}");
    assert_eq!(operation_reads(&sent["response"]["json"]), 1, "{all}");

    assert_eq!(served.registry.counters().path("/v2/acme/app/tags/list"), 2);
}

/// The gateway's answer to the hash-only attempt of a persisted query it has
/// not seen: `PERSISTED_QUERY_NOT_FOUND`, no `data` key, 400 (the client
/// accepts application/graphql-response+json, so §9's status applies).
fn assert_not_found(exchange: &Value, all: &str) {
    let response = &exchange["response"];
    let json = &response["json"];
    assert_eq!(
        codes(json),
        ["PERSISTED_QUERY_NOT_FOUND"],
        "hash-only first attempt: {all}"
    );
    assert_eq!(
        json["errors"][0]["message"], "PersistedQueryNotFound",
        "{all}"
    );
    assert!(json.get("data").is_none(), "no data key: {all}");
    assert_eq!(
        response["status"], 400,
        "PERSISTED_QUERY_NOT_FOUND under application/graphql-response+json: {all}"
    );
}

/// The persisted-query sequence Apollo's link must have produced: hash-only
/// (over `first_method`) → PERSISTED_QUERY_NOT_FOUND → text + hash over POST
/// → the answer; then hash-only again (over `first_method`) → the answer.
fn assert_apq_sequence(scenario: &Value, first_method: &str, operation: &str, expected: &Value) {
    let all = pretty(scenario);
    let exchanges = scenario["exchanges"].as_array().unwrap();
    assert_eq!(
        exchanges.len(),
        3,
        "hash-only, retry with the text, hash-only: {all}"
    );
    // The operation as each request carried it (URL params for GET, body for POST).
    let sent = |e: &Value| -> Value {
        if e["method"] == "GET" {
            let mut op = json!({
                "operationName": param(e, "operationName"),
                "variables": json_param(e, "variables"),
                "extensions": json_param(e, "extensions"),
            });
            if let Some(q) = param(e, "query") {
                op["query"] = json!(q);
            }
            op
        } else {
            body(e)
        }
    };
    let (first, retry, hit) = (&exchanges[0], &exchanges[1], &exchanges[2]);

    assert_eq!(first["method"], first_method, "{all}");
    let first_op = sent(first);
    assert!(first_op.get("query").is_none(), "hash only: {all}");
    assert_eq!(first_op["operationName"], operation, "{all}");
    let hash = first_op["extensions"]["persistedQuery"]["sha256Hash"]
        .as_str()
        .unwrap_or_else(|| panic!("no persistedQuery hash: {all}"))
        .to_string();
    assert_eq!(
        first_op["extensions"]["persistedQuery"]["version"], 1,
        "{all}"
    );
    assert_not_found(first, &all);

    assert_eq!(retry["method"], "POST", "the link retries over POST: {all}");
    let retry_op = sent(retry);
    let text = retry_op["query"]
        .as_str()
        .unwrap_or_else(|| panic!("{all}"));
    assert_eq!(sha256_hex(text), hash, "{all}");
    assert_eq!(
        retry_op["extensions"]["persistedQuery"]["sha256Hash"], hash,
        "{all}"
    );
    assert_eq!(retry["response"]["status"], 200, "{all}");
    assert!(retry["response"]["json"]["errors"].is_null(), "{all}");
    assert_eq!(&retry["response"]["json"]["data"], expected, "{all}");

    assert_eq!(hit["method"], first_method, "{all}");
    let hit_op = sent(hit);
    assert!(hit_op.get("query").is_none(), "hash only: {all}");
    assert_eq!(
        hit_op["extensions"]["persistedQuery"]["sha256Hash"], hash,
        "{all}"
    );
    assert_eq!(hit["response"]["status"], 200, "{all}");
    assert!(hit["response"]["json"]["errors"].is_null(), "{all}");
    assert_eq!(&hit["response"]["json"]["data"], expected, "{all}");

    // What the application saw: the answer, twice, no error.
    let runs = scenario["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{all}");
    for run in runs {
        assert!(run[0]["error"].is_null(), "{all}");
        assert_eq!(&run[0]["data"], expected, "{all}");
    }
}

#[tokio::test]
async fn apollo_client_get_persisted_queries_and_batches() {
    let Some(node) = node() else { return };
    let served = Served::start().await;
    let report = run_script(&node, "apollo.mjs", &served.base).await;
    let scenario = |name: &str| -> &Value {
        let s = &report["scenarios"][name];
        assert!(s.is_object(), "no scenario {name}: {}", pretty(&report));
        s
    };

    // (a) HttpLink with useGETForQueries.
    let get = scenario("get");
    let all = pretty(get);
    let exchanges = get["exchanges"].as_array().unwrap();
    assert_eq!(exchanges.len(), 1, "{all}");
    let e = &exchanges[0];
    assert_eq!(e["method"], "GET", "{all}");
    assert!(param(e, "query")
        .unwrap_or_default()
        .contains("query Repo($name: String!)"));
    assert_eq!(json_param(e, "variables"), json!({ "name": "acme/app" }));
    assert_eq!(
        json_param(e, "extensions")["clientLibrary"]["name"],
        "@apollo/client",
        "{all}"
    );
    assert_eq!(e["response"]["status"], 200, "{all}");
    assert!(e["response"]["json"]["errors"].is_null(), "{all}");
    assert_eq!(e["response"]["json"]["data"], acme_app_five_tags(), "{all}");
    assert_eq!(operation_reads(&e["response"]["json"]), 1, "{all}");
    assert!(get["runs"][0][0]["error"].is_null(), "{all}");
    assert_eq!(get["runs"][0][0]["data"], acme_app_five_tags(), "{all}");

    // (b) Automatic persisted queries, over POST and with GET for hashed queries.
    let tag = |name: &str| {
        json!({
            "repository": {
                "__typename": "Repository",
                "name": "acme/app",
                "tag": { "__typename": "Tag", "name": name }
            }
        })
    };
    assert_apq_sequence(scenario("pq_post"), "POST", "PqPost", &tag("t01"));
    assert_apq_sequence(scenario("pq_get"), "GET", "PqGet", &tag("t02"));

    // (c) BatchHttpLink: three operations in one HTTP request.
    let batch = scenario("batch");
    let all = pretty(batch);
    let exchanges = batch["exchanges"].as_array().unwrap();
    assert_eq!(exchanges.len(), 1, "one HTTP request for the batch: {all}");
    let e = &exchanges[0];
    assert_eq!(e["method"], "POST", "{all}");
    let sent = body(e);
    let names: Vec<&str> = sent
        .as_array()
        .unwrap_or_else(|| panic!("a JSON array: {all}"))
        .iter()
        .map(|op| op["operationName"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(names, ["Deep1", "Deep2", "Multi"], "{all}");
    assert_eq!(e["response"]["status"], 200, "{all}");
    let answers = e["response"]["json"]
        .as_array()
        .unwrap_or_else(|| panic!("the batch's answer is an array: {all}"));
    assert_eq!(answers.len(), 3, "{all}");
    for answer in answers {
        assert!(answer["errors"].is_null(), "{all}");
    }
    let deep1 = &answers[0]["data"]["repository"]["tag"]["manifest"];
    let digest = deep1["digest"].as_str().unwrap_or_else(|| panic!("{all}"));
    assert!(digest.starts_with("sha256:"), "{all}");
    assert_eq!(
        deep1["config"],
        json!({ "__typename": "ImageConfig", "os": "linux", "architecture": "arm64" }),
        "{all}"
    );
    assert_eq!(
        answers[1]["data"],
        json!({
            "repository": {
                "__typename": "Repository",
                "name": "org/team/deep",
                "tags": {
                    "__typename": "TagConnection",
                    "nodes": [{
                        "__typename": "Tag",
                        "name": "v1",
                        "manifest": { "__typename": "Manifest", "digest": digest }
                    }]
                }
            }
        }),
        "{all}"
    );
    let platforms: Vec<Value> = answers[2]["data"]["repository"]["tag"]["manifest"]["manifests"]
        .as_array()
        .unwrap_or_else(|| panic!("{all}"))
        .iter()
        .map(|m| m["platform"].clone())
        .collect();
    assert_eq!(
        platforms,
        [
            json!({ "__typename": "Platform", "os": "linux", "architecture": "amd64", "variant": null }),
            json!({ "__typename": "Platform", "os": "linux", "architecture": "arm64", "variant": "v8" }),
        ],
        "{all}"
    );
    // The client handed each operation its own answer.
    for (i, run) in batch["runs"][0].as_array().unwrap().iter().enumerate() {
        assert!(run["error"].is_null(), "{all}");
        assert_eq!(run["data"], answers[i]["data"], "{all}");
    }
    // De-duplication across the batch: Deep1 reads deep's tag list, the v1
    // manifest and its config blob; Deep2 needs that tag list and manifest
    // again (shared, no read of its own); Multi reads its tag list and index.
    let reads: u64 = answers.iter().map(operation_reads).sum();
    assert_eq!(reads, 5, "1 + 1 + 1 for deep, 1 + 1 for multi: {all}");
    let used = answers
        .iter()
        .filter_map(|a| a["extensions"]["fanout"]["used"].as_u64())
        .max();
    assert_eq!(used, Some(5), "the batch's shared budget: {all}");
    let counters = served.registry.counters();
    for path in [
        "/v2/org/team/deep/tags/list",
        "/v2/org/team/deep/manifests/v1",
        "/v2/acme/multi/tags/list",
        "/v2/acme/multi/manifests/latest",
    ] {
        assert_eq!(counters.path(path), 1, "upstream reads of {path}");
    }
    assert_eq!(counters.matching("/v2/org/team/deep/blobs/"), 1);
    assert_eq!(counters.matching("/v2/acme/multi/blobs/"), 0);

    // (d) Persisted queries inside a batch: both hash-only → both not found →
    // both retried with their text in one batch → both hash-only again.
    let pq_batch = scenario("pq_batch");
    let all = pretty(pq_batch);
    let exchanges = pq_batch["exchanges"].as_array().unwrap();
    assert_eq!(exchanges.len(), 3, "{all}");
    for (i, e) in exchanges.iter().enumerate() {
        assert_eq!(e["method"], "POST", "{all}");
        let ops = body(e);
        let ops = ops.as_array().unwrap_or_else(|| panic!("{all}"));
        assert_eq!(ops.len(), 2, "{all}");
        for op in ops {
            assert_eq!(
                op.get("query").is_some(),
                i == 1,
                "text only in the retry: {all}"
            );
            assert!(op["extensions"]["persistedQuery"]["sha256Hash"].is_string());
        }
        let answers = e["response"]["json"]
            .as_array()
            .unwrap_or_else(|| panic!("{all}"));
        assert_eq!(answers.len(), 2, "{all}");
        for answer in answers {
            if i == 0 {
                assert_eq!(codes(answer), ["PERSISTED_QUERY_NOT_FOUND"], "{all}");
                assert!(answer.get("data").is_none(), "{all}");
            } else {
                assert!(answer["errors"].is_null(), "{all}");
            }
        }
    }
    for run in pq_batch["runs"].as_array().unwrap() {
        for (answer, repo) in run
            .as_array()
            .unwrap()
            .iter()
            .zip(["filler/r01", "filler/r02"])
        {
            assert!(answer["error"].is_null(), "{all}");
            assert_eq!(answer["data"]["repository"]["name"], repo, "{all}");
            assert_eq!(
                answer["data"]["repository"]["tag"]["name"], "latest",
                "{all}"
            );
        }
    }
}
