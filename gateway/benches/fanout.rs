//! Fan-out figures, over loopback against the embedded
//! registry, the gateway with the engine vs the engine-off baseline:
//!
//! - upstream reads for N artifacts (N = 1, 10, 50) — `repository(name) {
//!   tag(name) { manifest { digest } } }` once per artifact — in one operation
//!   (N aliases) and in a batch (N operations), vs the naive 2N;
//! - the wall time of a 20-row page with 3 hung rows: the engine cuts each
//!   hung read at `read_timeout`; without it the request deadline is the only
//!   bound.
//!
//! `cargo bench --bench fanout` (or `cargo bench -p fanout-gateway --bench fanout`).

mod common;

use common::*;
use fanout_budget::Config;
use fanout_gateway::app;
use fanout_gateway::embedded::Fault;
use std::time::Duration;

const LATENCY: Duration = Duration::from_millis(1);
const READ_TIMEOUT_MS: u64 = 500;
const DEADLINE_MS: u64 = 3_000;
const HUNG: [usize; 3] = [3, 9, 15];
const RUNS: usize = 5;

fn artifact(i: usize) -> String {
    format!(r#"repository(name: "{REPO}") {{ tag(name: "t{i:02}") {{ manifest {{ digest }} }} }}"#)
}

/// N aliases in one operation.
fn one_operation(n: usize) -> String {
    let fields: Vec<String> = (0..n).map(|i| format!("a{i}: {}", artifact(i))).collect();
    single(&format!("{{ {} }}", fields.join(" ")))
}

/// N operations in one batch.
fn one_batch(n: usize) -> String {
    let queries: Vec<String> = (0..n).map(|i| format!("{{ {} }}", artifact(i))).collect();
    batch(&queries)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let registry = registry(Some(LATENCY)).await;
    let upstream: reqwest::Url = registry.url().parse().expect("a URL");
    let mut config = Config::default();
    config.rate_limit.requests_per_minute = u32::MAX;
    config.http.max_batch_operations = 50;
    config.budget.read_timeout_ms = READ_TIMEOUT_MS;
    config.budget.deadline_ms = DEADLINE_MS;
    let gateway = app::build(config.clone(), upstream.clone(), None);
    let (on, on_task) = serve(gateway.router).await;
    let (off, off_task) = serve(baseline_router(upstream, config.budget.deadline())).await;
    let client = reqwest::Client::new();

    println!("## fanout summary");
    println!();
    println!("machine: {}; registry latency {LATENCY:?}", machine());
    println!();
    println!("| N artifacts | shape | naive 2N | engine off: reads | engine on: reads | on / naive | engine off: wall (median of {RUNS}) | engine on: wall | on / off wall |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for n in [1usize, 10, 50] {
        for (shape, body) in [("one operation", one_operation(n)), ("batch", one_batch(n))] {
            let mut reads = [0u64; 2];
            let mut walls = [Vec::new(), Vec::new()];
            for run in 0..RUNS {
                for (side, url) in [&off, &on].into_iter().enumerate() {
                    registry.counters().reset();
                    let (status, text, took) = post(&client, url, &body).await;
                    assert_eq!(status, 200, "{text}");
                    assert!(!text.contains("\"errors\""), "{text}");
                    assert_eq!(text.matches("sha256:").count(), n, "{text}");
                    let seen = registry.counters().requests();
                    if run == 0 {
                        reads[side] = seen;
                    } else {
                        assert_eq!(seen, reads[side], "reads are deterministic");
                    }
                    walls[side].push(ms(took));
                }
            }
            let [off_wall, on_wall] = walls.map(|mut w| median(&mut w));
            println!(
                "| {n} | {shape} | {} | {} | {} | {:.2}× | {off_wall:.2} ms | {on_wall:.2} ms | {:.2}× |",
                2 * n,
                reads[0],
                reads[1],
                reads[1] as f64 / (2 * n) as f64,
                on_wall / off_wall,
            );
        }
    }

    // A 20-row page, 3 rows hung.
    for i in HUNG {
        registry.set_tag_fault(REPO, &format!("t{i:02}"), Some(Fault::Hang));
    }
    let page = single(&format!(
        r#"{{ repository(name: "{REPO}") {{ tags(first: 20) {{ nodes {{ name manifest {{ digest }} }} }} }} }}"#
    ));
    println!();
    println!(
        "20-row page, rows {HUNG:?} hung; read_timeout_ms = {READ_TIMEOUT_MS}, deadline_ms = {DEADLINE_MS}"
    );
    println!();
    println!(
        "| side | runs | wall (median) | min | max | HTTP | rows with a manifest | error codes |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut medians = Vec::new();
    for (name, url, runs) in [("engine on", &on, RUNS), ("engine off", &off, 3)] {
        let mut walls = Vec::new();
        let mut last = (0, serde_json::Value::Null);
        for _ in 0..runs {
            let (status, text, took) = post(&client, url, &page).await;
            walls.push(ms(took));
            last = (status, serde_json::from_str(&text).unwrap_or_default());
        }
        let (status, body) = last;
        let rows = body["data"]["repository"]["tags"]["nodes"]
            .as_array()
            .map_or(0, |nodes| {
                nodes
                    .iter()
                    .filter(|n| n["manifest"]["digest"].is_string())
                    .count()
            });
        let mut codes: Vec<String> = body["errors"]
            .as_array()
            .map(|errors| {
                errors
                    .iter()
                    .map(|e| {
                        e["extensions"]["code"]
                            .as_str()
                            .or(e["message"].as_str())
                            .unwrap_or("?")
                            .to_string()
                    })
                    .collect()
            })
            .unwrap_or_default();
        codes.sort();
        let (min, max) = walls
            .iter()
            .fold((f64::MAX, 0f64), |(lo, hi), w| (lo.min(*w), hi.max(*w)));
        let wall = median(&mut walls);
        medians.push(wall);
        println!(
            "| {name} | {runs} | {wall:.1} ms | {min:.1} ms | {max:.1} ms | {status} | {rows} of 20 | {} |",
            if codes.is_empty() { "—".to_string() } else { codes.join(", ") }
        );
    }
    let bound = (READ_TIMEOUT_MS + 50) as f64;
    println!();
    println!(
        "ratio engine on / engine off wall time: {:.3}×",
        medians[0] / medians[1]
    );
    println!(
        "target: 20-row page with 3 hung rows ≤ read_timeout + 50 ms ({bound:.0} ms): {:.1} ms — {}",
        medians[0],
        if medians[0] <= bound { "met" } else { "MISSED" }
    );
    on_task.abort();
    off_task.abort();
}
