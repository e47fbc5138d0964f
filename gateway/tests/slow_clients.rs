//! Slow, idle and refused clients over real TCP, against
//! `fanout_budget::inbound::serve` on 127.0.0.1:0 with short timeouts (headers
//! 300 ms, body 500 ms): partial headers, idle keep-alive, a trickled body,
//! `Expect: 100-continue` with no body, the connection cap, a client's
//! share of it (a repeated refusal held a second, then reset, even with the
//! table full), a refused request's connection closed cleanly, and a client that never reads a
//! large response (writes 300 ms) or reads it slowly. Time bounds are
//! generous (the machine is shared); only the trickle's and the slow
//! reader's pacing sleeps.
mod common;

use common::*;
use fanout_budget::Config;
use futures::StreamExt;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::timeout;

/// What "soon" means here: far past every configured timeout.
const BOUND: Duration = Duration::from_secs(5);
/// The timers never fire early; this leaves room for a millisecond's rounding.
const AT_LEAST: Duration = Duration::from_millis(250);
const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n";
const BUDGET: &str = r#"{"query":"{ fanoutBudget { limit } }"}"#;

/// The gateway served by `fanout_budget::inbound::serve`; stopped by [`Server::stop`]
/// (aborted if a test fails first).
struct Server {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<io::Result<()>>,
    _fixture: Option<Fixture>,
}

impl Server {
    async fn start(configure: impl FnOnce(&mut Config)) -> Self {
        let mut config = Config::default();
        config.http.header_read_timeout_ms = 300;
        config.http.body_read_timeout_ms = 500;
        configure(&mut config);
        let fixture = Fixture::new(config.clone()).await;
        let router = fixture.gateway.router.clone();
        Self::serve(router, &config, Some(fixture)).await
    }

    async fn serve(router: axum::Router, config: &Config, fixture: Option<Fixture>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serve =
            fanout_budget::inbound::serve(listener, router, config).with_graceful_shutdown(async {
                let _ = stopped.await;
            });
        Self {
            addr,
            stop: Some(stop),
            task: tokio::spawn(serve),
            _fixture: fixture,
        }
    }

    /// Stops gracefully; every test has closed its sockets by then.
    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        let served = timeout(BOUND, &mut self.task)
            .await
            .expect("the server stops within the bound");
        served.unwrap().unwrap();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A raw HTTP/1.1 client on one TCP connection.
struct Client {
    read: OwnedReadHalf,
    write: Option<OwnedWriteHalf>,
    buf: Vec<u8>,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Self {
        Self::on(TcpStream::connect(addr).await.unwrap())
    }

    /// Connected with a receive buffer of `bytes` (set before the handshake,
    /// so the window it advertises is that small).
    async fn connect_with_recv_buffer(addr: SocketAddr, bytes: u32) -> Self {
        let socket = TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(bytes).unwrap();
        Self::on(socket.connect(addr).await.unwrap())
    }

    /// Connected from another loopback address (`127.0.0.N`), so the server
    /// sees another client.
    async fn connect_from(addr: SocketAddr, from: [u8; 4]) -> Self {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::from((from, 0))).unwrap();
        Self::on(socket.connect(addr).await.unwrap())
    }

    fn on(stream: TcpStream) -> Self {
        let (read, write) = stream.into_split();
        Self {
            read,
            write: Some(write),
            buf: Vec::new(),
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.write.as_mut().unwrap().write_all(bytes).await.unwrap();
    }

    /// Sends on a connection the server may have refused: a reset that
    /// arrived first fails the write, and the next read says so.
    async fn send_unless_reset(&mut self, bytes: &[u8]) {
        let _ = self.write.as_mut().unwrap().write_all(bytes).await;
    }

    /// `GET /healthz` on a new connection, which the server may refuse (a
    /// reset, perhaps before the connect is seen to complete): the status,
    /// or `None` when the connection ended unanswered.
    async fn healthz_unless_refused(addr: SocketAddr) -> Option<u16> {
        let mut client = Self::on(TcpStream::connect(addr).await.ok()?);
        client.send_unless_reset(HEALTHZ).await;
        let answered = timeout(BOUND, client.response()).await;
        answered
            .expect("answered or closed")
            .map(|(status, _, _)| status)
    }

    /// The next response: status, head (lower-cased), body; `None` when the
    /// connection ends first. Cancel-safe (bytes read stay in `buf`).
    async fn response(&mut self) -> Option<(u16, String, String)> {
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.buf[..end]).to_lowercase();
                let length = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().unwrap());
                while self.buf.len() < end + 4 + length {
                    if self.fill().await? == 0 {
                        return None;
                    }
                }
                let body = String::from_utf8_lossy(&self.buf[end + 4..end + 4 + length]).into();
                self.buf.drain(..end + 4 + length);
                return Some((head[9..12].parse().unwrap(), head, body));
            }
            if self.fill().await? == 0 {
                return None;
            }
        }
    }

    async fn fill(&mut self) -> Option<usize> {
        let mut chunk = [0u8; 4096];
        let n = self.read.read(&mut chunk).await.ok()?;
        self.buf.extend_from_slice(&chunk[..n]);
        Some(n)
    }

    /// Waits (at most [`BOUND`]) for the server to end the connection,
    /// discarding what arrives: `Ok` for a clean EOF, `Err` for a reset.
    async fn closed(&mut self) -> io::Result<()> {
        let mut chunk = [0u8; 4096];
        let ended = timeout(BOUND, async {
            loop {
                if self.read.read(&mut chunk).await? == 0 {
                    return Ok(());
                }
            }
        });
        ended
            .await
            .expect("the server closed the connection within the bound")
    }
}

fn post_head(length: usize, extra: &str) -> Vec<u8> {
    format!(
        "POST /graphql HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
         content-length: {length}\r\n{extra}\r\n"
    )
    .into_bytes()
}

fn code(body: &str) -> serde_json::Value {
    let body: serde_json::Value = serde_json::from_str(body).unwrap();
    body["errors"][0]["extensions"].clone()
}

#[tokio::test]
async fn partial_headers_and_silent_connections_are_cut_at_the_header_timeout() {
    let server = Server::start(|_| {}).await;
    let started = Instant::now();
    let mut partial = Client::connect(server.addr).await;
    partial
        .send(b"POST /graphql HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-le")
        .await;
    let mut silent = Client::connect(server.addr).await;
    for (name, client) in [("partial", &mut partial), ("silent", &mut silent)] {
        let _ = client.closed().await;
        let held = started.elapsed();
        assert!(held >= AT_LEAST, "{name}: cut after {held:?}");
        println!("{name} headers: connection held {held:?}");
    }
    drop((partial, silent));
    server.stop().await;
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_cut_at_the_header_timeout() {
    let server = Server::start(|_| {}).await;
    let mut client = Client::connect(server.addr).await;
    // Timed from before the request: the timer starts when the response is
    // written, after this, so a stall between the write and this task's
    // read cannot make the connection look cut early.
    let sent = Instant::now();
    client.send(HEALTHZ).await;
    let (status, head, body) = timeout(BOUND, client.response()).await.unwrap().unwrap();
    assert_eq!((status, body.as_str()), (200, "ok"));
    assert!(!head.contains("connection: close"), "{head}");
    let _ = client.closed().await;
    let idle = sent.elapsed();
    assert!(idle >= Duration::from_millis(200), "cut after {idle:?}");
    println!("idle keep-alive: connection held {idle:?}");
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn a_trickled_body_is_answered_408_before_the_trickle_ends() {
    let server = Server::start(|_| {}).await;
    let mut client = Client::connect(server.addr).await;
    // 100 bytes at one per 100 ms: 10 s, where the body may take 500 ms.
    let body = format!("{BUDGET:<100}");
    client.send(&post_head(body.len(), "")).await;
    let sent = Instant::now();
    let mut write = client.write.take().unwrap();
    let trickle = tokio::spawn(async move {
        for byte in body.bytes() {
            if write.write_all(&[byte]).await.is_err() {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        true
    });
    let (status, head, body) = timeout(BOUND, client.response())
        .await
        .expect("answered within the bound")
        .expect("answered before the connection closed");
    let answered = sent.elapsed();
    assert_eq!(status, 408, "{head}\n{body}");
    assert!(head.contains("\r\nconnection: close"), "{head}");
    let ext = code(&body);
    assert_eq!(ext["code"], "REQUEST_TIMEOUT");
    assert_eq!(ext["timeoutMs"], 500);
    assert!(answered >= Duration::from_millis(450), "{answered:?}");
    println!("trickled body: answered 408 after {answered:?}");
    let _ = client.closed().await;
    trickle.abort();
    let _ = trickle.await;
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn expect_continue_without_a_body_is_bounded_by_the_body_timeout() {
    let server = Server::start(|_| {}).await;
    let mut client = Client::connect(server.addr).await;
    client
        .send(&post_head(40, "expect: 100-continue\r\n"))
        .await;
    let sent = Instant::now();
    let (status, _, _) = timeout(BOUND, client.response()).await.unwrap().unwrap();
    assert_eq!(status, 100);
    let (status, head, body) = timeout(BOUND, client.response()).await.unwrap().unwrap();
    let answered = sent.elapsed();
    assert_eq!(status, 408, "{head}\n{body}");
    assert!(head.contains("\r\nconnection: close"), "{head}");
    assert_eq!(code(&body)["code"], "REQUEST_TIMEOUT");
    assert!(answered >= Duration::from_millis(450), "{answered:?}");
    println!("expect 100-continue, no body: answered 408 after {answered:?}");
    let _ = client.closed().await;
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn past_max_connections_a_client_waits_until_a_connection_closes() {
    let server = Server::start(|c| {
        c.http.max_connections = 8;
        c.http.header_read_timeout_ms = 30_000;
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..8 {
        let mut client = Client::connect(server.addr).await;
        client.send(HEALTHZ).await;
        let (status, _, _) = timeout(BOUND, client.response()).await.unwrap().unwrap();
        assert_eq!(status, 200);
        held.push(client); // served, and now an idle keep-alive connection
    }
    // The kernel completes the handshake (the backlog); the server does not
    // accept it while eight are open.
    let mut ninth = Client::connect(server.addr).await;
    ninth.send(HEALTHZ).await;
    let early = timeout(Duration::from_millis(500), ninth.response()).await;
    assert!(early.is_err(), "served past the cap: {early:?}");
    drop(held.pop());
    let (status, _, body) = timeout(BOUND, ninth.response())
        .await
        .expect("served within the bound once a connection closed")
        .unwrap();
    assert_eq!((status, body.as_str()), (200, "ok"));
    drop((held, ninth));
    server.stop().await;
}

#[tokio::test]
async fn idle_connections_filling_every_slot_are_cut_and_service_resumes() {
    let server = Server::start(|c| c.http.max_connections = 8).await;
    let started = Instant::now();
    let mut idle = Vec::new();
    for _ in 0..8 {
        idle.push(Client::connect(server.addr).await); // sends nothing
    }
    let mut next = Client::connect(server.addr).await;
    next.send(HEALTHZ).await;
    let (status, _, body) = timeout(BOUND, next.response())
        .await
        .expect("service resumed within the bound")
        .unwrap();
    let waited = started.elapsed();
    assert_eq!((status, body.as_str()), (200, "ok"));
    assert!(
        waited >= AT_LEAST,
        "served before a slot was freed: {waited:?}"
    );
    println!("/healthz behind 8 idle connections: served after {waited:?}");
    for client in &mut idle {
        let _ = client.closed().await;
    }
    drop((idle, next));
    server.stop().await;
}

#[tokio::test]
async fn a_rate_limited_large_body_gets_connection_close_and_a_clean_eof() {
    let server = Server::start(|c| {
        c.rate_limit.requests_per_minute = 1;
        c.http.header_read_timeout_ms = 10_000;
        c.http.body_read_timeout_ms = 10_000;
    })
    .await;
    let http = reqwest::Client::new();
    let url = format!("http://{}/graphql", server.addr);
    let post = |body: String| {
        http.post(&url)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    assert_eq!(post(BUDGET.into()).await.unwrap().status(), 200);

    // 1 MiB the limiter refuses before reading any of it; written while
    // the answer is read (the server stops reading, so the write may fail).
    let mut client = Client::connect(server.addr).await;
    let length = 1 << 20;
    client.send(&post_head(length, "")).await;
    let mut write = client.write.take().unwrap();
    let writer = tokio::spawn(async move {
        let chunk = vec![b' '; 16 << 10];
        for _ in 0..length / chunk.len() {
            if write.write_all(&chunk).await.is_err() {
                break;
            }
        }
    });
    let (status, head, body) = timeout(BOUND, client.response())
        .await
        .unwrap()
        .expect("a 429 before the connection ended");
    assert_eq!(status, 429);
    assert!(head.contains("\r\nconnection: close"), "{head}");
    assert_eq!(code(&body)["code"], "RATE_LIMITED");
    let ended = client.closed().await;
    assert!(ended.is_ok(), "ended by {ended:?}, not a clean EOF");
    writer.await.unwrap();

    // A well-behaved client does not reuse the connection of a refusal: its
    // next request goes out on a new one and succeeds.
    let refused = post(format!("{BUDGET:<60000}")).await.unwrap();
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["connection"], "close");
    let _ = refused.bytes().await;
    let health = http
        .get(format!("http://{}/healthz", server.addr))
        .send()
        .await
        .expect("the follow-up request succeeds");
    assert_eq!(health.text().await.unwrap(), "ok");
    drop((client, http));
    server.stop().await;
}

/// `GET /large`: a 256 MiB body (slices of one shared MiB, so serving it
/// costs the server little), far more than the kernel's socket buffers hold,
/// so a client that stops reading leaves the server's write pending. Each
/// response's body sends the time on the channel when it is dropped: when
/// the connection ends (it is never sent in full here).
fn large_route() -> (axum::Router, tokio::sync::mpsc::UnboundedReceiver<Instant>) {
    struct OnDrop(tokio::sync::mpsc::UnboundedSender<Instant>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            let _ = self.0.send(Instant::now());
        }
    }
    let (dropped, drops) = tokio::sync::mpsc::unbounded_channel();
    let mib = bytes::Bytes::from(vec![b'x'; 1 << 20]);
    let large = move || {
        let guard = OnDrop(dropped.clone());
        let mib = mib.clone();
        let chunks = futures::stream::iter(0..256).map(move |_| {
            let _held = &guard;
            Ok::<_, Infallible>(mib.clone())
        });
        async move { axum::body::Body::from_stream(chunks) }
    };
    let router = axum::Router::new().route("/large", axum::routing::get(large));
    (router, drops)
}

const LARGE: &[u8] = b"GET /large HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n";

fn write_timeout_300ms() -> Config {
    let mut config = Config::default();
    config.http.write_timeout_ms = 300;
    config
}

#[tokio::test]
async fn a_client_that_never_reads_a_large_response_is_cut_at_the_write_timeout() {
    let (router, mut drops) = large_route();
    let server = Server::serve(router, &write_timeout_300ms(), None).await;
    let mut client = Client::connect_with_recv_buffer(server.addr, 4096).await;
    client.send(LARGE).await;
    let sent = Instant::now();
    // Never read until the server has dropped the response.
    let dropped = timeout(Duration::from_secs(10), drops.recv())
        .await
        .expect("the response was dropped within 10 s")
        .unwrap();
    let held = dropped - sent;
    assert!(held >= AT_LEAST, "cut after {held:?}");
    println!("never-reading client: response held {held:?}");
    // What the kernel had buffered drains, then the connection has ended.
    let _ = client.closed().await;
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn a_slow_reader_that_keeps_reading_is_not_cut() {
    let (router, mut drops) = large_route();
    let mut config = Config::default();
    config.http.write_timeout_ms = 1000;
    let server = Server::serve(router, &config, None).await;
    let mut client = Client::connect(server.addr).await;
    client.send(LARGE).await;
    let started = Instant::now();
    // Up to 1 MiB every 100 ms, for 5 s (5 write timeouts): 50 MiB at most,
    // plus what the socket buffers hold, of 256 MiB, so the server's writes
    // wait on this reader throughout. The kernel
    // wakes a waiting writer only once a good part of its send buffer has
    // drained (about 2 MiB on loopback, measured: writes wait ~200 ms at
    // this pace), so the pace must drain that well within the timeout.
    let mut chunk = vec![0u8; 1 << 20];
    let mut total = 0;
    for i in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let n = timeout(BOUND, client.read.read(&mut chunk))
            .await
            .expect("data within the bound")
            .unwrap_or_else(|e| panic!("read {i}, after {total} bytes: {e}"));
        assert!(n > 0, "ended at read {i}, after {total} bytes");
        total += n;
    }
    let elapsed = started.elapsed();
    assert!(drops.try_recv().is_err(), "the response was dropped");
    println!("slow reader: {total} bytes in {elapsed:?}, not cut");
    drop(client);
    // The server's next write fails on the closed socket.
    timeout(BOUND, drops.recv()).await.unwrap().unwrap();
    server.stop().await;
}

#[tokio::test]
async fn one_client_holds_at_most_its_share_of_the_connections() {
    let server = Server::start(|c| {
        c.http.max_connections = 16;
        c.http.max_connections_per_client = 4;
        // The idle connections stay open for the whole test.
        c.http.header_read_timeout_ms = 60_000;
    })
    .await;
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(Client::connect(server.addr).await); // sends nothing
    }
    // A fifth from the same address: reset at once, not served.
    assert_eq!(
        Client::healthz_unless_refused(server.addr).await,
        None,
        "a connection past the client's share was served"
    );
    // Another client is served meanwhile.
    let mut other = Client::connect_from(server.addr, [127, 0, 0, 2]).await;
    other.send(HEALTHZ).await;
    let (status, _, _) = timeout(BOUND, other.response()).await.unwrap().unwrap();
    assert_eq!(status, 200);
    // One of the four closes: the first client gets a slot back (the
    // server notices the close asynchronously; bounded retries, each
    // refusal now held a second before its reset).
    drop(idle.pop());
    let deadline = Instant::now() + BOUND;
    loop {
        if Client::healthz_unless_refused(server.addr).await == Some(200) {
            break;
        }
        assert!(Instant::now() < deadline, "the slot was never given back");
        tokio::task::yield_now().await;
    }
    drop((idle, other));
    server.stop().await;
}

/// A client refused twice within seconds has its next connection held a
/// second, then reset — on time even while the connection table is full
/// (the server waits for a free slot, not for an accept).
#[tokio::test]
async fn a_held_refusal_is_reset_after_a_second_even_with_the_table_full() {
    let server = Server::start(|c| {
        c.http.max_connections = 2;
        c.http.max_connections_per_client = 1;
        c.http.header_read_timeout_ms = 60_000;
    })
    .await;
    let _first = Client::connect(server.addr).await; // its share
                                                     // Refused at once: the first refusal.
    assert_eq!(Client::healthz_unless_refused(server.addr).await, None);
    // Refused again: held.
    let held_from = Instant::now();
    let held = TcpStream::connect(server.addr).await;
    // Another client takes the last slot: the table is full.
    let mut other = Client::connect_from(server.addr, [127, 0, 0, 2]).await;
    other.send(HEALTHZ).await;
    let (status, _, _) = timeout(BOUND, other.response()).await.unwrap().unwrap();
    assert_eq!(status, 200);
    if let Ok(held) = held {
        let mut held = Client::on(held);
        let _ = held.closed().await;
    }
    let took = held_from.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "the held connection ended after {took:?}"
    );
    drop(other);
    server.stop().await;
}
