//! Fixtures shared by the test suites and benchmarks of `fanout-budget` and
//! the gateway (a workspace-only crate, never published): external binaries
//! and installed paths found or skipped by the contract's rule, a throwaway
//! `redis-server`, a
//! future that pends once, a median and a paired (turn-about) measure, the sum of a batch's
//! `operationReads`, one in-memory [`Transport`](fanout_budget::read::Transport)
//! ([`MemTransport`]), one fault-injecting loopback upstream ([`Upstream`])
//! one in-process GraphQL POST ([`post`]), a collector that never answers
//! ([`hung`]) and Debian's `docker-registry`,
//! open or authenticating, over HTTP or TLS ([`RegistryServer`]).
// One call into glibc (`child::trim_heap`) is allowed where it is made.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod poll;
mod post;
mod redis_cluster;
mod registry;
mod rewrite;
mod transport;
mod upstream;

pub mod child;
pub mod hung;
pub mod otlp;
pub mod prometheus;
pub mod ws;
pub use poll::until;
pub use post::{call, graphql_request, metrics_page, post, Answer, PEER};
pub use redis_cluster::{ClusterNode, RedisCluster};
pub use registry::{RegistryAuth, RegistryServer, TokenPolicy};
pub use rewrite::Rewrite;
pub use transport::{scripted, MemTransport};
pub use upstream::{Behaviour, Seen, Upstream};

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// `SKIPPED: …` and `None` when `binary` is missing, unless
/// `FANOUT_REQUIRE_EXTERNAL=1`, where a missing binary fails the test.
pub fn require_binary(binary: &str, package: &str) -> Option<std::path::PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(binary))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        skip(&format!(
            "SKIPPED: {binary} not on PATH (Debian package {package})"
        ));
    }
    found
}

/// `SKIPPED: {shown} missing ({how})` and `false` when `path` does not exist
/// (e.g. an installed `node_modules`, `how` the command that installs it),
/// unless `FANOUT_REQUIRE_EXTERNAL=1`, where a missing path fails the test.
pub fn require_path(path: &std::path::Path, shown: &str, how: &str) -> bool {
    let found = path.exists();
    if !found {
        skip(&format!("SKIPPED: {shown} missing ({how})"));
    }
    found
}

/// Prints `message` (a `SKIPPED: …` line) for a test that cannot run here,
/// or fails the test under `FANOUT_REQUIRE_EXTERNAL=1`; the caller returns.
fn skip(message: &str) {
    if std::env::var("FANOUT_REQUIRE_EXTERNAL").as_deref() == Ok("1") {
        panic!("{message}, and FANOUT_REQUIRE_EXTERNAL=1");
    }
    println!("{message}");
}

/// A free loopback port (bound and released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `redis-server` on a free loopback port, with no persistence; killed on drop.
pub struct RedisServer {
    binary: std::path::PathBuf,
    /// Its loopback port.
    pub port: u16,
    child: Option<std::process::Child>,
}

impl RedisServer {
    /// Starts one (`None`, with a `SKIPPED:` line, without the binary).
    pub async fn start() -> Option<Self> {
        let binary = require_binary("redis-server", "redis-server")?;
        let mut server = Self {
            binary,
            port: free_port(),
            child: None,
        };
        server.restart().await;
        Some(server)
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts (again) on the same port, and waits until it answers.
    pub async fn restart(&mut self) {
        let child = std::process::Command::new(&self.binary)
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("redis-server starts");
        self.child = Some(child);
        for _ in 0..200 {
            if self.command(&["PING"]).await.is_some() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        panic!("redis-server did not answer on port {}", self.port);
    }

    /// Kills it hard (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends a signal (e.g. STOP / CONT) to the server process.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().unwrap().id().to_string();
        assert!(std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .unwrap()
            .success());
    }

    /// Runs one command on a fresh connection; `None` when unreachable.
    pub async fn command(&self, args: &[&str]) -> Option<redis::Value> {
        // Generous: a loaded machine may take a while to answer a test's
        // own query, and a `None` that meant "slow" would read as "none".
        let limit = std::time::Duration::from_secs(5);
        let client = redis::Client::open(self.url()).ok()?;
        let mut conn = tokio::time::timeout(limit, client.get_multiplexed_async_connection())
            .await
            .ok()?
            .ok()?;
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        tokio::time::timeout(limit, cmd.query_async(&mut conn))
            .await
            .ok()?
            .ok()
    }

    /// Slots of host cap `key` held on Redis by every replica (see
    /// [`slots_held`]).
    pub async fn slots_held(&self, key: &str) -> u32 {
        slots_held(self.command(&["HGETALL", key]).await)
    }

    /// The slots held on the host hash `key` by the fields written since
    /// `since_ms` (Redis's clock, [`time_ms`](Self::time_ms)) with a lease
    /// of `lease_ms`: a field's expiry is its last claim's time plus the
    /// lease, so one written before `since_ms` is not counted.
    pub async fn slots_claimed_since(&self, key: &str, since_ms: u64, lease_ms: u64) -> u32 {
        slots_held_expiring(self.command(&["HGETALL", key]).await, since_ms + lease_ms)
    }

    /// Redis's clock, in ms since the epoch.
    pub async fn time_ms(&self) -> u64 {
        let Some(redis::Value::Array(parts)) = self.command(&["TIME"]).await else {
            panic!("TIME unanswered");
        };
        let part = |at: usize| match &parts[at] {
            redis::Value::BulkString(v) => String::from_utf8_lossy(v).parse::<u64>().expect("TIME"),
            other => panic!("TIME's part {other:?}"),
        };
        part(0) * 1000 + part(1) / 1000
    }

    /// The keys matching `pattern`.
    pub async fn keys(&self, pattern: &str) -> Vec<String> {
        match self.command(&["KEYS", pattern]).await {
            Some(redis::Value::Array(items)) => items
                .into_iter()
                .filter_map(|v| match v {
                    redis::Value::BulkString(b) => String::from_utf8(b).ok(),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            let _ = std::process::Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .status();
        }
        self.kill();
    }
}

/// Slots of a host's cap held on Redis, from `HGETALL` of its hash: the sum
/// of each replica's field `"<has> <wants> <expires> <since>"` (lapsed ones included
/// until a claim purges them). Panics on anything else, unreachable included.
pub fn slots_held(reply: Option<redis::Value>) -> u32 {
    slots_held_expiring(reply, 0)
}

/// [`slots_held`] by the fields whose expiry (ms) is `from_ms` or later.
fn slots_held_expiring(reply: Option<redis::Value>, from_ms: u64) -> u32 {
    let fields = match reply {
        Some(redis::Value::Array(fields)) => fields,
        Some(redis::Value::Map(pairs)) => pairs.into_iter().flat_map(|(k, v)| [k, v]).collect(),
        other => panic!("HGETALL of a host's hash: {other:?}"),
    };
    fields
        .chunks(2)
        .map(|pair| match &pair[1] {
            redis::Value::BulkString(v) => {
                // "<has> <wants> <expires (ms)> [<short since>]"
                let v = String::from_utf8_lossy(v);
                let mut parts = v.split(' ');
                let has = parts.next().unwrap_or_default();
                let expires = parts.nth(1).and_then(|e| e.parse::<u64>().ok());
                match expires {
                    Some(expires) if expires < from_ms => 0,
                    _ => has.parse::<u32>().expect("a field's slots"),
                }
            }
            other => panic!("a host field {other:?}"),
        })
        .sum()
}

/// Pends once, waking itself at once: what a read on a real socket does at
/// least, and what makes `tokio::time::timeout` arm its timer.
pub struct YieldOnce(pub bool);

impl YieldOnce {
    /// A future that will pend once.
    pub fn new() -> Self {
        Self(false)
    }
}

impl Default for YieldOnce {
    fn default() -> Self {
        Self::new()
    }
}

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            Poll::Ready(())
        } else {
            self.0 = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

/// The reads each operation of a batch answer sent itself
/// (`extensions.fanout.operationReads`), summed: what the upstream saw.
pub fn operation_reads(responses: &[serde_json::Value]) -> u64 {
    responses
        .iter()
        .map(|r| {
            r["extensions"]["fanout"]["operationReads"]
                .as_u64()
                .expect("every operation reports operationReads")
        })
        .sum()
}

/// The median of `values` (sorted in place; NaN when empty).
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    let n = values.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// Two routines measured turn about, so that what the shared machine does
/// meanwhile hits both alike.
pub struct Paired {
    /// Median ns per iteration of `a`.
    pub a_ns: f64,
    /// Median ns per iteration of `b`.
    pub b_ns: f64,
    /// Median over the rounds of `a / b`.
    pub ratio: f64,
    /// Median over the rounds of `a - b`, ns per iteration.
    pub diff_ns: f64,
    /// Rounds run.
    pub rounds: usize,
}

/// Runs `a` and `b` alternately (`a b`, then `b a`, …), `rounds` times each,
/// `iters` iterations a turn (each routine returns the time its `iters` took).
pub fn paired(
    rounds: usize,
    iters: u64,
    mut a: impl FnMut(u64) -> Duration,
    mut b: impl FnMut(u64) -> Duration,
) -> Paired {
    // One turn each first, unrecorded: warm caches, pools and maps.
    a(iters);
    b(iters);
    let per = |d: Duration| d.as_secs_f64() * 1e9 / iters as f64;
    let (mut av, mut bv, mut ratios, mut diffs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let (ta, tb) = if round % 2 == 0 {
            let ta = per(a(iters));
            (ta, per(b(iters)))
        } else {
            let tb = per(b(iters));
            (per(a(iters)), tb)
        };
        av.push(ta);
        bv.push(tb);
        ratios.push(ta / tb);
        diffs.push(ta - tb);
    }
    Paired {
        a_ns: median(&mut av),
        b_ns: median(&mut bv),
        ratio: median(&mut ratios),
        diff_ns: median(&mut diffs),
        rounds,
    }
}

/// `{ ...F0 }`, each `Fi` on `Query` spreading `Fi+1` twice, the last one
/// selecting `leaf`: a document of a few hundred bytes that expands to
/// 2^`links` selections (a hostile shape of the query-size guards).
pub fn doubling_chain(links: usize, leaf: &str) -> String {
    let mut query = String::from("{ ...F0 }");
    for i in 0..links {
        query.push_str(&format!(
            " fragment F{i} on Query {{ ...F{n} ...F{n} }}",
            n = i + 1
        ));
    }
    query.push_str(&format!(" fragment F{links} on Query {{ {leaf} }}"));
    query
}

/// The SHA-256 of `text` in lowercase hex (a persisted query's `sha256Hash`).
pub fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
