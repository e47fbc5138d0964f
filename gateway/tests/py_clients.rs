//! Python's `gql` against the gateway, as a user writes it: the websockets
//! transport with its defaults (`tests/py_clients/gql_subscribe.py`, at the
//! versions pinned in `tests/py_clients/requirements.txt`), running a query
//! over the socket, receiving `tagChanges`' digest and then a change pushed
//! to the registry while it waits.
//!
//! gql offers `graphql-ws` first and `graphql-transport-ws` second, and reads
//! the answer's `Sec-WebSocket-Protocol` by its exact spelling, which it
//! never finds (hyper writes header names in lower case): it then speaks
//! `graphql-ws` whatever was chosen. The gateway chooses the client's first
//! choice, so the two agree.
//!
//! Needs the virtual environment `tests/py_clients/.venv` (`.ci/run` makes
//! it); without it the test prints `SKIPPED: …` and passes, unless
//! `FANOUT_REQUIRE_EXTERNAL=1`.
mod common;

use common::{require_path, EmbeddedRegistry, Image};
use fanout_budget::Config;
use serde_json::Value;
use std::future::IntoFuture;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

/// How long the script may run before it is killed.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(120);

fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py_clients")
}

/// The virtual environment's Python, or `None` (with a `SKIPPED:` line).
fn python() -> Option<PathBuf> {
    let python = clients_dir().join(".venv/bin/python");
    require_path(
        &python,
        "gateway/tests/py_clients/.venv (Python's gql)",
        "python3 -m venv gateway/tests/py_clients/.venv && \
         gateway/tests/py_clients/.venv/bin/pip install -r gateway/tests/py_clients/requirements.txt",
    )
    .then_some(python)
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

/// Runs the script against `url` for `repository:tag`: a `PUSH` line it
/// prints pushes a new image there (its digest returned); the rest of its
/// output is its JSON document.
async fn run_script(
    python: &Path,
    url: &str,
    registry: &EmbeddedRegistry,
    repository: &str,
    tag: &str,
) -> (Value, Option<String>) {
    let mut child = tokio::process::Command::new(python)
        .arg(clients_dir().join("gql_subscribe.py"))
        .args([url, repository, tag])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut stderr = child.stderr.take().unwrap();
    let (mut document, mut err, mut pushed) = (String::new(), Vec::new(), None);
    let finished = tokio::time::timeout(SCRIPT_TIMEOUT, async {
        let read_out = async {
            while let Some(line) = lines.next_line().await.unwrap() {
                match line.strip_prefix("PUSH ") {
                    Some(reference) => pushed = Some(push(registry, reference)),
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
        panic!("gql_subscribe.py still running after {SCRIPT_TIMEOUT:?}; killed.\n{document}\n{stderr}")
    });
    assert!(
        status.success(),
        "gql_subscribe.py failed ({status}):\n{stderr}\nstdout:\n{document}"
    );
    let document = serde_json::from_str(&document).unwrap_or_else(|e| {
        panic!("gql_subscribe.py printed no JSON document ({e}):\n{document}\n{stderr}")
    });
    (document, pushed)
}

#[tokio::test]
async fn python_gql_with_its_defaults_subscribes_and_queries() {
    let Some(python) = python() else { return };
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    let mut config = Config::default();
    config.subscriptions.poll_interval_ms = 1000;
    let gateway = fanout_gateway::app::build(config.clone(), registry.url().parse().unwrap(), None);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let serve = fanout_budget::inbound::serve(listener, gateway.router.clone(), &config);
    let url = format!("ws://{}/graphql", serve.local_addr().unwrap());
    let server = tokio::spawn(serve.into_future());
    let before = registry.with_store(|s| s.repos["acme/app"].tags["t10"].clone());

    let (report, pushed) = run_script(&python, &url, &registry, "acme/app", "t10").await;
    server.abort();
    println!("{report:#}");

    // The client's first choice, and gql speaking it.
    let negotiated = &report["subprotocol"];
    assert_eq!(negotiated["websocket"], "graphql-ws", "{negotiated}");
    assert_eq!(negotiated["gql"], "graphql-ws", "{negotiated}");
    // The query over the socket.
    assert_eq!(
        report["query"]["fanoutBudget"]["limit"], 100,
        "{}",
        report["query"]
    );
    // The digest at once, then the pushed one, each with the connection's
    // budget.
    let events = report["events"].as_array().expect("events");
    assert_eq!(events.len(), 2, "{report}");
    let first = &events[0]["data"]["tagChanges"];
    assert_eq!(first["repository"], "acme/app", "{first}");
    assert_eq!(first["tag"], "t10", "{first}");
    assert_eq!(first["digest"], before.as_str(), "{first}");
    let pushed = pushed.expect("the script asked for a push after the first event");
    assert_ne!(pushed, before);
    assert_eq!(
        events[1]["data"]["tagChanges"]["digest"],
        pushed.as_str(),
        "{}",
        events[1]
    );
    for event in events {
        assert_eq!(
            event["extensions"]["fanout"]["limit"], 100,
            "the connection's burst: {event}"
        );
    }
}
