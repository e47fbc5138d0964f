//! Serving the gateway over TCP with bounds on slow and idle clients.
//!
//! [`serve`] is `axum::serve` with the limits a public listener needs:
//!
//! - **At most `http.max_connections` connections.** A permit of a
//!   semaphore is taken *before* `accept`, and given back when the
//!   connection ends; past the cap, new connections wait in the kernel's
//!   listen backlog (completed handshakes cost no file descriptor of ours
//!   until accepted) instead of exhausting the process's descriptors.
//! - **At most `http.max_connections_per_client` of them from one client**,
//!   keyed as the rate limiter keys clients (the address masked to
//!   `rate_limit.ipv4_prefix` / `ipv6_prefix`); a peer in
//!   `rate_limit.trusted_proxies` has no share (it carries everyone). A
//!   connection past its client's share is closed as soon as it is
//!   accepted, so one address that keeps reconnecting idle sockets cannot
//!   hold the whole table.
//! - **Headers within `http.header_read_timeout_ms`.** hyper's HTTP/1
//!   connection (`header_read_timeout`, on hyper-util's tokio timer) closes a
//!   connection whose request head is not complete in time. hyper arms that
//!   timer whenever it waits for a request head — on a new connection and
//!   also as soon as a keep-alive connection goes idle after a response
//!   (`State::idle` asks for a read, which starts the timer) — so an idle
//!   keep-alive connection is closed after the same timeout.
//! - **Responses written with progress every `http.write_timeout_ms`.**
//!   hyper has no write timeout: a client that never reads its response
//!   would pin the response in memory for as long as it keeps the socket
//!   open. Each connection's stream is wrapped in a `WriteTimeout`
//!   (`src/serve/write_timeout.rs`): a write that stays pending that long
//!   ends the connection, and everything it holds is dropped.
//! - **Bodies** are bounded where they are read, in
//!   [`FanoutGraphQL`](crate::FanoutGraphQL): the whole body within
//!   `min(http.body_read_timeout_ms, time left before the deadline)`, else
//!   408 `REQUEST_TIMEOUT` with `Connection: close`. `Expect:
//!   100-continue` is answered when the body is first read, so a client that
//!   then sends nothing is bounded by the same timeout.
//! - **Connect info.** Each request carries `ConnectInfo<SocketAddr>` (the
//!   TCP peer), as axum's `into_make_service_with_connect_info` gives, so the
//!   rate limiter keys by the peer.
//! - **Graceful shutdown** ([`Serve::with_graceful_shutdown`]): on the
//!   signal the listener is closed, idle connections are closed, in-flight
//!   requests finish (hyper-util's `GracefulShutdown`).
//!
//! Only HTTP/1 is served (the gateway's axum is built with `http1` only).
//!
//! A refusal that answers before the request body was read carries
//! `Connection: close` ([`Rejection::unread`](crate::Rejection::unread)) rather than draining the body:
//! draining would read up to `max_body_bytes` for a client that is being
//! refused (a rate-limited one included), or wait for a slow one, while
//! closing costs nothing. hyper then ends the connection after the response
//! (a FIN after the response's last byte), and a well-behaved client opens a
//! new one for its next request instead of writing into a closed connection.

use crate::config::Config;
use crate::identity::{ClientPrefix, TrustedProxies};
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::response::Response;
use futures::future::BoxFuture;
use http::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::{Future, IntoFuture};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::{Service, ServiceExt};
use write_timeout::WriteTimeout;

mod write_timeout;

/// Serves `service` (an axum `Router`, or any service of the same shape) on
/// `listener` under `config`'s connection limits: `http.max_connections`,
/// `http.max_connections_per_client` (clients keyed as `[rate_limit]` keys
/// them), `http.header_read_timeout_ms` and `http.write_timeout_ms` (see
/// the module docs).
///
/// Await the result to serve until the process ends, or call
/// [`Serve::with_graceful_shutdown`] first.
///
/// ```
/// use fanout_budget::Config;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> std::io::Result<()> {
/// let config = Config::default();
/// let app = axum::Router::new().route("/healthz", axum::routing::get(|| async { "ok" }));
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// let server = fanout_budget::serve(listener, app, &config);
/// let addr = server.local_addr()?;
/// let stop = async {};  // e.g. tokio::signal::ctrl_c()
/// server.with_graceful_shutdown(stop).await?;
/// # let _ = addr; Ok(()) }
/// ```
pub fn serve<S>(listener: TcpListener, service: S, config: &Config) -> Serve<S>
where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    let http = &config.http;
    let r = &config.rate_limit;
    Serve {
        listener,
        service,
        header_read_timeout: http.header_read_timeout(),
        write_timeout: http.write_timeout().max(Duration::from_millis(1)),
        max_connections: http.max_connections.max(1),
        clients: Arc::new(Clients {
            max: http.max_connections_per_client.max(1),
            prefix: ClientPrefix::new(r.ipv4_prefix, r.ipv6_prefix),
            proxies: TrustedProxies::new(&r.trusted_proxies),
            open: Mutex::new(HashMap::new()),
        }),
    }
}

/// Each client's share of the connection table.
struct Clients {
    max: usize,
    prefix: ClientPrefix,
    proxies: TrustedProxies,
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One client's connection, counted while it is open.
struct ClientSlot {
    clients: Arc<Clients>,
    key: Option<IpAddr>,
}

impl Clients {
    /// A slot for a connection from `peer`, unless its client has its share.
    fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<ClientSlot> {
        if self.proxies.contains(peer) {
            return Some(ClientSlot {
                clients: self.clone(),
                key: None,
            });
        }
        let key = self.prefix.key(peer);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(key).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(ClientSlot {
            clients: self.clone(),
            key: Some(key),
        })
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let Some(key) = self.key else { return };
        let mut open = self.clients.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&key) {
            *count -= 1;
            if *count == 0 {
                open.remove(&key);
            }
        }
    }
}

/// The server [`serve`] returns; await it (`IntoFuture`).
#[must_use = "a server does nothing until it is awaited"]
pub struct Serve<S> {
    listener: TcpListener,
    service: S,
    header_read_timeout: Duration,
    write_timeout: Duration,
    max_connections: usize,
    clients: Arc<Clients>,
}

impl<S> std::fmt::Debug for Serve<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Serve")
            .field("listener", &self.listener)
            .field("max_connections", &self.max_connections)
            .finish_non_exhaustive()
    }
}

impl<S> Serve<S>
where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    /// The address the listener is bound to.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `signal` completes; then stops accepting (the listener
    /// is closed), closes idle connections, and completes once every
    /// in-flight request has been answered. Bound that wait yourself (the
    /// gateway allows the request deadline plus a second).
    pub fn with_graceful_shutdown<F>(self, signal: F) -> impl Future<Output = io::Result<()>>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.run(signal)
    }

    async fn run<F: Future<Output = ()>>(self, signal: F) -> io::Result<()> {
        let Self {
            mut listener,
            service,
            header_read_timeout,
            write_timeout,
            max_connections,
            clients,
        } = self;
        let mut http1 = hyper::server::conn::http1::Builder::new();
        http1
            .timer(TokioTimer::new())
            .header_read_timeout(header_read_timeout);
        let permits = Arc::new(Semaphore::new(max_connections));
        let graceful = GracefulShutdown::new();
        let mut signal = std::pin::pin!(signal);
        loop {
            // The permit first: past the cap, connections stay in the backlog.
            let permit = tokio::select! {
                permit = permits.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
                () = &mut signal => break,
            };
            let (stream, peer) = tokio::select! {
                // axum's listener retries accept errors (EMFILE included).
                accepted = axum::serve::Listener::accept(&mut listener) => accepted,
                () = &mut signal => break,
            };
            // Past its client's share: closed at once (dropped), the
            // connection slot given back.
            let Some(client) = clients.admit(peer.ip()) else {
                tracing::debug!(%peer, "connection refused: the client has its share open");
                continue;
            };
            let service = service
                .clone()
                .map_request(move |request: Request<Incoming>| {
                    let mut request = request.map(Body::new);
                    request.extensions_mut().insert(ConnectInfo(peer));
                    request
                });
            let stream = TokioIo::new(WriteTimeout::new(stream, write_timeout));
            let connection = http1.serve_connection(stream, TowerToHyperService::new(service));
            let connection = graceful.watch(connection);
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                drop((permit, client));
            });
        }
        drop(listener);
        graceful.shutdown().await;
        Ok(())
    }
}

impl<S> IntoFuture for Serve<S>
where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Output = io::Result<()>;
    type IntoFuture = BoxFuture<'static, io::Result<()>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.run(std::future::pending()))
    }
}
