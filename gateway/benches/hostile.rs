//! Hostile query shapes: wall time and peak memory of one request, for the
//! gateway (engine on, `FanoutGraphQL`) and for stock async-graphql 7.2 on
//! the same schema (`schema.execute`, no extension, no engine: no shape
//! reads the registry, so nothing of the engine would run on that side).
//!
//! Each (shape, side) runs in a child process of its own — this binary run
//! again with `HOSTILE_CASE` set — under a 6 GiB address-space limit and a
//! 20 s wall-clock limit, so a shape that pins a core, overflows a stack or
//! exhausts memory ends only its child. The parent samples the child's peak
//! resident memory (`VmHWM`) while it runs.
//!
//! `cargo bench -p fanout-gateway --bench hostile` (BENCHMARKS.md § 6).

mod common;

use async_graphql::Request;
use fanout_budget::Config;
use fanout_gateway::embedded::EmbeddedRegistry;
use fanout_gateway::oci::RegistryUrl;
use fanout_gateway::{app, schema};
use fanout_testkit::doubling_chain;
use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(20);
const ADDRESS_SPACE_KIB: u64 = 6 << 20;

/// (name, query)
fn shapes() -> Vec<(&'static str, String)> {
    let same_key: String = (0..5000).map(|_| "__typename ").collect();
    let aliases: String = (0..3000).map(|i| format!("a{i}: __typename ")).collect();
    vec![
        (
            "self-cycle, 37 bytes",
            "{...A} fragment A on Query{...A ...A}".into(),
        ),
        ("doubling chain, 2^20", doubling_chain(20, "__typename")),
        ("doubling chain, 2^24", doubling_chain(24, "__typename")),
        ("doubling chain, 2^26", doubling_chain(26, "__typename")),
        ("3,000 aliases", format!("{{ {aliases}}}")),
        ("5,000 copies of one field", format!("{{ {same_key}}}")),
        (
            "70 levels of nesting",
            format!(
                "{}__typename{}",
                "{ fanoutBudget { ".repeat(70),
                " }".repeat(71)
            ),
        ),
    ]
}

/// Runs one case in this process and prints `elapsed_ms peak_rss_kib code`
/// (the peak includes the embedded registry and the runtime, a few MiB).
fn child(case: usize, side: &str) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let registry = EmbeddedRegistry::fixture().await.unwrap();
        let url: reqwest::Url = registry.url().parse().unwrap();
        let query = shapes().swap_remove(case).1;
        let started = Instant::now();
        let answer: Value = match side {
            "engine" => {
                let gateway = app::build(Config::default(), url, None);
                fanout_testkit::post(&gateway.router, common::single(&query), &[])
                    .await
                    .json()
            }
            _ => {
                let stock = schema::builder().data(RegistryUrl(url)).finish();
                serde_json::to_value(stock.execute(Request::new(query)).await).unwrap()
            }
        };
        let elapsed = started.elapsed();
        let code = answer["errors"][0]["extensions"]["code"]
            .as_str()
            .or_else(|| answer["errors"][0]["message"].as_str())
            .unwrap_or("answered");
        let code: String = code.lines().next().unwrap_or("").chars().take(40).collect();
        let peak = peak_kib(std::process::id()).unwrap_or(0);
        println!("{:.1} {peak} {code}", elapsed.as_secs_f64() * 1e3);
    });
}

fn peak_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Runs one case in a child; (what it printed or how it ended, peak RSS MiB).
fn run(case: usize, side: &str) -> (String, f64) {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {ADDRESS_SPACE_KIB}; exec \"$0\""))
        .arg(exe)
        .env("HOSTILE_CASE", case.to_string())
        .env("HOSTILE_SIDE", side)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let mut peak = 0u64;
    let status = loop {
        if let Some(kib) = peak_kib(child.id()) {
            peak = peak.max(kib);
        }
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        use std::io::Read;
        let _ = stdout.read_to_string(&mut out);
    }
    let outcome = match status {
        None => format!("> {} s, killed", LIMIT.as_secs()),
        Some(s) if s.success() => {
            let mut parts = out.trim().splitn(3, ' ');
            let ms = parts.next().unwrap_or("?");
            let own: u64 = parts.next().and_then(|k| k.parse().ok()).unwrap_or(0);
            peak = peak.max(own);
            format!("{ms} ms, {}", parts.next().unwrap_or(""))
        }
        Some(s) => {
            use std::os::unix::process::ExitStatusExt;
            match s.signal() {
                Some(sig) => format!(
                    "crashed (signal {sig}) after {:.1} s",
                    started.elapsed().as_secs_f64()
                ),
                None => format!(
                    "exited {} after {:.1} s",
                    s.code().unwrap_or(-1),
                    started.elapsed().as_secs_f64()
                ),
            }
        }
    };
    (outcome, peak as f64 / 1024.0)
}

fn main() {
    if let (Ok(case), Ok(side)) = (std::env::var("HOSTILE_CASE"), std::env::var("HOSTILE_SIDE")) {
        child(case.parse().unwrap(), &side);
        return;
    }
    let only = std::env::var("HOSTILE_ONLY").ok();
    println!(
        "| shape | bytes | fanout-budget gateway | peak RSS | stock async-graphql 7.2 | peak RSS |"
    );
    println!("|---|---:|---|---:|---|---:|");
    for (case, (name, query)) in shapes().iter().enumerate() {
        if only.as_deref().is_some_and(|o| !name.contains(o)) {
            continue;
        }
        let (engine, engine_mib) = run(case, "engine");
        let (stock, stock_mib) = run(case, "stock");
        println!(
            "| {name} | {} | {engine} | {engine_mib:.0} MiB | {stock} | {stock_mib:.0} MiB |",
            query.len()
        );
    }
}
