//! GraphiQL in a real browser, offline: Debian's Chromium, driven by
//! playwright-core (`tests/browser/graphiql.mjs`), opens the page the gateway
//! serves on a loopback port, runs a query with the execute button and reads
//! the answer, with every request that is not for loopback aborted. Skipped
//! (`SKIPPED: …`) without chromium, node or the browser project's
//! `node_modules`; under `FANOUT_REQUIRE_EXTERNAL=1` each of those fails.
mod common;

use common::Fixture;
use serde_json::Value;
use std::future::IntoFuture;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// The whole browser run (the script bounds itself at 90 s).
const BOUND: Duration = Duration::from_secs(120);
const QUERY: &str = "{ repositories(first: 5) { nodes { name } } }";
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
async fn graphiql_runs_a_query_in_chromium_offline() {
    let Some((chromium, node, project)) = tools() else {
        return;
    };
    let fixture = Fixture::default().await;
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

    let child = tokio::process::Command::new(node)
        .arg(project.join("graphiql.mjs"))
        .arg(&base)
        .arg(QUERY)
        .env("CHROMIUM", &chromium)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let _group = Group(child.id().unwrap());
    let output = tokio::time::timeout(BOUND, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("the browser run took over {BOUND:?}"))
        .unwrap();
    let (status, out) = (output.status, String::from_utf8_lossy(&output.stdout));
    let err = String::from_utf8_lossy(&output.stderr);
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
}

/// Aborts the server task when the test ends, however it ends.
struct AbortOnDrop<'a, T>(&'a tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<'_, T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
