//! GraphiQL in a real browser, offline: Debian's Chromium, driven by
//! playwright-core (`tests/browser/graphiql.mjs`), opens the page the gateway
//! serves on a loopback port, runs a query with the execute button and reads
//! the answer, then runs a `tagChanges` subscription (over a WebSocket to the
//! same endpoint) and reads its first event and the one a change pushed to the
//! registry makes, with every request that is not for loopback aborted. Skipped
//! (`SKIPPED: …`) without chromium, node or the browser project's
//! `node_modules`; under `FANOUT_REQUIRE_EXTERNAL=1` each of those fails.
mod common;

use common::{Fixture, Image};
use fanout_budget::Config;
use serde_json::Value;
use std::future::IntoFuture;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

/// The whole browser run (the script bounds itself at 90 s).
const BOUND: Duration = Duration::from_secs(120);
const QUERY: &str = "{ repositories(first: 5) { nodes { name } } }";
const SUBSCRIPTION: &str =
    r#"subscription { tagChanges(repository: "acme/app", tag: "t07") { tag digest } }"#;
/// The fixture's catalog, first page of 5 (gateway/src/embedded/store.rs).
const FIRST_FIVE: [&str; 5] = [
    "acme/app",
    "acme/multi",
    "filler/r00",
    "filler/r01",
    "filler/r02",
];

/// Chromium, node and the browser project, or `None` after a `SKIPPED:` line.
fn tools() -> Option<(PathBuf, PathBuf, PathBuf)> {
    let debian = Path::new("/usr/bin/chromium");
    let chromium = if debian.is_file() {
        debian.to_path_buf()
    } else {
        fanout_testkit::require_binary("chromium", "chromium")?
    };
    let node = fanout_testkit::require_binary("node", "nodejs")?;
    let project = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    fanout_testkit::require_path(
        &project.join("node_modules/playwright-core"),
        "gateway/tests/browser/node_modules",
        "npm ci --prefix gateway/tests/browser",
    )
    .then_some((chromium, node, project))
}

/// SIGKILL to a process group this test started (node and its Chromium), on drop.
struct Group(u32);

impl Drop for Group {
    fn drop(&mut self) {
        let group = format!("-{}", self.0);
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &group])
            .stderr(Stdio::null())
            .status();
    }
}

/// The `src` and `href` values of `html`.
fn references(html: &str) -> Vec<&str> {
    ["src=\"", "href=\""]
        .iter()
        .flat_map(|attr| html.split(attr).skip(1))
        .filter_map(|rest| rest.split('"').next())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graphiql_runs_a_query_and_a_subscription_in_chromium_offline() {
    let Some((chromium, node, project)) = tools() else {
        return;
    };
    let mut config = Config::default();
    config.subscriptions.poll_interval_ms = 1000;
    let fixture = Fixture::new(config).await;
    let before = fixture
        .registry
        .with_store(|s| s.repos["acme/app"].tags["t07"].clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let serve = fanout_budget::inbound::serve(
        listener,
        fixture.gateway.router.clone(),
        fixture.gateway.engine.config(),
    );
    let server = tokio::spawn(serve.into_future());
    let _stop = AbortOnDrop(&server);

    // The page as a browser asks for it: nothing from elsewhere, no inline script.
    let client = reqwest::Client::new();
    let page = client
        .get(format!("{base}/graphql"))
        .header("accept", "text/html,application/xhtml+xml,*/*;q=0.8")
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let csp = page.headers()["content-security-policy"].to_str().unwrap();
    let directives: Vec<&str> = csp.split(';').map(str::trim).collect();
    for directive in [
        "default-src 'none'",
        "script-src 'self'",
        "connect-src 'self'",
    ] {
        assert!(directives.contains(&directive), "{directive} not in {csp}");
    }
    let html = page.text().await.unwrap();
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "{html}"
    );
    assert!(html.matches("<script").count() >= 4, "{html}");
    assert_eq!(
        html.matches("<script").count(),
        html.matches("<script src=\"/graphql/graphiql/").count(),
        "a script that is not a file under /graphql/graphiql/: {html}"
    );
    for url in references(&html)
        .into_iter()
        .filter(|u| !u.starts_with("data:"))
    {
        let asset = client.get(format!("{base}{url}")).send().await.unwrap();
        assert_eq!(asset.status(), 200, "{url}");
    }
    assert_eq!(fixture.reads(), 0);

    let mut child = tokio::process::Command::new(node)
        .arg(project.join("graphiql.mjs"))
        .arg(&base)
        .arg(QUERY)
        .arg(SUBSCRIPTION)
        .env("CHROMIUM", &chromium)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let _group = Group(child.id().unwrap());
    // Its lines as they come: at `PUSH <digest>` (the subscription's first
    // event is in the pane) a new image goes under the tag.
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut stderr = child.stderr.take().unwrap();
    let (mut out, mut err, mut pushed) = (String::new(), Vec::new(), None);
    let status = tokio::time::timeout(BOUND, async {
        let read_out = async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if line.starts_with("PUSH ") {
                    pushed = Some(fixture.registry.with_store(|s| {
                        s.put_image(
                            "acme/app",
                            Some("t07"),
                            &Image::demo("linux", "amd64", "new"),
                        )
                        .0
                    }));
                }
                out.push_str(&line);
                out.push('\n');
            }
        };
        let (_, read_err, status) =
            tokio::join!(read_out, stderr.read_to_end(&mut err), child.wait());
        read_err.unwrap();
        status.unwrap()
    })
    .await
    .unwrap_or_else(|_| panic!("the browser run took over {BOUND:?}"));
    let err = String::from_utf8_lossy(&err);
    let report: Value = out
        .lines()
        .last()
        .and_then(|line| serde_json::from_str(line).ok())
        .unwrap_or_else(|| panic!("no JSON from graphiql.mjs ({status}):\n{out}\n{err}"));
    assert!(
        status.success(),
        "graphiql.mjs failed ({status}): {report:#}\n{err}"
    );
    println!(
        "graphiql.mjs: {} loopback requests; the answer: {} bytes",
        report["requests"].as_array().map_or(0, Vec::len),
        report["result"].as_str().map_or(0, str::len),
    );
    for key in ["blocked", "cspViolations", "consoleErrors"] {
        assert_eq!(report[key], serde_json::json!([]), "{key}: {report:#}");
    }
    let result: Value = serde_json::from_str(report["result"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("the result pane is not JSON ({e}): {report:#}"));
    let names: Vec<&str> = result["data"]["repositories"]["nodes"]
        .as_array()
        .unwrap_or_else(|| panic!("no repositories in {result:#}"))
        .iter()
        .map(|node| node["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, FIRST_FIVE, "{result:#}");
    assert!(fixture.reads() > 0, "the embedded registry was not read");
    // GraphiQL opened on the gateway's example, and its docs show the
    // schema's descriptions.
    assert_eq!(
        report["initialQuery"].as_str(),
        Some(fanout_gateway::app::GRAPHIQL_QUERY),
        "{report:#}"
    );
    let docs = report["docs"].as_str().unwrap_or_default();
    assert!(
        docs.contains(
            "One repository. Null, without error, when the registry answers NAME_UNKNOWN."
        ),
        "the query type's page without its descriptions: {docs}"
    );

    // The subscription's events as the result pane showed them: the tag's
    // digest, then the one pushed while the page waited.
    let events: Vec<Value> = report["events"]
        .as_array()
        .unwrap_or_else(|| panic!("no events: {report:#}"))
        .iter()
        .map(|text| serde_json::from_str(text.as_str().unwrap()).unwrap())
        .collect();
    let digests: Vec<&Value> = events
        .iter()
        .map(|event| &event["data"]["tagChanges"]["digest"])
        .collect();
    let pushed = pushed.expect("the page showed the first event");
    assert_eq!(
        digests,
        [&Value::from(before), &Value::from(pushed)],
        "{events:#?}"
    );
    assert_eq!(
        report["websockets"],
        serde_json::json!([format!("{}/graphql", base.replace("http://", "ws://"))]),
        "the subscription went over one WebSocket to the endpoint: {report:#}"
    );
}

/// Aborts the server task when the test ends, however it ends.
struct AbortOnDrop<'a, T>(&'a tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<'_, T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The query GraphiQL opens on answers, from the embedded registry, within
/// the budget.
#[tokio::test]
async fn the_graphiql_example_runs() {
    let fixture = Fixture::new(Config::default()).await;
    let answer = fixture.query(fanout_gateway::app::GRAPHIQL_QUERY).await;
    assert!(answer.get("errors").is_none(), "{answer:#}");
    let repositories = answer["data"]["repositories"]["nodes"].as_array().unwrap();
    assert_eq!(repositories.len(), 3, "{answer:#}");
    assert!(
        answer["data"]["fanoutBudget"]["used"].as_u64().unwrap() > 0,
        "{answer:#}"
    );
}
