//! `tagChanges` at scale: the gateway (embedded registry, `FanoutGraphQL`
//! under `fanout_budget::inbound::serve`) in a child process, its
//! subscribers in this one over loopback WebSockets.
//!
//! 1. 1,000 subscribers of one tag, then 1,000 on 100 tags (10 each), at
//!    `poll_interval_ms = 1000`: the registry's manifest `HEAD`s per
//!    interval (target: one per tag), the server's CPU (user + system,
//!    `getrusage`) per event delivered, and the time from a push (a tag
//!    changed in the embedded store) to its first and its last
//!    subscriber's event (at most an interval of it is the poll's wait).
//! 2. 5,000 connections, each with one subscription and nothing flowing:
//!    the server's resident memory gained, per connection (target
//!    ≤ 32 KiB).
//!
//! The child is this binary again with `SUBS_SERVER` set; it reads
//! commands on stdin (`push TAG…`, `stats`) and answers one line each.
//!
//! `cargo bench -p fanout-gateway --bench subscriptions`

use fanout_budget::Config;
use fanout_gateway::app;
use fanout_gateway::embedded::{EmbeddedRegistry, Image};
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

const TOKEN: &str = "bench-internal";
const INTERVAL: Duration = Duration::from_millis(1000);
const LIMIT: Duration = Duration::from_secs(60);

fn main() {
    if std::env::var("SUBS_SERVER").is_ok() {
        return server();
    }
    raise_nofile();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        println!("tagChanges, poll_interval_ms = 1000, loopback, server in a child process");
        fan_out(1, 1000).await;
        fan_out(100, 10).await;
        idle_memory(5000).await;
    });
}

// ------------------------------------------------------------ the server

fn server() {
    raise_nofile();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let registry = EmbeddedRegistry::fixture().await.unwrap();
        // The fixture's acme/app has t00..t59: a hundred tags.
        registry.with_store(|store| {
            for t in 0..100 {
                let image = Image::demo("linux", "amd64", &tag_name(t));
                store.put_image("acme/app", Some(&tag_name(t)), &image);
            }
        });
        let mut config = Config::default();
        config.subscriptions.poll_interval_ms = INTERVAL.as_millis() as u64;
        config.rate_limit.internal_token = TOKEN.into();
        config.http.max_connections = 12_000;
        config.http.max_connections_per_client = 12_000;
        // Thousands of sockets from one loopback address: the sockets may
        // take the whole table and hold what they need (16 KiB each and up).
        config.subscriptions.max_connections = 12_000;
        config.subscriptions.max_bytes = 2 << 30;
        config.subscriptions.max_bytes_per_client = 2 << 30;
        let gateway = app::build(config.clone(), registry.url().parse().unwrap(), None);
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(8192).unwrap();
        println!("{}", listener.local_addr().unwrap());
        let serving = fanout_budget::inbound::serve(listener, gateway.router, &config);
        tokio::spawn(std::future::IntoFuture::into_future(serving));
        let mut lines = BufReader::new(std::io::stdin()).lines();
        let mut pushes = 0u64;
        loop {
            let line = tokio::task::block_in_place(|| lines.next());
            let Some(Ok(line)) = line else { return };
            let mut words = line.split_whitespace();
            match words.next() {
                Some("push") => {
                    pushes += 1;
                    registry.with_store(|store| {
                        for tag in words {
                            let image = Image::demo("linux", "amd64", &format!("{tag}-{pushes}"));
                            store.put_image("acme/app", Some(tag), &image);
                        }
                    });
                    println!("pushed");
                }
                Some("stats") => println!(
                    "{} {} {}",
                    registry.counters().heads(),
                    cpu_us(),
                    status_kib("VmRSS:")
                ),
                _ => return,
            }
        }
    });
}

fn cpu_us() -> u64 {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct we own.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    us(usage.ru_utime) + us(usage.ru_stime)
}

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn raise_nofile() {
    let mut limit: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: plain rlimit calls on a struct we own.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
    }
}

/// The server child and its command pipe.
struct Server {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    addr: SocketAddr,
}

/// Heads, CPU µs, RSS KiB.
struct Stats {
    heads: u64,
    cpu_us: u64,
    rss_kib: u64,
}

impl Server {
    fn start() -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env("SUBS_SERVER", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let addr = Self::line(&mut stdout).parse().unwrap();
        Self {
            child,
            stdin,
            stdout,
            addr,
        }
    }

    fn line(stdout: &mut BufReader<ChildStdout>) -> String {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        line.trim().to_string()
    }

    fn ask(&mut self, command: &str) -> String {
        writeln!(self.stdin, "{command}").unwrap();
        Self::line(&mut self.stdout)
    }

    fn stats(&mut self) -> Stats {
        let line = self.ask("stats");
        let n: Vec<u64> = line.split(' ').map(|w| w.parse().unwrap()).collect();
        Stats {
            heads: n[0],
            cpu_us: n[1],
            rss_kib: n[2],
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ------------------------------------------------------------ the clients

type Socket = WebSocketStream<TcpStream>;

/// Client `k`'s loopback address (250 connections per address).
fn source(k: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 1, (k / 250) as u8, (k % 250) as u8 + 1)
}

async fn subscriber(addr: SocketAddr, k: usize, tag: &str) -> Socket {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from((source(k), 0))).unwrap();
    let stream = socket.connect(addr).await.unwrap();
    let mut request = format!("ws://{addr}/graphql")
        .into_client_request()
        .unwrap();
    let headers = request.headers_mut();
    headers.insert(
        "sec-websocket-protocol",
        "graphql-transport-ws".parse().unwrap(),
    );
    headers.insert("x-internal-token", TOKEN.parse().unwrap());
    let (mut socket, _) = tokio_tungstenite::client_async(request, stream)
        .await
        .unwrap();
    let init = json!({ "type": "connection_init" });
    socket.send(Message::text(init.to_string())).await.unwrap();
    let query = format!(
        "subscription {{ tagChanges(repository: \"acme/app\", tag: \"{tag}\") {{ digest }} }}"
    );
    let subscribe = json!({ "type": "subscribe", "id": "1", "payload": { "query": query } });
    socket
        .send(Message::text(subscribe.to_string()))
        .await
        .unwrap();
    socket
}

/// The next `next` payload's digest (acks and pings skipped).
async fn next_digest(socket: &mut Socket) -> String {
    loop {
        let frame = tokio::time::timeout(LIMIT, socket.next())
            .await
            .expect("an event within the limit")
            .expect("open")
            .expect("a frame");
        let Message::Text(text) = frame else { continue };
        let value: Value = serde_json::from_str(&text).unwrap();
        if value["type"] == "next" {
            let digest = &value["payload"]["data"]["tagChanges"]["digest"];
            return digest.as_str().unwrap_or_else(|| panic!("{value}")).into();
        }
        assert!(
            value["type"] == "connection_ack" || value["type"] == "ping",
            "{value}"
        );
    }
}

/// Connects `count` subscribers (in waves, so the accept queue keeps up),
/// subscriber `k` to tag `tags(k)`, each past its first event.
async fn connect_all(addr: SocketAddr, count: usize, tag: impl Fn(usize) -> String) -> Vec<Socket> {
    let mut sockets = Vec::with_capacity(count);
    for wave in (0..count).collect::<Vec<_>>().chunks(250) {
        let joined = futures::future::join_all(wave.iter().map(|&k| {
            let tag = tag(k);
            async move {
                let mut socket = subscriber(addr, k, &tag).await;
                next_digest(&mut socket).await;
                socket
            }
        }))
        .await;
        sockets.extend(joined);
    }
    sockets
}

fn tag_name(t: usize) -> String {
    format!("t{t:02}")
}

// ------------------------------------------------------------ the runs

async fn fan_out(tags: usize, per_tag: usize) {
    let mut server = Server::start();
    let addr = server.addr;
    let count = tags * per_tag;
    let sockets = connect_all(addr, count, |k| tag_name(k % tags)).await;
    let tag_list: Vec<String> = (0..tags).map(tag_name).collect();
    let push = format!("push {}", tag_list.join(" "));
    let rounds = 5;
    let before = server.stats();
    let started = Instant::now();
    let mut sockets = sockets;
    let (mut firsts, mut lasts) = (Vec::new(), Vec::new());
    let mut delivered = 0u64;
    for _ in 0..rounds {
        assert_eq!(server.ask(&push), "pushed");
        let pushed = Instant::now();
        let arrivals = futures::future::join_all(sockets.iter_mut().map(|socket| async move {
            next_digest(socket).await;
            pushed.elapsed()
        }))
        .await;
        delivered += arrivals.len() as u64;
        firsts.push(*arrivals.iter().min().unwrap());
        lasts.push(*arrivals.iter().max().unwrap());
    }
    let elapsed = started.elapsed();
    let after = server.stats();
    let intervals = elapsed.as_secs_f64() / INTERVAL.as_secs_f64();
    let heads = after.heads - before.heads;
    let cpu_us = after.cpu_us - before.cpu_us;
    let ms = |d: &[Duration]| {
        let mean = d.iter().map(Duration::as_secs_f64).sum::<f64>() / d.len() as f64;
        let max = d.iter().max().unwrap().as_secs_f64();
        format!("mean {:.0} ms, max {:.0} ms", mean * 1e3, max * 1e3)
    };
    println!(
        "\n{count} subscribers on {tags} tag(s) ({per_tag} each), {rounds} pushes in {:.1} s:",
        elapsed.as_secs_f64()
    );
    println!(
        "  HEADs: {heads} in {intervals:.1} intervals = {:.2} per tag per interval (target 1)",
        heads as f64 / intervals / tags as f64
    );
    println!(
        "  server CPU: {:.1} ms for {delivered} events = {:.1} µs per event delivered",
        cpu_us as f64 / 1e3,
        cpu_us as f64 / delivered as f64
    );
    println!("  push → first subscriber's event: {}", ms(&firsts));
    println!("  push → last subscriber's event:  {}", ms(&lasts));
    let spread: Vec<Duration> = lasts.iter().zip(&firsts).map(|(l, f)| *l - *f).collect();
    println!("  first → last (the fan-out itself): {}", ms(&spread));
}

async fn idle_memory(count: usize) {
    let mut server = Server::start();
    let addr = server.addr;
    // Warm: one subscriber, then gone (the runtime, the schema, the first
    // poll's allocations are not per connection).
    drop(connect_all(addr, 1, |_| tag_name(0)).await);
    let before = server.stats();
    let sockets = connect_all(addr, count, |k| tag_name(k % 100)).await;
    // Settled: every connection has had its first event and is quiet.
    let after = server.stats();
    let gained = after.rss_kib.saturating_sub(before.rss_kib);
    println!(
        "\n{count} connections, one subscription each, idle: server RSS {} → {} KiB, \
         {:.1} KiB per connection (target ≤ 32)",
        before.rss_kib,
        after.rss_kib,
        gained as f64 / count as f64
    );
    drop(sockets);
}
