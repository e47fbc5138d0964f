//! Chains of services over real HTTP on loopback: the edge A and B are
//! `examples/chain.rs`, B calls the gateway, the gateway reads its embedded
//! registry — three engines, one budget (CONTRACT §14).
//!
//! ```text
//! test ─▶ A (max_reads 10) ─▶ B (100) ─▶ tap ─▶ gateway (100) ─▶ tap ─▶ registry
//! ```
//!
//! Each service is served by `fanout_budget::inbound::serve` on a loopback
//! listener of its own and counted (with the `Fanout-Budget` each request
//! carried) by a layer around its router; the taps are TCP relays that
//! record what passed and when each connection ended. Everything is
//! stopped when the test's values drop.

#[path = "../../examples/chain.rs"]
mod example;
#[path = "common/hops.rs"]
mod hops;

use fanout_budget::Engine;
use fanout_gateway::embedded::{EmbeddedRegistry, Fault};
use hops::{bind, counted, member, nest, roomy, Seen, Server, TEN_MANIFESTS};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

// ---- the taps ----

/// What passed through one connection of a [`Tap`].
#[derive(Default)]
struct Conn {
    /// The first bytes the client sent.
    sent: Vec<u8>,
    /// The first bytes the server answered.
    answer: Vec<u8>,
    /// When the first answer byte passed.
    answered: Option<Instant>,
    /// When the client closed the connection.
    closed: Option<Instant>,
}

impl Conn {
    /// Whether the client sent `part` (ASCII case ignored).
    fn sent(&self, part: &str) -> bool {
        let sent = String::from_utf8_lossy(&self.sent).to_ascii_lowercase();
        sent.contains(&part.to_ascii_lowercase())
    }
}

/// A TCP relay on a free loopback port to `target`, recording each
/// connection; stopped when dropped.
struct Tap {
    addr: SocketAddr,
    conns: Arc<Mutex<Vec<Conn>>>,
    changed: watch::Sender<u64>,
    task: JoinHandle<()>,
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a tap keeps of each direction of a connection.
const KEPT: usize = 64 * 1024;

impl Tap {
    async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let conns = Arc::new(Mutex::new(Vec::<Conn>::new()));
        let changed = watch::Sender::new(0);
        let task = {
            let (conns, changed) = (conns.clone(), changed.clone());
            tokio::spawn(async move {
                let mut relays = tokio::task::JoinSet::new();
                while let Ok((client, _)) = listener.accept().await {
                    let i = {
                        let mut conns = conns.lock().unwrap();
                        conns.push(Conn::default());
                        conns.len() - 1
                    };
                    let record = {
                        let (conns, changed) = (conns.clone(), changed.clone());
                        move |f: &dyn Fn(&mut Conn)| {
                            f(&mut conns.lock().unwrap()[i]);
                            changed.send_modify(|n| *n += 1);
                        }
                    };
                    relays.spawn(relay(client, target, record));
                }
            })
        };
        Self {
            addr,
            conns,
            changed,
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Waits (at most `within`) until `found` finds something in the
    /// connections so far.
    async fn wait<T>(&self, within: Duration, found: impl Fn(&[Conn]) -> Option<T>) -> T {
        let mut changes = self.changed.subscribe();
        let until = tokio::time::Instant::now() + within;
        loop {
            if let Some(t) = found(&self.conns.lock().unwrap()) {
                return t;
            }
            let waited = tokio::time::timeout_at(until, changes.changed()).await;
            assert!(
                waited.is_ok(),
                "nothing the test waits for within {within:?}"
            );
        }
    }

    /// Whether any connection's client sent `part`.
    fn any_sent(&self, part: &str) -> bool {
        self.conns.lock().unwrap().iter().any(|c| c.sent(part))
    }

    /// Every connection's answer, as text (lowercase).
    fn answers(&self) -> String {
        let conns = self.conns.lock().unwrap();
        (conns.iter())
            .map(|c| String::from_utf8_lossy(&c.answer).to_ascii_lowercase())
            .collect()
    }
}

/// Relays `client` to `target` both ways until either side closes.
async fn relay(client: TcpStream, target: SocketAddr, record: impl Fn(&dyn Fn(&mut Conn))) {
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    let (mut up, mut down) = (vec![0; 16 * 1024], vec![0; 16 * 1024]);
    let keep = |kept: &mut Vec<u8>, bytes: &[u8]| {
        let room = KEPT.saturating_sub(kept.len());
        kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
    };
    loop {
        tokio::select! {
            n = from_client.read(&mut up) => {
                let n = n.unwrap_or(0);
                if n == 0 {
                    record(&|c| c.closed = Some(Instant::now()));
                    return;
                }
                record(&|c| keep(&mut c.sent, &up[..n]));
                if to_server.write_all(&up[..n]).await.is_err() {
                    return;
                }
            }
            n = from_server.read(&mut down) => {
                let n = n.unwrap_or(0);
                if n == 0 {
                    return;
                }
                record(&|c| {
                    c.answered.get_or_insert_with(Instant::now);
                    keep(&mut c.answer, &down[..n]);
                });
                if to_client.write_all(&down[..n]).await.is_err() {
                    record(&|c| c.closed = Some(Instant::now()));
                    return;
                }
            }
        }
    }
}

// ---- the chain ----

/// A → B → tap → gateway → tap → registry, all running.
struct Chain {
    a: reqwest::Url,
    b: reqwest::Url,
    /// Requests B received (A's reads), with their `Fanout-Budget`.
    b_seen: Arc<Seen>,
    /// Requests the gateway received (B's reads).
    gateway_seen: Arc<Seen>,
    /// Between B and the gateway.
    to_gateway: Tap,
    /// Between the gateway and the registry.
    to_registry: Tap,
    registry: EmbeddedRegistry,
    _servers: [Server; 3],
}

impl Chain {
    /// The chain with A's budget of 10 reads and `a_deadline_ms`, A's and
    /// B's reads to the next hop marked `propagate` or not.
    async fn start(propagate: bool, a_deadline_ms: u64) -> Self {
        let registry = EmbeddedRegistry::fixture().await.unwrap();
        let to_registry = Tap::start(registry.host().parse().unwrap()).await;

        let gateway = hops::gateway(to_registry.url().parse().unwrap()).await;
        let to_gateway = Tap::start(gateway.url.socket_addrs(|| None).unwrap()[0]).await;
        let next: reqwest::Url = format!("{}/graphql", to_gateway.url()).parse().unwrap();
        let b = hops::service(next, propagate, roomy).await;
        let a = hops::service(b.url.clone(), propagate, |config| {
            config.budget.max_reads = 10;
            config.budget.deadline_ms = a_deadline_ms;
        })
        .await;
        Self {
            a: a.url,
            b: b.url,
            b_seen: b.seen,
            gateway_seen: gateway.seen,
            to_gateway,
            to_registry,
            registry,
            _servers: [a.server, b.server, gateway.server],
        }
    }

    /// A's answer to `query`.
    async fn ask(&self, query: &str) -> Value {
        ask(&self.a, query).await
    }

    /// Requests the registry received.
    fn registry_reads(&self) -> u64 {
        self.registry.counters().requests()
    }
}

/// `url`'s answer to `query`, from a client outside the chain.
async fn ask(url: &reqwest::Url, query: &str) -> Value {
    let answer = reqwest::Client::new()
        .post(url.clone())
        .json(&json!({ "query": query }))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    answer.json().await.unwrap()
}

/// Row `i` of a service's `fan`: the next service's answer, or null.
fn row(answer: &Value, i: usize) -> &Value {
    &answer["data"]["fan"][i]["answer"]
}

/// A's `extensions.fanout.used`.
fn used(answer: &Value) -> u64 {
    answer["extensions"]["fanout"]["used"].as_u64().unwrap()
}

// ---- the tests ----

#[tokio::test]
async fn a_fan_out_of_ten_at_each_hop_stays_within_the_edges_budget() {
    let chain = Chain::start(true, 30_000).await;
    let answer = chain.ask(&nest(&[10, 10], TEN_MANIFESTS)).await;
    let (a_sent, b_sent) = (chain.b_seen.count(), chain.gateway_seen.count());
    let registry = chain.registry_reads();
    // A's used: its own reads to B, plus what each B reported spent — B's
    // reads to the gateway plus what the gateway reported, its registry
    // reads. Every request the chain sent for the edge's request, once.
    assert_eq!(used(&answer), a_sent + b_sent + registry, "{answer}");
    assert!(registry <= 10, "{registry} registry reads");
    // What the design gives, exactly. Each of A's reads is charged before
    // its grant is cut, and A may have 8 in flight (`max_concurrent_reads`):
    // the first 8 are charged (8 of 10), then split the 2 left between
    // them, each taking (left / reads still asking), in turn: 2/8, 2/7, …,
    // 2/3 are 0, then 2/2 = 1 and 1/1 = 1. The budget is then spent: A's
    // 9th and 10th reads are refused, never sent. Six B's may send nothing
    // (all ten of their reads refused); two may send one read each, which
    // leaves them nothing to grant: the gateway may read nothing. Ten
    // reads, all of them hops; the registry is never reached.
    assert_eq!(chain.b_seen.members("reads"), [0, 0, 0, 0, 0, 0, 1, 1]);
    assert_eq!(chain.gateway_seen.members("reads"), [0, 0]);
    assert_eq!((a_sent, b_sent, registry, used(&answer)), (8, 2, 0, 10));
    let refused = (0..10).filter(|&i| row(&answer, i).is_null()).count();
    assert_eq!(refused, 2, "A's 9th and 10th rows: {answer}");
    let codes: Vec<_> = (answer["errors"].as_array().unwrap().iter())
        .map(|e| e["extensions"]["code"].as_str().unwrap())
        .collect();
    assert_eq!(codes, ["FANOUT_BUDGET_EXHAUSTED"; 2]);
}

#[tokio::test]
async fn a_narrower_fan_out_reaches_the_registry_and_every_read_is_charged_at_the_edge() {
    let chain = Chain::start(true, 30_000).await;
    let answer = chain.ask(&nest(&[2, 2], TEN_MANIFESTS)).await;
    // A: 2 reads charged, 8 left, split 4 and 4. Each B: 2 reads charged
    // of its 4, 2 left, split 1 and 1. Each gateway request: its one read,
    // the tag list; its ten manifests refused. Spent, reported back up:
    // 1 per gateway request, 2 + 2 per B, 2 + 8 at A.
    assert_eq!(chain.b_seen.members("reads"), [4, 4]);
    assert_eq!(chain.gateway_seen.members("reads"), [1, 1, 1, 1]);
    let (a_sent, b_sent) = (chain.b_seen.count(), chain.gateway_seen.count());
    let registry = chain.registry_reads();
    assert_eq!((a_sent, b_sent, registry), (2, 4, 4));
    assert_eq!(used(&answer), a_sent + b_sent + registry);
    assert_eq!(used(&answer), 10);
    // B's answers say what B spent, the gateway's what it spent.
    for i in 0..2 {
        let b = row(&answer, i);
        assert_eq!(b["extensions"]["fanout"]["limit"], 4, "{b}");
        assert_eq!(b["extensions"]["fanout"]["used"], 4, "{b}");
        for j in 0..2 {
            let gateway = row(b, j);
            assert_eq!(gateway["extensions"]["fanout"]["used"], 1, "{gateway}");
            let nodes = &gateway["data"]["repository"]["tags"]["nodes"];
            assert_eq!(nodes.as_array().unwrap().len(), 10, "{gateway}");
            assert!(nodes[0]["manifest"].is_null(), "{gateway}");
            let code = &gateway["errors"][0]["extensions"]["code"];
            assert_eq!(code, "FANOUT_BUDGET_EXHAUSTED", "{gateway}");
        }
    }
}

#[tokio::test]
async fn without_propagation_each_hop_multiplies() {
    let chain = Chain::start(false, 30_000).await;
    let answer = chain.ask(&nest(&[10, 10], TEN_MANIFESTS)).await;
    // A's budget still holds A: 10 reads to B. But each B has a budget of
    // its own (100) and sends 10, and each gateway request its own 100 (11
    // reads): 10 × 10 × 11.
    assert_eq!(used(&answer), 10);
    assert_eq!(chain.b_seen.count(), 10);
    assert_eq!(chain.gateway_seen.count(), 100);
    assert_eq!(chain.registry_reads(), 1_100);
    assert!(chain.b_seen.budgets().iter().all(Option::is_none));
    assert!(chain.gateway_seen.budgets().iter().all(Option::is_none));
    assert!(answer.get("errors").is_none(), "{answer}");
}

#[tokio::test]
async fn the_edges_deadline_bounds_the_chain() {
    const DEADLINE: Duration = Duration::from_millis(1_500);
    // Generous: B's and the gateway's own deadlines and read timeouts are a
    // minute; only the edge's can stop them this soon.
    const MARGIN: Duration = Duration::from_secs(3);
    let chain = Chain::start(true, DEADLINE.as_millis() as u64).await;
    chain
        .registry
        .set_tag_fault("acme/app", "t01", Some(Fault::Hang));
    let slow = r#"{ repository(name: "acme/app") { tag(name: "t01") { manifest { digest } } } }"#;
    let start = Instant::now();
    let answer = chain.ask(&nest(&[1, 1], slow)).await;
    let took = start.elapsed();
    assert!(
        took >= DEADLINE / 2 && took < DEADLINE + MARGIN,
        "A answered in {took:?}"
    );
    // The slow row is null wherever it shows: A's read to B cut at A's
    // deadline (the usual case), or B's answer arriving just before it,
    // with B's row null, or the gateway's, with the manifest null.
    let b = row(&answer, 0);
    let gateway = row(b, 0);
    let manifest = &gateway["data"]["repository"]["tag"]["manifest"];
    assert!(
        b.is_null() || gateway.is_null() || manifest.is_null(),
        "{answer}"
    );
    if b.is_null() {
        let code = &answer["errors"][0]["extensions"]["code"];
        assert_eq!(code, "DEADLINE_EXCEEDED", "{answer}");
        // A read with no answer keeps its whole grant charged (the next
        // hop may have spent it): 1 + 9, all of A's budget.
        assert_eq!(used(&answer), 10, "{answer}");
    }
    // Each hop was told no more time than the hop before it had left.
    let b_deadline = chain.b_seen.members("deadline-ms")[0];
    let gateway_deadline = chain.gateway_seen.members("deadline-ms")[0];
    assert!(b_deadline <= DEADLINE.as_millis() as u64, "{b_deadline}");
    assert!(gateway_deadline <= b_deadline, "{gateway_deadline}");
    // B's read to the gateway ended (answered or given up) by A's deadline,
    // and so did the gateway's read of the slow manifest (given up: the
    // registry never answers it).
    let b_read = chain
        .to_gateway
        .wait(DEADLINE + MARGIN, |conns| {
            let c = conns.iter().find(|c| c.sent("POST /graphql"))?;
            c.answered.into_iter().chain(c.closed).min()
        })
        .await;
    let gateway_read = chain
        .to_registry
        .wait(DEADLINE + MARGIN, |conns| {
            conns.iter().find(|c| c.sent("/manifests/t01"))?.closed
        })
        .await;
    for (who, ended) in [("B", b_read), ("the gateway", gateway_read)] {
        let after = ended.duration_since(start);
        assert!(
            after >= DEADLINE / 2 && after < DEADLINE + MARGIN,
            "{who}'s read ended {after:?} after the edge's request began"
        );
    }
    assert_eq!(
        chain.registry.counters().path("/v2/acme/app/manifests/t01"),
        1
    );
}

#[tokio::test]
async fn a_cycle_is_refused_at_the_hop_limit() {
    const MAX_HOPS: u32 = 3;
    let (a_listener, a_url) = bind().await;
    let (b_listener, b_url) = bind().await;
    // A calls B, B calls A: each the other's next, both propagating.
    let service = |next: &reqwest::Url| {
        let mut config = example::config(next);
        config.budget.max_hops = MAX_HOPS;
        let (router, seen) = counted(example::app(Engine::new(config.clone()), next.clone()));
        (router, seen, config)
    };
    let (a, a_seen, a_config) = service(&b_url);
    let (b, b_seen, b_config) = service(&a_url);
    let _servers = [
        Server::start(a_listener, a, &a_config),
        Server::start(b_listener, b, &b_config),
    ];
    // A query that would go round eight times.
    let answer = ask(&a_url, &nest(&[1; 8], "{ __typename }")).await;
    // The edge's request (no header) and hops 2 and 4 at A; hops 1 and 3
    // at B. Hop 4 is past max_hops: refused before any read, so it goes no
    // further. max_hops + 1 requests along the chain, each a read charged
    // to the edge's budget.
    let hops = |seen: &Seen| -> Vec<Option<u64>> {
        (seen.budgets().iter())
            .map(|b| b.as_deref().map(|b| member(b, "hops").unwrap()))
            .collect()
    };
    assert_eq!(hops(&a_seen), [None, Some(2), Some(4)]);
    assert_eq!(hops(&b_seen), [Some(1), Some(3)]);
    let along = a_seen.count() - 1 + b_seen.count();
    assert_eq!(along, u64::from(MAX_HOPS) + 1);
    assert_eq!(used(&answer), along);
    let mut refused = &answer;
    for _ in 0..4 {
        refused = row(refused, 0);
    }
    assert!(refused["data"].is_null(), "{answer}");
    assert_eq!(
        refused["errors"][0]["extensions"]["code"], "FANOUT_TOO_MANY_HOPS",
        "{answer}"
    );
}

#[tokio::test]
async fn the_gateway_never_sends_the_budget_to_its_registry() {
    let chain = Chain::start(true, 30_000).await;
    let query =
        r#"{ repository(name: "acme/app") { tags(first: 3) { nodes { manifest { digest } } } } }"#;
    let answer = chain.ask(&nest(&[1, 1], query)).await;
    let gateway = row(row(&answer, 0), 0);
    let nodes = gateway["data"]["repository"]["tags"]["nodes"]
        .as_array()
        .unwrap();
    assert!(
        nodes.iter().all(|n| n["manifest"]["digest"].is_string()),
        "{answer}"
    );
    // The gateway was given a budget, and answered with what it spent …
    let given = chain.gateway_seen.budgets();
    assert!(given.len() == 1 && given[0].is_some(), "{given:?}");
    assert!(chain.to_gateway.any_sent("fanout-budget: reads="));
    assert!(chain.to_gateway.answers().contains("fanout-spent: reads=4"));
    // … and its registry reads (the tag list, three manifests) carried none.
    assert_eq!(chain.registry_reads(), 4);
    assert!(chain.to_registry.any_sent("/manifests/"));
    assert!(!chain.to_registry.any_sent("fanout-budget"));
}

#[tokio::test]
async fn the_examples_own_query_splits_what_is_left() {
    // The query of examples/chain.rs's docs, at B (max_reads 100) in front
    // of the gateway: 3 reads charged, 97 left, split as the reads ask in
    // turn — 97/3, 65/2, 33/1.
    let chain = Chain::start(true, 30_000).await;
    let query = r#"{ fan(width: 3, query: "{ fanoutBudget { limit used } }") { answer } }"#;
    let answer = ask(&chain.b, query).await;
    let mut limits: Vec<u64> = (0..3)
        .map(|i| {
            row(&answer, i)["data"]["fanoutBudget"]["limit"]
                .as_u64()
                .unwrap()
        })
        .collect();
    limits.sort_unstable();
    assert_eq!(limits, [32, 32, 33], "{answer}");
    // The gateway spent nothing of them: all 97 given back.
    assert_eq!(used(&answer), 3, "{answer}");
    assert_eq!(chain.registry_reads(), 0);
}
