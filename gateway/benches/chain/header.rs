//! The CPU a hop's header costs: reads to a host marked `propagate` (its
//! answers carrying `Fanout-Spent`) against the same reads to the same host
//! without it, paired and interleaved (`fanout_testkit::paired`: a b, b a,
//! …), the figure the process's CPU time (`CLOCK_PROCESS_CPUTIME_ID`, every
//! thread) per read. Three pairs:
//!
//! - **in memory**: the engine's read path alone, over the testkit's
//!   `MemTransport` (each read pends once, then answers 200 with
//!   `Fanout-Spent: reads=1` on both sides: only the `propagate` side reads
//!   it). The propagate side asks for a grant (one `yield_now` first),
//!   writes `Fanout-Budget`, parses `Fanout-Spent` and settles;
//! - **loopback, caller only**: the same over a real socket, to a tiny axum
//!   host that answers every request with `Fanout-Spent: reads=1`;
//! - **loopback, the whole hop**: a POST of `{ __typename }` to a service on
//!   the engine (`examples/chain.rs`, served by `inbound::serve`): with
//!   `propagate`, the callee also parses `Fanout-Budget`, lowers its limit
//!   and answers `Fanout-Spent`; without, it receives no header and sends
//!   none.
//!
//! One current-thread runtime runs client and server alike (no cross-thread
//! wake-ups; `CHAIN_WORKERS=N`: a multi-thread runtime of N workers): the
//! process's CPU is the hop's, both ends. Reads go 64 to an
//! inbound request (`begin_request`), sequentially; only the reads are
//! clocked (the `Read`s are built and the request opened off the clock).

use crate::example;
use fanout_budget::config::HostConfig;
use fanout_budget::{inbound::Caller, Config, Engine, Read};
use fanout_testkit::{median, paired, MemTransport, Paired};
use http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;

/// Reads per inbound request.
const CHUNK: usize = 64;
/// The in-memory host.
const MEM_HOST: &str = "service.bench:8080";

/// The process's CPU time so far, every thread (user + system).
fn cpu_now() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// One turn's CPU time and wall time.
#[derive(Clone, Copy, Default)]
struct Turn {
    cpu: Duration,
    wall: Duration,
}

impl std::ops::AddAssign for Turn {
    fn add_assign(&mut self, other: Self) {
        self.cpu += other.cpu;
        self.wall += other.wall;
    }
}

/// Awaits `f`, clocked.
async fn clocked<T>(f: impl Future<Output = T>) -> (T, Turn) {
    let (cpu, wall) = (cpu_now(), Instant::now());
    let out = f.await;
    let turn = Turn {
        wall: wall.elapsed(),
        cpu: cpu_now() - cpu,
    };
    (out, turn)
}

/// A diagnostic (`CHAIN_PEND`): each read, on both sides, preceded by a
/// pend of the task outside the engine — `yield`: `tokio::task::yield_now`
/// (what a `propagate` read does before its grant), `wake`: a pend that
/// wakes itself at once. Whatever the scheduler charges for a pend then
/// shows on both sides, and the pair's difference is the header's rest.
#[derive(Clone, Copy)]
enum Pend {
    No,
    Yield,
    Wake,
}

impl Pend {
    fn from_env() -> Self {
        match std::env::var("CHAIN_PEND").as_deref() {
            Ok("yield") => Self::Yield,
            Ok("wake") => Self::Wake,
            _ => Self::No,
        }
    }
}

static PEND: std::sync::OnceLock<Pend> = std::sync::OnceLock::new();

/// `iters` reads made by `read(i)` through `engine`, `CHUNK` to a request;
/// the time the reads took (each chunk's `Read`s built before the clock).
async fn engine_reads(
    engine: Engine,
    iters: u64,
    read: Arc<dyn Fn(usize) -> Read + Send + Sync>,
) -> Turn {
    let mut total = Turn::default();
    let mut left = iters as usize;
    while left > 0 {
        let n = left.min(CHUNK);
        left -= n;
        let request = engine.begin_request(Caller::Public);
        let op = request.operation();
        let upstream = op.upstream();
        let reads: Vec<Read> = (0..n).map(|i| read(i)).collect();
        let pend = *PEND.get_or_init(Pend::from_env);
        let ((), turn) = clocked(async {
            for read in reads {
                match pend {
                    Pend::No => {}
                    Pend::Yield => tokio::task::yield_now().await,
                    Pend::Wake => fanout_testkit::YieldOnce::new().await,
                }
                let answer = upstream.read(read).await.expect("a read");
                assert_eq!(answer.status, StatusCode::OK);
                std::hint::black_box(answer);
            }
        })
        .await;
        total += turn;
    }
    total
}

/// A side of a pair: reads through `engine`, in a task on `rt`, each turn
/// also kept in `turns` (for the spread and the wall time).
fn side<'a>(
    rt: &'a Runtime,
    engine: Engine,
    read: Arc<dyn Fn(usize) -> Read + Send + Sync>,
    turns: Rc<RefCell<Vec<Turn>>>,
) -> impl FnMut(u64) -> Duration + 'a {
    move |iters| {
        let task = engine_reads(engine.clone(), iters, read.clone());
        let turn = rt.block_on(async move { tokio::spawn(task).await.expect("the bench task") });
        turns.borrow_mut().push(turn);
        turn.cpu
    }
}

/// One pair's figures.
struct Figures {
    name: &'static str,
    /// The judged figures: CPU per read, medians of the rounds.
    cpu: Paired,
    /// Per-round CPU ratios: quartiles and extremes.
    spread: [f64; 4],
    /// Wall time per read, medians: with, without, median ratio.
    wall: (f64, f64, f64),
}

/// `a` (`propagate`) and `b` (without) turn about; see `fanout_testkit::paired`.
fn measure(
    name: &'static str,
    rt: &Runtime,
    rounds: usize,
    iters: u64,
    engines: [Engine; 2],
    read: Arc<dyn Fn(usize) -> Read + Send + Sync>,
) -> Figures {
    let turns = [Rc::default(), Rc::default()];
    let [on, off] = engines;
    let cpu = paired(
        rounds,
        iters,
        side(rt, on, read.clone(), Rc::clone(&turns[0])),
        side(rt, off, read, Rc::clone(&turns[1])),
    );
    // `paired` runs one turn of each first, unrecorded: skip it here too.
    let [a, b] = turns.map(|t| t.borrow()[1..].to_vec());
    let per = |d: Duration| d.as_secs_f64() * 1e9 / iters as f64;
    let mut ratios: Vec<f64> = a
        .iter()
        .zip(&b)
        .map(|(a, b)| per(a.cpu) / per(b.cpu))
        .collect();
    ratios.sort_by(f64::total_cmp);
    let q = |p: f64| ratios[((ratios.len() - 1) as f64 * p).round() as usize];
    let spread = [q(0.0), q(0.25), q(0.75), q(1.0)];
    let mut a_wall: Vec<f64> = a.iter().map(|t| per(t.wall)).collect();
    let mut b_wall: Vec<f64> = b.iter().map(|t| per(t.wall)).collect();
    let mut wall_ratios: Vec<f64> = a_wall.iter().zip(&b_wall).map(|(a, b)| a / b).collect();
    let wall = (
        median(&mut a_wall),
        median(&mut b_wall),
        median(&mut wall_ratios),
    );
    Figures {
        name,
        cpu,
        spread,
        wall,
    }
}

/// A config whose reads to `host` carry the budget (`propagate`) or not.
fn caller_config(host: &str, propagate: bool) -> Config {
    let mut config = Config::default();
    config.budget.max_reads = 1_000;
    let mut table = HostConfig::default();
    table.propagate = propagate;
    config.hosts.insert(host.into(), table);
    config
}

/// The in-memory host: each of `CHUNK` paths answered 200 with
/// `Fanout-Spent: reads=1`, after pending once.
fn mem_engine(propagate: bool) -> Engine {
    let mut headers = HeaderMap::new();
    headers.insert("fanout-spent", HeaderValue::from_static("reads=1"));
    let mut transport = MemTransport::new().pending_once(true).record(false);
    for i in 0..CHUNK {
        transport = transport.stored(
            format!("/v2/bench/app/manifests/t{i}"),
            StatusCode::OK,
            headers.clone(),
            bytes::Bytes::from_static(br#"{"schemaVersion":2}"#),
        );
    }
    Engine::builder(caller_config(MEM_HOST, propagate))
        .transport(Arc::new(transport))
        .build()
}

fn get_reads(base: String) -> Arc<dyn Fn(usize) -> Read + Send + Sync> {
    let urls: Vec<reqwest::Url> = (0..CHUNK)
        .map(|i| {
            format!("{base}/v2/bench/app/manifests/t{i}")
                .parse()
                .expect("a URL")
        })
        .collect();
    Arc::new(move |i| Read::get(urls[i].clone()))
}

/// Prints the pairs `pairs` names (`mem`, `get`, `hop`; all when empty);
/// whether the hop's figure is within `target` (`None` when it did not run).
pub fn run(rounds: usize, target: f64, pairs: &str, workers: usize) -> Option<bool> {
    let rt = match workers {
        0 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut rt = tokio::runtime::Builder::new_multi_thread();
            rt.worker_threads(n);
            rt
        }
    }
    .enable_all()
    .build()
    .expect("a runtime");
    let chosen = |pair: &str| pairs.is_empty() || pairs.split(',').any(|p| p == pair);
    let mut all = Vec::new();

    if chosen("mem") {
        all.push(measure(
            "in memory: the read path alone",
            &rt,
            rounds,
            20_000,
            [mem_engine(true), mem_engine(false)],
            get_reads(format!("http://{MEM_HOST}")),
        ));
    }
    if chosen("get") {
        get_pair(&rt, rounds, &mut all);
    }
    let hop = chosen("hop").then(|| {
        hop_pair(&rt, rounds, &mut all);
        all.last().expect("the hop").cpu.ratio
    });
    let runtime = match workers {
        0 => "one current-thread runtime".to_string(),
        n => format!("one multi-thread runtime, {n} workers"),
    };
    let runtime = match *PEND.get_or_init(Pend::from_env) {
        Pend::No => runtime,
        Pend::Yield => format!("{runtime}; each read after a `yield_now` (`CHAIN_PEND=yield`)"),
        Pend::Wake => format!("{runtime}; each read after a self-wake (`CHAIN_PEND=wake`)"),
    };
    report(rounds, target, &all, hop, &runtime)
}

/// The caller only, over loopback: a tiny host answering every GET with
/// `Fanout-Spent: reads=1`.
fn get_pair(rt: &Runtime, rounds: usize, all: &mut Vec<Figures>) {
    let (bare, bare_task) = rt.block_on(async {
        let app = axum::Router::new().route(
            "/v2/{*rest}",
            axum::routing::get(|| async {
                ([("fanout-spent", "reads=1")], r#"{"schemaVersion":2}"#)
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let addr = listener.local_addr().expect("bound").to_string();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (addr, task)
    });
    all.push(measure(
        "loopback GET, the caller only (a bare host answering `Fanout-Spent`)",
        rt,
        rounds,
        2_000,
        [
            Engine::new(caller_config(&bare, true)),
            Engine::new(caller_config(&bare, false)),
        ],
        get_reads(format!("http://{bare}")),
    ));
    bare_task.abort();
}

/// The whole hop: a service on the engine (examples/chain.rs), asked
/// `{ __typename }`.
fn hop_pair(rt: &Runtime, rounds: usize, all: &mut Vec<Figures>) {
    let (service, server) = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let addr = listener.local_addr().expect("bound").to_string();
        let nowhere: reqwest::Url = "http://127.0.0.1:9/graphql".parse().expect("a URL");
        let mut config = example::config(&nowhere);
        config.rate_limit.requests_per_minute = u32::MAX;
        let app = example::app(Engine::new(config.clone()), nowhere);
        let serve = fanout_budget::inbound::serve(listener, app, &config);
        let task = tokio::spawn(async move {
            let _ = serve.await;
        });
        (addr, task)
    });
    let url: reqwest::Url = format!("http://{service}/graphql").parse().expect("a URL");
    let body = serde_json::json!({ "query": "{ __typename }" }).to_string();
    let post: Arc<dyn Fn(usize) -> Read + Send + Sync> = Arc::new(move |_| {
        Read::new(Method::POST, url.clone())
            .header(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )
            .body(body.clone())
    });
    all.push(measure(
        "loopback POST, the whole hop (a service on the engine, both ends)",
        rt,
        rounds,
        2_000,
        [
            Engine::new(caller_config(&service, true)),
            Engine::new(caller_config(&service, false)),
        ],
        post,
    ));
    server.abort();
}

/// The table, and the verdict on the hop's ratio (`hop`).
fn report(
    rounds: usize,
    target: f64,
    all: &[Figures],
    hop: Option<f64>,
    runtime: &str,
) -> Option<bool> {
    println!("## chain: the CPU a hop's header costs");
    println!();
    println!(
        "`propagate = true` (a) vs the same host without it (b), turn about, medians of {rounds} rounds; \
         CPU: the process's (every thread) per read; {runtime}, client and server."
    );
    println!();
    println!("| pair | CPU per read, a | CPU per read, b | a − b | a / b (paired) | spread of a / b: min, quartiles, max | wall per read, a / b |");
    println!("|---|---|---|---|---|---|---|");
    for f in all {
        let [min, q1, q3, max] = f.spread;
        println!(
            "| {} | {} | {} | {} | **{:.4}×** | {min:.3}, {q1:.3}–{q3:.3}, {max:.3} | {} / {}, {:.4}× |",
            f.name,
            human(f.cpu.a_ns),
            human(f.cpu.b_ns),
            human(f.cpu.diff_ns),
            f.cpu.ratio,
            human(f.wall.0),
            human(f.wall.1),
            f.wall.2,
        );
    }
    println!();
    let held = hop.map(|ratio| ratio - 1.0 <= target);
    if let (Some(ratio), Some(held)) = (hop, held) {
        println!(
            "target: the header costs ≤ {:.0} % of a hop's CPU (paired, the whole hop): {:+.2} % — {}",
            target * 100.0,
            (ratio - 1.0) * 100.0,
            if held { "met" } else { "MISSED" }
        );
    }
    for f in all {
        println!(
            "  {}: {:+.2} % ({} a read)",
            f.name,
            (f.cpu.ratio - 1.0) * 100.0,
            human(f.cpu.diff_ns)
        );
    }
    held
}

/// A duration in ns or µs, whichever reads best.
fn human(ns: f64) -> String {
    if ns.abs() < 1_000.0 {
        format!("{ns:.0} ns")
    } else {
        format!("{:.2} µs", ns / 1e3)
    }
}
