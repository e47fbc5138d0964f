//! Which connection `fanout_budget::inbound::serve` closes when its table is
//! full and a client holding fewer connections arrives: the longest-idle
//! one of the client holding the most — never one with a request in the
//! service, never one with an answer still being written, and none when
//! no client holds more than the newcomer's. Real TCP on loopback
//! (`127.0.0.2` is another client); the table is two or three connections.
#![cfg(target_os = "linux")]

use fanout_budget::Config;
use std::future::IntoFuture;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::mpsc;
use tokio::time::timeout;

/// What "soon" means here.
const BOUND: Duration = Duration::from_secs(5);
/// How long a client that must wait is watched not being served.
const NOT_YET: Duration = Duration::from_millis(500);
const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nhost: t\r\n\r\n";
/// The size of `/big`'s answer: far more than the socket buffers of a
/// client with a 4 KiB receive buffer hold.
const BIG: usize = 8 << 20;

/// A server with a table of `max_connections` (idle connections are kept a
/// minute), aborted on drop; the times `/big`'s bodies were dropped.
struct Server {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    big_dropped: mpsc::UnboundedReceiver<()>,
    /// A `/hang` request reached the service.
    hanging: mpsc::UnboundedReceiver<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `/healthz`; `/big`, [`BIG`] bytes in one chunk, its body ending with it
/// (hyper drops the body as soon as it has taken the chunk; the bytes are
/// written after, as the client reads); `/hang`, never answered.
async fn server(max_connections: usize) -> Server {
    /// One chunk; says when it is dropped.
    struct Once(Option<bytes::Bytes>, mpsc::UnboundedSender<()>);
    impl Drop for Once {
        fn drop(&mut self) {
            let _ = self.1.send(());
        }
    }
    impl http_body::Body for Once {
        type Data = bytes::Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
            std::task::Poll::Ready(self.0.take().map(|chunk| Ok(http_body::Frame::data(chunk))))
        }
        fn is_end_stream(&self) -> bool {
            self.0.is_none()
        }
        fn size_hint(&self) -> http_body::SizeHint {
            http_body::SizeHint::with_exact(self.0.as_ref().map_or(0, |c| c.len() as u64))
        }
    }
    let (dropped, big_dropped) = mpsc::unbounded_channel();
    let big = move || {
        let body = Once(Some(bytes::Bytes::from(vec![b'x'; BIG])), dropped.clone());
        async move { axum::body::Body::new(body) }
    };
    let (entered, hanging) = mpsc::unbounded_channel();
    let hang = move || {
        let _ = entered.send(());
        std::future::pending::<()>()
    };
    let router = axum::Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .route("/big", axum::routing::get(big))
        .route("/hang", axum::routing::get(hang));
    let mut config = Config::default();
    config.http.max_connections = max_connections;
    config.http.header_read_timeout_ms = 60_000;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(fanout_budget::inbound::serve(listener, router, &config).into_future());
    Server {
        addr,
        task,
        big_dropped,
        hanging,
    }
}

async fn connect_from(addr: SocketAddr, from: [u8; 4], recv_buffer: Option<u32>) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    if let Some(bytes) = recv_buffer {
        socket.set_recv_buffer_size(bytes).unwrap();
    }
    socket.bind(SocketAddr::from((from, 0))).unwrap();
    socket.connect(addr).await.unwrap()
}

/// Reads one answer to `/healthz` (its head and `ok`).
async fn healthz_answer(stream: &mut TcpStream) -> String {
    let mut answer = Vec::new();
    let mut chunk = [0u8; 1024];
    while !answer.ends_with(b"\r\n\r\nok") {
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(
            n > 0,
            "closed before the answer: {:?}",
            String::from_utf8_lossy(&answer)
        );
        answer.extend_from_slice(&chunk[..n]);
    }
    String::from_utf8_lossy(&answer)
        .lines()
        .next()
        .unwrap()
        .to_string()
}

/// Whether the server ended `stream` with a clean EOF (within [`BOUND`]).
async fn closed_cleanly(stream: &mut TcpStream) -> bool {
    let mut chunk = [0u8; 1024];
    timeout(BOUND, stream.read(&mut chunk))
        .await
        .expect("closed within the bound")
        .is_ok_and(|n| n == 0)
}

/// A client holding two connections, one idle keep-alive (served first) and
/// one that sent nothing: a fresh client takes the place of the
/// longest-idle, closed cleanly; the other stays open and is served.
#[tokio::test(flavor = "current_thread")]
async fn a_fresh_client_takes_the_slot_of_the_longest_idle_connection_of_the_biggest_holder() {
    let server = server(2).await;
    let mut keep_alive = connect_from(server.addr, [127, 0, 0, 1], None).await;
    keep_alive.write_all(HEALTHZ).await.unwrap();
    assert_eq!(healthz_answer(&mut keep_alive).await, "HTTP/1.1 200 OK");
    let mut silent = connect_from(server.addr, [127, 0, 0, 1], None).await;

    let mut fresh = connect_from(server.addr, [127, 0, 0, 2], None).await;
    fresh.write_all(HEALTHZ).await.unwrap();
    let served = timeout(BOUND, healthz_answer(&mut fresh)).await;
    assert_eq!(
        served.expect("the fresh client was served"),
        "HTTP/1.1 200 OK"
    );
    assert!(
        closed_cleanly(&mut keep_alive).await,
        "the idle keep-alive connection was not closed cleanly"
    );
    // The other was left alone.
    silent.write_all(HEALTHZ).await.unwrap();
    let served = timeout(BOUND, healthz_answer(&mut silent)).await;
    assert_eq!(
        served.expect("the silent connection was served"),
        "HTTP/1.1 200 OK"
    );
}

/// A client holding the table with one request in the service and one
/// answer still being written (its body already ended, its bytes waiting
/// for the client to read): neither is closed for a fresh client, which
/// waits; the answer arrives whole; once that connection closes, the fresh
/// client is served.
#[tokio::test(flavor = "current_thread")]
async fn an_answer_in_progress_or_still_being_written_is_never_closed_for_a_fresh_client() {
    let mut server = server(2).await;
    let mut writing = connect_from(server.addr, [127, 0, 0, 1], Some(4096)).await;
    writing
        .write_all(b"GET /big HTTP/1.1\r\nhost: t\r\n\r\n")
        .await
        .unwrap();
    // Its body has ended and is dropped (hyper took the one chunk): the
    // connection has no request in the service, but the bytes wait for
    // this client, which does not read yet.
    timeout(BOUND, server.big_dropped.recv())
        .await
        .expect("the big answer's body ended")
        .unwrap();
    let mut hanging = connect_from(server.addr, [127, 0, 0, 1], None).await;
    hanging
        .write_all(b"GET /hang HTTP/1.1\r\nhost: t\r\n\r\n")
        .await
        .unwrap();
    timeout(BOUND, server.hanging.recv())
        .await
        .expect("the hanging request reached the service")
        .unwrap();

    let mut fresh = connect_from(server.addr, [127, 0, 0, 2], None).await;
    fresh.write_all(HEALTHZ).await.unwrap();
    let early = timeout(NOT_YET, healthz_answer(&mut fresh)).await;
    assert!(
        early.is_err(),
        "served while every slot was busy: {early:?}"
    );

    // The big answer, whole.
    let mut answer = Vec::new();
    let mut chunk = vec![0u8; 1 << 16];
    let whole = loop {
        let n = timeout(BOUND, writing.read(&mut chunk))
            .await
            .expect("the big answer kept coming")
            .expect("the big answer's connection was not reset");
        answer.extend_from_slice(&chunk[..n]);
        let head = answer.windows(4).position(|w| w == b"\r\n\r\n");
        if let Some(head) = head.filter(|&head| answer.len() >= head + 4 + BIG) {
            break answer.len() - head - 4;
        }
        assert!(n > 0, "the big answer was cut after {} bytes", answer.len());
    };
    assert_eq!(whole, BIG);
    drop(writing);
    let served = timeout(BOUND, healthz_answer(&mut fresh)).await;
    assert_eq!(
        served.expect("served once a slot was free"),
        "HTTP/1.1 200 OK"
    );
    drop(hanging);
}

/// Two clients holding one idle connection each: a third, holding as many
/// as they do once it connects, closes neither and waits for a slot (so
/// clients closing each other's connections cannot chase round the table).
#[tokio::test(flavor = "current_thread")]
async fn no_connection_is_closed_for_a_client_holding_as_many() {
    let server = server(2).await;
    let mut first = connect_from(server.addr, [127, 0, 0, 1], None).await;
    let _second = connect_from(server.addr, [127, 0, 0, 2], None).await;
    let mut third = connect_from(server.addr, [127, 0, 0, 3], None).await;
    third.write_all(HEALTHZ).await.unwrap();
    let early = timeout(NOT_YET, healthz_answer(&mut third)).await;
    assert!(early.is_err(), "served past the table: {early:?}");
    // The first is still open and served.
    first.write_all(HEALTHZ).await.unwrap();
    assert_eq!(healthz_answer(&mut first).await, "HTTP/1.1 200 OK");
    drop(first);
    let served = timeout(BOUND, healthz_answer(&mut third)).await;
    assert_eq!(
        served.expect("served once a slot was free"),
        "HTTP/1.1 200 OK"
    );
}
