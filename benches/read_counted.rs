//! A read's instructions, counted (not timed): `benches/count.sh` runs
//! this binary under callgrind with `N` reads and with none, and prints
//! the difference over `N` — repeatable for a binary whatever else the
//! machine does, as this VM's clocks are not.
//!
//! `read_counted MODE N`, one current-thread task over the in-memory
//! transport (answering at once), each read's making included:
//! - `hit`: `N` reads of one URL declared immutable, warmed (the engine's
//!   cache answers each; after the first, a request's repeat hits on an
//!   entry, as `read_path`'s `engine_cache_hit` times them);
//! - `hit-new`: `N` entries kept by another request, then each read once
//!   by a request of its own making — a request's first hit on each entry
//!   (its own copy of the answer made and counted, its map grown); counted
//!   against `warm-new` (the same entries kept, not read again);
//! - `keep`: `N` immutable reads of URLs of their own (a miss, read and
//!   kept);
//! - `miss`: `N` plain reads of URLs of their own (read, not kept);
//! - `get`: the floor beside a hit — a bare moka `get` of a `String` key,
//!   the key copied and dropped as a read's URL is;
//! - `get-beside`: the same, in a process where the engine ran its warm
//!   read first.
//!
//! Without arguments (as `cargo bench` runs it), it says how to use it.

use fanout_budget::config::HostConfig;
use fanout_budget::{inbound::Caller, Config, Engine, Read};
use fanout_testkit::MemTransport;
use std::hint::black_box;
use std::sync::Arc;

const HOST: &str = "bench.invalid";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mode, n) = match &args[..] {
        [mode, n] if n.parse::<usize>().is_ok() => (mode.as_str(), n.parse().unwrap()),
        _ => {
            println!(
                "read_counted MODE N (hit, hit-new, warm-new, keep, miss, get, get-beside): run by benches/count.sh"
            );
            return;
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let mut config = Config::default();
    config.budget.max_reads = u64::try_from(n).unwrap_or(u64::MAX).saturating_add(1);
    config.upstream.cache_bytes = 256 << 20;
    config.hosts.insert(
        HOST.into(),
        HostConfig::default()
            .max_concurrent(256)
            .acquire_wait_ms(50),
    );
    let transport = MemTransport::new()
        .body(&br#"{"schemaVersion":2}"#[..])
        .record(false);
    let engine = Engine::builder(config)
        .transport(Arc::new(transport))
        .build();
    let url: reqwest::Url = format!("http://{HOST}/v2/bench/app/manifests/t0-0")
        .parse()
        .expect("a URL");
    let own = |n: usize| -> Vec<reqwest::Url> {
        (0..n)
            .map(|i| {
                format!("http://{HOST}/v2/bench/app/manifests/m-{i}")
                    .parse()
                    .expect("a URL")
            })
            .collect()
    };
    // The entries `hit-new` reads, parsed in its baseline (`warm-new`) too:
    // each read copies its URL, as `hit`'s do.
    let entries = match mode {
        "hit-new" | "warm-new" => own(n),
        _ => Vec::new(),
    };
    let reads: Vec<Read> = match mode {
        "hit" => (0..n).map(|_| Read::get(url.clone()).immutable()).collect(),
        "keep" => own(n)
            .into_iter()
            .map(|u| Read::get(u).immutable())
            .collect(),
        "miss" => own(n).into_iter().map(Read::get).collect(),
        "hit-new" => (entries.iter())
            .map(|u| Read::get(u.clone()).immutable())
            .collect(),
        "get" | "get-beside" | "warm-new" => Vec::new(),
        other => panic!("no mode {other}"),
    };
    if matches!(mode, "hit-new" | "warm-new") {
        // Kept by a request of their own, not by the one that hits them.
        let kept = runtime.block_on(async {
            let request = engine.begin_request(Caller::Public);
            let op = request.operation();
            let mut kept = 0;
            for url in &entries {
                let read = Read::get(url.clone()).immutable();
                black_box(op.upstream().read(read).await.expect("kept"));
                kept += 1;
            }
            kept
        });
        assert_eq!(kept, n);
    }
    if mode != "get" {
        let warm = Read::get(url.clone()).immutable();
        let reads_done = runtime.block_on(async {
            let request = engine.begin_request(Caller::Public);
            let op = request.operation();
            let upstream = op.upstream();
            black_box(upstream.read(warm).await.expect("warm"));
            let mut done = 0;
            for read in reads {
                black_box(upstream.read(read).await.expect("read"));
                done += 1;
            }
            done
        });
        let none = matches!(mode, "get-beside" | "warm-new");
        assert_eq!(reads_done, if none { 0 } else { n });
        if mode != "get-beside" {
            return;
        }
    }
    let floor: moka::sync::Cache<String, Arc<Vec<u8>>> = moka::sync::Cache::new(1024);
    let key = url.to_string();
    floor.insert(key.clone(), Arc::new(vec![0; 64]));
    for _ in 0..n {
        black_box(floor.get(&black_box(key.clone())).expect("kept"));
    }
}
