//! The gateway binary, as `cargo run --release` starts it: the embedded
//! registry, a batched query over real HTTP, the side endpoints, config
//! errors that name the key, and a clean stop on SIGTERM.
mod common;

use serde_json::json;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Gateway(Child);

impl Gateway {
    /// Sends SIGTERM.
    fn terminate(&self) {
        let pid = self.0.id().to_string();
        assert!(Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success());
    }

    /// Waits (at most 5 s) for the process to exit.
    async fn wait_exit(&mut self) -> std::process::ExitStatus {
        for _ in 0..500 {
            if let Some(status) = self.0.try_wait().unwrap() {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the gateway did not exit within 5 s");
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(args: &[&str]) -> (Gateway, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fanout-gateway"))
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = common::loopback::listening_address(&mut child);
    (Gateway(child), addr)
}

#[tokio::test]
async fn serves_a_batched_query_and_stops_on_sigterm() {
    let (mut gateway, addr) = start(&[]);
    let client = reqwest::Client::new();
    let batch = json!([
        { "query": r#"{ repository(name: "library/alpine") { tags(first: 2) { nodes { name manifest { digest } } } } }"# },
        { "query": r#"{ repository(name: "library/alpine") { tag(name: "1.0") { manifest { digest config { os } } } } fanoutBudget { limit used remaining } }"# }
    ]);
    let response = client
        .post(format!("http://{addr}/graphql"))
        .json(&batch)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: serde_json::Value = response.json().await.unwrap();
    let ops = body.as_array().unwrap();
    assert_eq!(ops.len(), 2);
    assert_eq!(
        ops[0]["data"]["repository"]["tags"]["nodes"][0]["name"],
        "1.0"
    );
    assert_eq!(
        ops[1]["data"]["repository"]["tag"]["manifest"]["config"]["os"],
        "linux"
    );
    assert_eq!(
        ops[0]["data"]["repository"]["tags"]["nodes"][0]["manifest"]["digest"],
        ops[1]["data"]["repository"]["tag"]["manifest"]["digest"]
    );
    for op in ops {
        let fanout = &op["extensions"]["fanout"];
        assert_eq!(fanout["limit"], 100);
        for key in ["used", "remaining", "operationReads", "requested"] {
            assert!(fanout[key].is_u64(), "{key} in {fanout}");
        }
    }
    // The tag list, shared across the batch; the first operation wants only
    // digests: a HEAD of each of its 2 manifests (no pull on a registry that
    // meters them); the second a manifest's body (a GET) and its config blob.
    let total: u64 = fanout_testkit::operation_reads(ops);
    assert_eq!(total, 5);

    let health = client
        .get(format!("http://{addr}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(health.text().await.unwrap(), "ok");
    let text = |path: &'static str| {
        let request = client.get(format!("http://{addr}{path}")).send();
        async move { request.await.unwrap().text().await.unwrap() }
    };
    let metrics = text("/metrics").await;
    for name in [
        "fanout_upstream_reads_total",
        "fanout_upstream_in_flight",
        "fanout_upstream_read_seconds",
        "fanout_dedup_hits_total",
        "fanout_requests_total",
        "fanout_parsed_documents_total{source=\"parser\"}",
        "fanout_document_cache_bytes",
    ] {
        assert!(
            metrics.contains(name),
            "{name} missing from /metrics:\n{metrics}"
        );
    }
    // The histograms of what the one request cost: its reads, each
    // operation's, and what its pricing left unspent.
    let sample = |series: &str| -> f64 {
        let line = metrics
            .lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .unwrap_or_else(|| panic!("{series} missing from /metrics:\n{metrics}"));
        line.rsplit_once(' ').unwrap().1.parse().unwrap()
    };
    assert_eq!(sample("fanout_request_reads_sum"), 5.0);
    assert_eq!(sample("fanout_request_reads_count"), 1.0);
    assert_eq!(sample("fanout_request_seconds_count"), 1.0);
    assert_eq!(sample("fanout_operation_reads_sum{type=\"query\"}"), 5.0);
    assert_eq!(sample("fanout_operation_reads_count{type=\"query\"}"), 2.0);
    let requested: u64 = ops
        .iter()
        .map(|op| op["extensions"]["fanout"]["requested"].as_u64().unwrap())
        .sum();
    assert_eq!(
        sample("fanout_operation_delta_sum{type=\"query\"}"),
        requested as f64 - 5.0
    );
    // A browser (it accepts text/html) asking for no query gets GraphiQL.
    let page = client
        .get(format!("http://{addr}/graphql"))
        .header("accept", "text/html,application/xhtml+xml,*/*;q=0.8")
        .send();
    let graphiql = page.await.unwrap().text().await.unwrap();
    assert!(graphiql.to_lowercase().contains("graphiql"));

    gateway.terminate();
    let status = gateway.wait_exit().await;
    assert!(status.success(), "exit status {status:?}");
}

#[test]
fn a_bad_config_stops_start_up_naming_the_key() {
    let dir = std::env::temp_dir().join(format!("fanout-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (text, key) in [
        ("[budget]\nmax_reads = \"many\"\n", "budget.max_reads"),
        ("[budget]\nmax_raeds = 3\n", "max_raeds"),
        (
            "[http]\nmax_batch_operations = 0\n",
            "http.max_batch_operations",
        ),
        (
            "[redis]\nfailure_mode = \"sideways\"\n",
            "redis.failure_mode",
        ),
        ("[http]\ncsrf_get = \"sideways\"\n", "http.csrf_get"),
        (
            "[redis]\ncluster_nodes = [\"10.0.0.1:6379\"]\n",
            "redis.cluster_nodes",
        ),
        ("[hosts.\"nohost\"]\nmax_concurrent = 1\n", "nohost"),
    ] {
        let path = dir.join("bad.toml");
        std::fs::write(&path, text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_fanout-gateway"))
            .args(["--listen", "127.0.0.1:0", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{text:?} was accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(key), "{text:?}: {stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_requests_and_refuses_new_ones() {
    let registry = fanout_gateway::embedded::EmbeddedRegistry::demo()
        .await
        .unwrap();
    registry.set_latency(Some(Duration::from_millis(1500)));
    let upstream = registry.url();
    let (mut gateway, addr) = start(&["--upstream", &upstream]);
    let in_flight = {
        let addr = addr.clone();
        tokio::spawn(async move {
            let response = reqwest::Client::new()
                .post(format!("http://{addr}/graphql"))
                .json(&json!({ "query": r#"{ repository(name: "library/redis") { name } }"# }))
                .send()
                .await
                .unwrap();
            (
                response.status(),
                response.json::<serde_json::Value>().await.unwrap(),
            )
        })
    };
    for _ in 0..200 {
        if registry.counters().in_flight() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        registry.counters().in_flight(),
        1,
        "the request never reached the registry"
    );
    gateway.terminate();
    // New connections are refused once the signal is handled.
    let mut refused = false;
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(&addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(refused, "new connections were still accepted after SIGTERM");
    // The in-flight request still gets its full answer.
    let (status, body) = in_flight.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(body["data"]["repository"]["name"], "library/redis");
    assert!(gateway.wait_exit().await.success());
}

/// The `sh` samples of README.md and the book, as a reader pastes them:
/// each command that talks to the gateway (`curl … localhost:8080 …`) run
/// by `sh` against the binary started here, and each must succeed with an
/// answer — JSON without `errors` from `/graphql`, `fanout_` metrics from
/// `/metrics`. The other lines are `cargo run --release` / `cargo test`
/// (what CI itself runs).
#[test]
fn the_docs_shell_samples_run_against_the_binary() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = vec![root.join("README.md")];
    let mut chapters: Vec<_> = std::fs::read_dir(root.join("book/src"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    chapters.sort();
    files.extend(chapters);
    let (_gateway, addr) = start(&[]);
    let mut ran = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for block in text.split("```sh\n").skip(1) {
            let block = block.split("```").next().unwrap();
            // One command per line, `\`-continued lines and an open quote
            // joined (the batch sample spans lines inside its quotes).
            let mut commands: Vec<String> = Vec::new();
            let mut current = String::new();
            for line in block.lines() {
                current.push_str(line);
                current.push('\n');
                let open = current.matches('\'').count() % 2 == 1;
                if !open && !line.ends_with('\\') {
                    commands.push(std::mem::take(&mut current));
                }
            }
            for command in commands.iter().filter(|c| c.contains("localhost:8080")) {
                let command = command.replace("localhost:8080", &addr);
                let out = Command::new("sh").args(["-c", &command]).output().unwrap();
                let stdout = String::from_utf8_lossy(&out.stdout);
                assert!(
                    out.status.success() && !stdout.trim().is_empty(),
                    "{}: `{command}` failed: {stdout}",
                    file.display()
                );
                if command.contains("/graphql") {
                    let answer: serde_json::Value = serde_json::from_str(&stdout)
                        .unwrap_or_else(|e| panic!("`{command}`: not JSON ({e}): {stdout}"));
                    let answers = answer.as_array().cloned().unwrap_or_else(|| vec![answer]);
                    for answer in answers {
                        assert!(answer.get("errors").is_none(), "`{command}`: {answer:#}");
                        assert!(answer.get("data").is_some(), "`{command}`: {answer:#}");
                    }
                }
                if command.contains("/metrics") {
                    assert!(stdout.contains("fanout_"), "`{command}`: {stdout}");
                }
                ran += 1;
            }
        }
    }
    assert!(ran >= 5, "only {ran} shell samples found");
}
