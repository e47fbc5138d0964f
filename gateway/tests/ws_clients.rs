//! Real GraphQL WebSocket clients against the gateway: graphql-ws's own
//! client, Apollo Client's `GraphQLWsLink` and urql's `subscriptionExchange`
//! (`tests/clients/subscriptions.mjs`, at the lockfile's versions), each
//! receiving `tagChanges`' digest and then a change pushed to the registry
//! while it waits, running a query over the socket, and getting the
//! internal burst for the internal token in `connectionParams` and the
//! public one for a forged token.
//!
//! Needs `node` (Debian package nodejs) and `npm ci --prefix gateway/tests/clients`;
//! without them the test prints `SKIPPED: …` and passes, unless
//! `FANOUT_REQUIRE_EXTERNAL=1`.
mod common;

use common::{require_binary, require_path, EmbeddedRegistry, Image};
use fanout_budget::Config;
use serde_json::{json, Value};
use std::future::IntoFuture;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

const TOKEN: &str = "s3cret-internal";
/// How long the script may run before it is killed.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(120);

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

/// A new image under `repository:tag`; its digest.
fn push(registry: &EmbeddedRegistry, reference: &str) -> String {
    let (repository, tag) = reference.rsplit_once(':').expect("repository:tag");
    registry.with_store(|s| {
        s.put_image(
            repository,
            Some(tag),
            &Image::demo("linux", "amd64", &format!("pushed {reference}")),
        )
        .0
    })
}

/// Runs the script against `base`: each `PUSH <repository>:<tag>` line it
/// prints pushes a new image there (its digest kept, by reference); the
/// rest of its output is its JSON document.
async fn run_script(
    node: &Path,
    base: &str,
    registry: &EmbeddedRegistry,
) -> (Value, Vec<(String, String)>) {
    let mut child = tokio::process::Command::new(node)
        .arg(clients_dir().join("subscriptions.mjs"))
        .arg(base)
        .arg(TOKEN)
        .current_dir(clients_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut stderr = child.stderr.take().unwrap();
    let (mut document, mut err, mut pushed) = (String::new(), Vec::new(), Vec::new());
    let finished = tokio::time::timeout(SCRIPT_TIMEOUT, async {
        let read_out = async {
            while let Some(line) = lines.next_line().await.unwrap() {
                match line.strip_prefix("PUSH ") {
                    Some(reference) => {
                        pushed.push((reference.to_string(), push(registry, reference)))
                    }
                    None => {
                        document.push_str(&line);
                        document.push('\n');
                    }
                }
            }
        };
        let (_, read_err, status) =
            tokio::join!(read_out, stderr.read_to_end(&mut err), child.wait());
        read_err.unwrap();
        status.unwrap()
    })
    .await;
    let stderr = String::from_utf8_lossy(&err);
    let status = finished.unwrap_or_else(|_| {
        panic!("subscriptions.mjs still running after {SCRIPT_TIMEOUT:?}; killed.\n{document}\n{stderr}")
    });
    assert!(
        status.success(),
        "subscriptions.mjs crashed ({status}):\n{stderr}\nstdout:\n{document}"
    );
    if !stderr.trim().is_empty() {
        eprintln!("subscriptions.mjs stderr:\n{stderr}");
    }
    let document = serde_json::from_str(&document).unwrap_or_else(|e| {
        panic!("subscriptions.mjs printed no JSON document ({e}):\n{document}")
    });
    (document, pushed)
}

/// `value` without the `__typename` fields Apollo's InMemoryCache adds to
/// every selection set.
fn plain(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| *k != "__typename")
                .map(|(k, v)| (k.clone(), plain(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[tokio::test]
async fn graphql_ws_apollo_and_urql_subscribe_query_and_carry_the_token() {
    let Some(node) = node() else { return };
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    let mut config = Config::default();
    config.subscriptions.poll_interval_ms = 1000;
    config.rate_limit.internal_token = TOKEN.into();
    let gateway = fanout_gateway::app::build(config.clone(), registry.url().parse().unwrap(), None);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let serve = fanout_budget::inbound::serve(listener, gateway.router.clone(), &config);
    let base = format!("http://{}", serve.local_addr().unwrap());
    let server = tokio::spawn(serve.into_future());
    let before: Vec<(String, String)> = ["t10", "t11", "t12"]
        .iter()
        .map(|tag| {
            let digest = registry.with_store(|s| s.repos["acme/app"].tags[*tag].clone());
            (tag.to_string(), digest)
        })
        .collect();

    let (report, pushed) = run_script(&node, &base, &registry).await;
    server.abort();
    println!("{report:#}");

    let mut failures = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            failures.push(what);
        }
    };
    for (i, client) in ["graphql-ws", "apollo", "urql"].into_iter().enumerate() {
        let r = &report["clients"][client];
        let (tag, digest_before) = &before[i];
        let reference = format!("acme/app:{tag}");
        check(
            r["error"].is_null(),
            format!("{client}: ran: {}", r["error"]),
        );
        check(
            r["protocols"]
                .as_array()
                .is_some_and(|p| !p.is_empty() && p.iter().all(|p| p == "graphql-transport-ws")),
            format!(
                "{client}: every socket speaks graphql-transport-ws: {}",
                r["protocols"]
            ),
        );
        // (1) The digest at once, then the pushed one.
        check(
            plain(&r["first"]["data"]["tagChanges"])
                == json!({ "repository": "acme/app", "tag": tag, "digest": digest_before,
                           "mediaType": "application/vnd.oci.image.manifest.v1+json" }),
            format!(
                "{client}: the first event is {reference}'s digest: {}",
                r["first"]
            ),
        );
        check(
            r["first"]["extensions"]["fanout"]["limit"] == 100,
            format!(
                "{client}: the first event's extensions.fanout: {}",
                r["first"]
            ),
        );
        let new = pushed.iter().find(|(p, _)| *p == reference).map(|(_, d)| d);
        check(
            new.is_some(),
            format!("{client}: asked for a push of {reference}"),
        );
        check(
            new.is_some_and(|new| r["changed"]["data"]["tagChanges"]["digest"] == *new),
            format!(
                "{client}: the next event is the pushed digest {new:?}: {}",
                r["changed"]
            ),
        );
        check(
            r["changed"]["errors"].is_null(),
            format!("{client}: no errors in the change: {}", r["changed"]),
        );
        // (2) A query over the socket.
        check(
            plain(&r["query"]["data"])
                == json!({ "repository": { "name": "acme/app", "tag": { "name": "t01" } } }),
            format!("{client}: the query's data over the socket: {}", r["query"]),
        );
        check(
            r["query"]["extensions"]["fanout"]["operationReads"].as_u64() >= Some(1)
                && r["query"]["extensions"]["fanout"]["limit"] == 100,
            format!("{client}: the query's extensions.fanout: {}", r["query"]),
        );
        // (3) The token in connectionParams.
        check(
            r["internal"]["extensions"]["fanout"]["limit"] == 1000,
            format!("{client}: the internal token's burst: {}", r["internal"]),
        );
        check(
            r["forged"]["extensions"]["fanout"]["limit"] == 100
                && r["forged"]["data"] == r["query"]["data"],
            format!(
                "{client}: a forged token gets the public burst: {}",
                r["forged"]
            ),
        );
    }
    assert!(
        failures.is_empty(),
        "{} checks failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
