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
use fanout_testkit::sha256_hex;
use serde_json::{json, Value};
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
        let serve = fanout_budget::inbound::serve(listener, gateway.router, &config);
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

/// Every failed check of one test, reported together at its end: against a
/// gateway that is still being built, one run shows everything that is
/// missing, each with the exchange that showed it.
#[derive(Default)]
struct Checks {
    passed: usize,
    failures: Vec<String>,
}

impl Checks {
    /// Records `what` as failed (with `context`) unless `ok`.
    fn check(
        &mut self,
        ok: bool,
        what: impl std::fmt::Display,
        context: impl FnOnce() -> String,
    ) -> bool {
        if ok {
            self.passed += 1;
        } else {
            self.failures
                .push(format!("{what}\n{}", indent(&context())));
        }
        ok
    }

    /// Records `what` as failed unless `got == want`.
    fn eq(
        &mut self,
        got: &Value,
        want: &Value,
        what: impl std::fmt::Display,
        context: impl FnOnce() -> String,
    ) -> bool {
        let ok = got == want;
        self.check(ok, what, || {
            format!(
                "expected: {}\n     got: {}\n{}",
                compact(want, 600),
                compact(got, 600),
                context()
            )
        })
    }

    /// Panics listing every failure, if any.
    fn finish(self, test: &str) {
        if !self.failures.is_empty() {
            panic!(
                "{test}: {} checks failed, {} passed:\n\n{}",
                self.failures.len(),
                self.passed,
                self.failures
                    .iter()
                    .enumerate()
                    .map(|(i, f)| format!("{}. {f}", i + 1))
                    .collect::<Vec<_>>()
                    .join("\n\n")
            );
        }
        println!("{test}: all {} checks passed", self.passed);
    }
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `value` as one line of JSON, cut after `max` characters.
fn compact(value: &Value, max: usize) -> String {
    cut(&value.to_string(), max)
}

fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        let kept: String = text.chars().take(max).collect();
        format!("{kept}… ({} characters)", text.chars().count())
    }
}

/// One recorded exchange, readably: the request (URL parameters decoded) and
/// the answer.
fn show(exchange: &Value) -> String {
    if exchange.is_null() {
        return "(no such exchange)".into();
    }
    let url = exchange["url"].as_str().unwrap_or("?");
    let path = reqwest::Url::parse(url)
        .map(|u| u.path().to_string())
        .unwrap_or_else(|_| url.to_string());
    let mut out = format!("→ {} {path}", exchange["method"].as_str().unwrap_or("?"));
    for (name, value) in params(exchange) {
        out.push_str(&format!("\n    {name}={}", cut(&value, 400)));
    }
    for (name, value) in exchange["headers"].as_object().into_iter().flatten() {
        out.push_str(&format!("\n  {name}: {}", value.as_str().unwrap_or("")));
    }
    if let Some(body) = exchange["body"].as_str() {
        out.push_str(&format!("\n  body: {}", cut(body, 800)));
    }
    let response = &exchange["response"];
    if let Some(error) = response["error"].as_str() {
        out.push_str(&format!("\n← failed: {}", cut(error, 400)));
    } else {
        out.push_str(&format!(
            "\n← {} {}\n  {}",
            response["status"],
            response["headers"]["content-type"]
                .as_str()
                .unwrap_or("(no content-type)"),
            cut(response["body"].as_str().unwrap_or(""), 1200)
        ));
    }
    out
}

fn show_all(exchanges: &Value) -> String {
    match exchanges.as_array() {
        Some(list) if !list.is_empty() => list.iter().map(show).collect::<Vec<_>>().join("\n"),
        _ => "(no exchanges)".into(),
    }
}

/// The query parameters of a recorded request's URL.
fn params(exchange: &Value) -> Vec<(String, String)> {
    exchange["url"]
        .as_str()
        .and_then(|u| reqwest::Url::parse(u).ok())
        .map(|url| {
            url.query_pairs()
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect()
        })
        .unwrap_or_default()
}

fn param(exchange: &Value, name: &str) -> Option<String> {
    params(exchange)
        .into_iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
}

/// A JSON-valued query parameter, parsed (`Null` when absent or not JSON).
fn json_param(exchange: &Value, name: &str) -> Value {
    param(exchange, name)
        .and_then(|v| serde_json::from_str(&v).ok())
        .unwrap_or(Value::Null)
}

/// A recorded request's body, parsed (`Null` when none or not JSON).
fn body(exchange: &Value) -> Value {
    exchange["body"]
        .as_str()
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or(Value::Null)
}

/// The operation a recorded request carried: its URL parameters for a GET,
/// its body for a POST.
fn operation(exchange: &Value) -> Value {
    if exchange["method"] == "GET" {
        let mut op = json!({
            "operationName": param(exchange, "operationName"),
            "variables": json_param(exchange, "variables"),
            "extensions": json_param(exchange, "extensions"),
        });
        if let Some(query) = param(exchange, "query") {
            op["query"] = json!(query);
        }
        op
    } else {
        body(exchange)
    }
}

fn path_of(exchange: &Value) -> String {
    exchange["url"]
        .as_str()
        .and_then(|u| reqwest::Url::parse(u).ok())
        .map(|u| u.path().to_string())
        .unwrap_or_default()
}

fn content_type(exchange: &Value) -> &str {
    exchange["response"]["headers"]["content-type"]
        .as_str()
        .unwrap_or("")
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

/// The error codes of a GraphQL response, in order.
fn codes(response: &Value) -> Value {
    Value::Array(
        response["errors"]
            .as_array()
            .map(|errors| {
                errors
                    .iter()
                    .map(|e| e["extensions"]["code"].clone())
                    .collect()
            })
            .unwrap_or_default(),
    )
}

#[tokio::test]
async fn graphql_http_audits_find_no_warning_and_no_error() {
    let Some(node) = node() else { return };
    let served = Served::start().await;
    let report = run_script(&node, "audit.mjs", &served.base).await;
    let mut checks = Checks::default();
    let empty = Vec::new();
    let results = report["results"].as_array().unwrap_or(&empty);
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
    // graphql-http 1.23.1 has 60-odd server audits.
    checks.check(results.len() >= 40, "the audits ran", || {
        format!("only {} results: {}", results.len(), compact(&report, 2000))
    });
    let bad: Vec<&Value> = results
        .iter()
        .filter(|r| !matches!(r["status"].as_str(), Some("ok" | "notice")))
        .collect();
    for r in &bad {
        checks.check(
            false,
            format!(
                "audit {} {} {}: {}",
                r["id"].as_str().unwrap_or("?"),
                r["status"].as_str().unwrap_or("?"),
                r["name"].as_str().unwrap_or("?"),
                r["reason"].as_str().unwrap_or("")
            ),
            || show_all(&r["exchanges"]),
        );
    }
    checks.check(bad.is_empty(), "no audit warns or fails", || {
        format!("all results:\n{}", listing.join("\n"))
    });
    // Where §9 asks more than graphql-http's MAYs and its status-only checks.
    let audit = |id: &str| -> &Value {
        results
            .iter()
            .find(|r| r["id"] == id)
            .unwrap_or(&Value::Null)
    };
    let get = audit("5A70");
    let answer: Value = get["exchanges"][0]["response"]["body"]
        .as_str()
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or(Value::Null);
    checks.eq(
        &json!([&answer["data"], &answer["errors"]]),
        &json!([{ "__typename": "Query" }, null]),
        "5A70: GET ?query={ __typename } without Accept runs the query (JSON, not GraphiQL)",
        || show_all(&get["exchanges"]),
    );
    for id in ["D6D5", "6A70"] {
        let r = audit(id);
        checks.eq(
            &r["status"],
            &json!("ok"),
            format!(
                "{id}: §9 runs GET with variables={{…}} — {}",
                r["name"].as_str().unwrap_or("")
            ),
            || show_all(&r["exchanges"]),
        );
    }
    let mutation = audit("9C48");
    checks.eq(
        &mutation["exchanges"][0]["response"]["status"],
        &json!(405),
        "9C48: §9 a mutation over GET is 405",
        || show_all(&mutation["exchanges"]),
    );
    println!("{}", listing.join("\n"));
    checks.finish("graphql-http audits");
}

#[tokio::test]
async fn urql_queries_over_get_with_its_defaults() {
    let Some(node) = node() else { return };
    let served = Served::start().await;
    let report = run_script(&node, "urql.mjs", &served.base).await;
    let mut checks = Checks::default();
    let run = |name: &str| -> Value {
        report["runs"]
            .as_array()
            .and_then(|runs| runs.iter().find(|r| r["name"] == name))
            .cloned()
            .unwrap_or(Value::Null)
    };

    // Its default: the query goes as a GET, everything in the URL.
    let default = run("default");
    let exchanges = &default["exchanges"];
    let ctx = || show_all(exchanges);
    let get = &exchanges[0];
    checks.eq(
        &json!(exchanges.as_array().map(Vec::len)),
        &json!(1),
        "urql GET: one HTTP request",
        ctx,
    );
    checks.eq(&get["method"], &json!("GET"), "urql GET: the method", ctx);
    checks.eq(
        &json!(path_of(get)),
        &json!("/graphql"),
        "urql GET: the path",
        ctx,
    );
    checks.check(get["body"].is_null(), "urql GET: no body", ctx);
    let query = param(get, "query").unwrap_or_default();
    checks.check(
        query.contains("query Repo($name: String!)"),
        "urql GET: the document in query=",
        ctx,
    );
    checks.eq(
        &json!(param(get, "operationName")),
        &json!("Repo"),
        "urql GET: operationName=",
        ctx,
    );
    checks.eq(
        &json_param(get, "variables"),
        &json!({ "name": "acme/app" }),
        "urql GET: variables= (JSON)",
        ctx,
    );
    // What urql sends: its Accept list, and no Content-Type on a GET.
    checks.eq(
        &get["headers"]["accept"],
        &json!("application/graphql-response+json, application/graphql+json, application/json, text/event-stream, multipart/mixed"),
        "urql GET: its Accept header",
        ctx,
    );
    checks.check(
        get["headers"]["content-type"].is_null(),
        "urql GET: no Content-Type",
        ctx,
    );
    let response = &get["response"];
    checks.eq(&response["status"], &json!(200), "urql GET: 200", ctx);
    checks.check(
        content_type(get).starts_with("application/graphql-response+json"),
        "urql GET: answered as application/graphql-response+json, its first choice",
        ctx,
    );
    checks.check(
        response["json"]["errors"].is_null(),
        "urql GET: no GraphQL errors in the answer",
        ctx,
    );
    checks.eq(
        &response["json"]["extensions"]["fanout"]["operationReads"],
        &json!(1),
        "urql GET: extensions.fanout.operationReads (acme/app's tag list)",
        ctx,
    );
    checks.check(
        default["error"].is_null(),
        "urql GET: the client reports no error",
        || compact(&default["error"], 1500),
    );
    checks.eq(
        &default["data"],
        &acme_app_five_tags(),
        "urql GET: the data the client returns",
        ctx,
    );

    // The same operation as POST (urql's path for long queries and mutations).
    let post = run("post");
    let exchanges = &post["exchanges"];
    let ctx = || show_all(exchanges);
    let sent = &exchanges[0];
    checks.eq(
        &json!(exchanges.as_array().map(Vec::len)),
        &json!(1),
        "urql POST: one HTTP request",
        ctx,
    );
    checks.eq(
        &sent["method"],
        &json!("POST"),
        "urql POST: the method",
        ctx,
    );
    checks.eq(
        &sent["headers"]["content-type"],
        &json!("application/json"),
        "urql POST: its Content-Type",
        ctx,
    );
    let sent_body = body(sent);
    checks.eq(
        &sent_body["operationName"],
        &json!("Repo"),
        "urql POST: operationName",
        ctx,
    );
    checks.eq(
        &sent_body["variables"],
        &json!({ "name": "acme/app" }),
        "urql POST: variables",
        ctx,
    );
    checks.eq(
        &sent["response"]["status"],
        &json!(200),
        "urql POST: 200",
        ctx,
    );
    checks.eq(
        &sent["response"]["json"]["extensions"]["fanout"]["operationReads"],
        &json!(1),
        "urql POST: extensions.fanout.operationReads",
        ctx,
    );
    checks.check(
        post["error"].is_null(),
        "urql POST: the client reports no error",
        || compact(&post["error"], 1500),
    );
    checks.eq(
        &post["data"],
        &acme_app_five_tags(),
        "urql POST: the data the client returns",
        ctx,
    );
    checks.finish("urql");
}

/// The persisted-query sequence Apollo's link must have produced: hash-only
/// (over `first_method`) → PERSISTED_QUERY_NOT_FOUND → text + hash over POST
/// → the answer; then hash-only again (over `first_method`) → the answer.
fn check_apq_sequence(
    checks: &mut Checks,
    label: &str,
    scenario: &Value,
    first_method: &str,
    operation_name: &str,
    expected: &Value,
) {
    let exchanges = &scenario["exchanges"];
    let ctx = || show_all(exchanges);
    checks.eq(
        &json!(exchanges.as_array().map(Vec::len)),
        &json!(3),
        format!("{label}: three requests (hash-only, retry with the text, hash-only)"),
        ctx,
    );
    let (first, retry, hit) = (&exchanges[0], &exchanges[1], &exchanges[2]);

    let c = || show(first);
    // 1. Hash only, not found.
    let op = operation(first);
    checks.eq(
        &first["method"],
        &json!(first_method),
        format!("{label} 1st: method"),
        c,
    );
    checks.check(
        op.get("query").is_none(),
        format!("{label} 1st: hash only, no query"),
        c,
    );
    checks.eq(
        &op["operationName"],
        &json!(operation_name),
        format!("{label} 1st: operationName"),
        c,
    );
    checks.eq(
        &op["extensions"]["persistedQuery"]["version"],
        &json!(1),
        format!("{label} 1st: extensions.persistedQuery.version"),
        c,
    );
    let hash = op["extensions"]["persistedQuery"]["sha256Hash"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let answer = &first["response"]["json"];
    checks.eq(
        &codes(answer),
        &json!(["PERSISTED_QUERY_NOT_FOUND"]),
        format!("{label} 1st: answered PERSISTED_QUERY_NOT_FOUND"),
        c,
    );
    checks.eq(
        &answer["errors"][0]["message"],
        &json!("PersistedQueryNotFound"),
        format!("{label} 1st: the message Apollo matches"),
        c,
    );
    checks.check(
        answer.is_object() && answer.get("data").is_none(),
        format!("{label} 1st: no data key"),
        c,
    );
    checks.check(
        content_type(first).starts_with("application/graphql-response+json"),
        format!(
            "{label} 1st: answered as application/graphql-response+json (Apollo's first choice)"
        ),
        c,
    );
    checks.eq(
        &first["response"]["status"],
        &json!(400),
        format!("{label} 1st: 400 (§9, under application/graphql-response+json)"),
        c,
    );

    let c = || show(retry);
    // 2. The retry: the text and the hash, over POST.
    let op = operation(retry);
    checks.eq(
        &retry["method"],
        &json!("POST"),
        format!("{label} retry: over POST"),
        c,
    );
    let text = op["query"].as_str().unwrap_or("");
    checks.check(
        !text.is_empty(),
        format!("{label} retry: carries the query"),
        c,
    );
    checks.eq(
        &json!(sha256_hex(text)),
        &json!(hash),
        format!("{label} retry: the hash is the text's sha256"),
        c,
    );
    checks.eq(
        &op["extensions"]["persistedQuery"]["sha256Hash"],
        &json!(hash),
        format!("{label} retry: carries the hash"),
        c,
    );
    checks.eq(
        &retry["response"]["status"],
        &json!(200),
        format!("{label} retry: 200"),
        c,
    );
    checks.check(
        retry["response"]["json"]["errors"].is_null(),
        format!("{label} retry: no errors"),
        c,
    );
    checks.eq(
        &retry["response"]["json"]["data"],
        expected,
        format!("{label} retry: the data"),
        c,
    );

    let c = || show(hit);
    // 3. Hash only again: found.
    let op = operation(hit);
    checks.eq(
        &hit["method"],
        &json!(first_method),
        format!("{label} 2nd run: method"),
        c,
    );
    checks.check(
        hit.is_object() && op.get("query").is_none(),
        format!("{label} 2nd run: hash only, no query"),
        c,
    );
    checks.eq(
        &op["extensions"]["persistedQuery"]["sha256Hash"],
        &json!(hash),
        format!("{label} 2nd run: the same hash"),
        c,
    );
    checks.eq(
        &hit["response"]["status"],
        &json!(200),
        format!("{label} 2nd run: 200"),
        c,
    );
    checks.check(
        hit["response"]["json"]["errors"].is_null(),
        format!("{label} 2nd run: no errors"),
        c,
    );
    checks.eq(
        &hit["response"]["json"]["data"],
        expected,
        format!("{label} 2nd run: the data"),
        c,
    );

    // What the application saw: the answer, twice, no error.
    for i in 0..2 {
        let answer = &scenario["runs"][i][0];
        checks.check(
            answer["error"].is_null(),
            format!("{label}: run {} reports no error to the application", i + 1),
            || compact(&answer["error"], 1500),
        );
        checks.eq(
            &answer["data"],
            expected,
            format!("{label}: run {} data", i + 1),
            ctx,
        );
    }
}

#[tokio::test]
async fn apollo_client_get_persisted_queries_and_batches() {
    let Some(node) = node() else { return };
    let served = Served::start().await;
    let report = run_script(&node, "apollo.mjs", &served.base).await;
    let mut checks = Checks::default();
    let scenarios = &report["scenarios"];

    // (a) HttpLink with useGETForQueries.
    let get = &scenarios["get"];
    let exchanges = &get["exchanges"];
    let ctx = || show_all(exchanges);
    // (one exchange expected: the whole list is that exchange)
    let e = &exchanges[0];
    checks.eq(
        &json!(exchanges.as_array().map(Vec::len)),
        &json!(1),
        "(a) GET: one request",
        ctx,
    );
    checks.eq(&e["method"], &json!("GET"), "(a) GET: the method", ctx);
    checks.check(
        param(e, "query")
            .unwrap_or_default()
            .contains("query Repo($name: String!)"),
        "(a) GET: the document in query=",
        ctx,
    );
    checks.eq(
        &json_param(e, "variables"),
        &json!({ "name": "acme/app" }),
        "(a) GET: variables=",
        ctx,
    );
    checks.eq(
        &json_param(e, "extensions")["clientLibrary"]["name"],
        &json!("@apollo/client"),
        "(a) GET: Apollo's extensions= (clientLibrary)",
        ctx,
    );
    checks.eq(
        &e["headers"]["content-type"],
        &json!("application/json"),
        "(a) GET: Apollo sends Content-Type: application/json on a GET",
        ctx,
    );
    checks.eq(&e["response"]["status"], &json!(200), "(a) GET: 200", ctx);
    checks.check(
        content_type(e).starts_with("application/graphql-response+json"),
        "(a) GET: answered as application/graphql-response+json",
        ctx,
    );
    checks.check(
        e["response"]["json"]["errors"].is_null(),
        "(a) GET: no errors",
        ctx,
    );
    checks.eq(
        &e["response"]["json"]["data"],
        &acme_app_five_tags(),
        "(a) GET: the data",
        ctx,
    );
    checks.eq(
        &e["response"]["json"]["extensions"]["fanout"]["operationReads"],
        &json!(1),
        "(a) GET: extensions.fanout.operationReads",
        ctx,
    );
    let answer = &get["runs"][0][0];
    checks.check(
        answer["error"].is_null(),
        "(a) GET: the client reports no error",
        || compact(&answer["error"], 1500),
    );
    checks.eq(
        &answer["data"],
        &acme_app_five_tags(),
        "(a) GET: the data the client returns",
        ctx,
    );

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
    check_apq_sequence(
        &mut checks,
        "(b) APQ over POST",
        &scenarios["pq_post"],
        "POST",
        "PqPost",
        &tag("t01"),
    );
    check_apq_sequence(
        &mut checks,
        "(b) APQ with useGETForHashedQueries",
        &scenarios["pq_get"],
        "GET",
        "PqGet",
        &tag("t02"),
    );

    // (c) BatchHttpLink: three operations in one HTTP request.
    let batch = &scenarios["batch"];
    let exchanges = &batch["exchanges"];
    let ctx = || show_all(exchanges);
    let e = &exchanges[0];
    checks.eq(
        &json!(exchanges.as_array().map(Vec::len)),
        &json!(1),
        "(c) batch: one HTTP request",
        ctx,
    );
    checks.eq(&e["method"], &json!("POST"), "(c) batch: POST", ctx);
    let names: Vec<Value> = body(e)
        .as_array()
        .map(|ops| ops.iter().map(|op| op["operationName"].clone()).collect())
        .unwrap_or_default();
    checks.eq(
        &json!(names),
        &json!(["Deep1", "Deep2", "Multi"]),
        "(c) batch: the body is an array of the three operations",
        ctx,
    );
    checks.eq(&e["response"]["status"], &json!(200), "(c) batch: 200", ctx);
    let answers = &e["response"]["json"];
    checks.eq(
        &json!(answers.as_array().map(Vec::len)),
        &json!(3),
        "(c) batch: an array of three answers",
        ctx,
    );
    for i in 0..3 {
        checks.check(
            answers[i]["errors"].is_null(),
            format!("(c) batch: answer {i} has no errors"),
            ctx,
        );
    }
    let deep1 = &answers[0]["data"]["repository"]["tag"]["manifest"];
    let digest = deep1["digest"].as_str().unwrap_or("");
    checks.check(
        digest.starts_with("sha256:"),
        "(c) batch: Deep1's manifest digest",
        ctx,
    );
    checks.eq(
        &deep1["config"],
        &json!({ "__typename": "ImageConfig", "os": "linux", "architecture": "arm64" }),
        "(c) batch: Deep1's config",
        ctx,
    );
    checks.eq(
        &answers[1]["data"],
        &json!({
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
        "(c) batch: Deep2, with Deep1's digest",
        ctx,
    );
    let multi = &answers[2]["data"]["repository"]["tag"]["manifest"];
    let platforms: Vec<Value> = multi["manifests"]
        .as_array()
        .map(|list| list.iter().map(|m| m["platform"].clone()).collect())
        .unwrap_or_default();
    checks.eq(
        &json!(platforms),
        &json!([
            { "__typename": "Platform", "os": "linux", "architecture": "amd64", "variant": null },
            { "__typename": "Platform", "os": "linux", "architecture": "arm64", "variant": "v8" },
        ]),
        "(c) batch: Multi's platforms",
        ctx,
    );
    // The client handed each operation its own answer.
    for i in 0..3 {
        let run = &batch["runs"][0][i];
        checks.check(
            run["error"].is_null(),
            format!("(c) batch: the client reports no error for operation {i}"),
            || compact(&run["error"], 1500),
        );
        checks.eq(
            &run["data"],
            &answers[i]["data"],
            format!("(c) batch: the client returns answer {i} for operation {i}"),
            ctx,
        );
    }
    // De-duplication across the batch: Deep1 reads deep's tag list, the v1
    // manifest and its config blob; Deep2 needs that tag list again (shared,
    // no read of its own) and only the v1 manifest's digest: a HEAD of its
    // own (no pull on a registry that meters them), not the GET Deep1 sends;
    // Multi reads its tag list and index.
    let reads: Option<u64> = (0..3)
        .map(|i| answers[i]["extensions"]["fanout"]["operationReads"].as_u64())
        .sum();
    checks.eq(
        &json!(reads),
        &json!(6),
        "(c) batch: the operations' operationReads add up to 1 + 1 + 1 (deep) + 1 (deep's HEAD) + 1 + 1 (multi)",
        ctx,
    );
    let used = (0..3)
        .filter_map(|i| answers[i]["extensions"]["fanout"]["used"].as_u64())
        .max();
    checks.eq(
        &json!(used),
        &json!(6),
        "(c) batch: the shared budget's used, when the last operation finished",
        ctx,
    );
    let counters = served.registry.counters();
    for (path, reads) in [
        ("/v2/org/team/deep/tags/list", 1),
        // Deep1's GET and Deep2's HEAD.
        ("/v2/org/team/deep/manifests/v1", 2),
        ("/v2/acme/multi/tags/list", 1),
        ("/v2/acme/multi/manifests/latest", 1),
    ] {
        checks.eq(
            &json!(counters.path(path)),
            &json!(reads),
            format!("(c) batch: upstream reads of {path}"),
            ctx,
        );
    }

    checks.eq(
        &json!(counters.matching("/v2/org/team/deep/blobs/")),
        &json!(1),
        "(c) batch: upstream reads of deep's config blob",
        ctx,
    );

    // (d) Persisted queries inside a batch: both hash-only → both not found →
    // both retried with their text in one batch → both hash-only again, found.
    let pq_batch = &scenarios["pq_batch"];
    let exchanges = &pq_batch["exchanges"];
    let ctx = || show_all(exchanges);
    checks.eq(
        &json!(exchanges.as_array().map(Vec::len)),
        &json!(3),
        "(d) APQ in a batch: three batched requests",
        ctx,
    );
    for (i, step) in ["hash-only", "retry", "2nd run"].iter().enumerate() {
        let e = &exchanges[i];
        checks.eq(
            &e["method"],
            &json!("POST"),
            format!("(d) {step}: POST"),
            ctx,
        );
        let ops = body(e);
        checks.eq(
            &json!(ops.as_array().map(Vec::len)),
            &json!(2),
            format!("(d) {step}: two operations"),
            ctx,
        );
        for op in ops.as_array().into_iter().flatten() {
            checks.eq(
                &json!(op.get("query").is_some()),
                &json!(i == 1),
                format!("(d) {step}: the text only in the retry"),
                ctx,
            );
            checks.check(
                op["extensions"]["persistedQuery"]["sha256Hash"].is_string(),
                format!("(d) {step}: the hash"),
                ctx,
            );
        }
        let answers = &e["response"]["json"];
        checks.eq(
            &json!(answers.as_array().map(Vec::len)),
            &json!(2),
            format!("(d) {step}: an array of two answers"),
            ctx,
        );
        for answer in answers.as_array().into_iter().flatten() {
            if i == 0 {
                checks.eq(
                    &codes(answer),
                    &json!(["PERSISTED_QUERY_NOT_FOUND"]),
                    format!("(d) {step}: PERSISTED_QUERY_NOT_FOUND"),
                    ctx,
                );
                checks.check(
                    answer.get("data").is_none(),
                    format!("(d) {step}: no data key"),
                    ctx,
                );
            } else {
                checks.check(
                    answer["errors"].is_null(),
                    format!("(d) {step}: no errors"),
                    ctx,
                );
            }
        }
    }
    for run in 0..2 {
        for (i, repo) in ["filler/r01", "filler/r02"].iter().enumerate() {
            let answer = &pq_batch["runs"][run][i];
            checks.check(
                answer["error"].is_null(),
                format!(
                    "(d) run {}: the client reports no error for {repo}",
                    run + 1
                ),
                || compact(&answer["error"], 1500),
            );
            checks.eq(
                &answer["data"]["repository"],
                &json!({
                    "__typename": "Repository",
                    "name": repo,
                    "tag": { "__typename": "Tag", "name": "latest" }
                }),
                format!("(d) run {}: the data for {repo}", run + 1),
                ctx,
            );
        }
    }
    checks.finish("Apollo Client");
}
