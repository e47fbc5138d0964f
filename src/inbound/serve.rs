//! Serving the gateway over TCP with bounds on slow and idle clients.
//!
//! [`serve`] is `axum::serve` with the limits a public listener needs:
//!
//! - **At most `http.max_connections` connections served**, each holding a
//!   permit of a semaphore until it ends. The accept loop accepts whether
//!   or not a permit is free, so that it sees who is asking.
//! - **At most `http.max_connections_per_client` of them from one client**,
//!   keyed as the rate limiter keys clients (the address masked to
//!   `rate_limit.ipv4_prefix` / `ipv6_prefix`); a peer in
//!   `rate_limit.trusted_proxies` has no share (it carries everyone). The
//!   share counts a client's connections served and waiting. A connection
//!   past its client's share is refused as soon as it is accepted, so one
//!   address that keeps reconnecting idle sockets cannot hold the whole
//!   table; a refusal costs an accept and a reset, and a client refused
//!   again within 10 s waits a second for its reset, so one that reconnects
//!   as fast as it is refused is slowed down
//!   (`src/inbound/serve/refusals.rs`).
//! - **Fresh clients first when the table is full.** A connection that
//!   finds every permit taken waits for one, accepted but not read
//!   (`src/inbound/serve/waiting.rs`). If its client then holds fewer
//!   connections than another client with an idle connection (no request
//!   in the service since it was accepted or since its last answer, and
//!   none of that answer waiting to be written; a request head not yet
//!   complete does not count), the longest-idle connection of the client
//!   holding the most is closed for it (a FIN, as the header timeout would
//!   close it; one found busy after all closes after its answer, through
//!   hyper's graceful shutdown: no answer is cut;
//!   `src/inbound/serve/idle.rs`), and the slot is its. Freed slots go
//!   first to clients holding no other connection, then to those
//!   connections, then to the rest, each line in order. So a table held by
//!   idle connections, reopened as they are closed, costs a fresh client
//!   one close of someone's idle connection (which costs its holder only a
//!   reconnect), not a wait for the header timeout; the client whose
//!   connection was closed holds as many as before when it reconnects, and
//!   waits like any other. At most 128 connections wait; past that a fresh
//!   client's takes the place of the newest of the rest, else of the newest
//!   of those that made room (so only 128 fresh clients waiting refuse a
//!   fresh one), and the others are refused as past a share (reset, or
//!   held and reset). The gateway's descriptors: `http.max_connections`,
//!   128 waiting, 256 held.
//!   The listen backlog is the listener's own: `TcpListener::bind` gives
//!   128, which a flood of connections (even ones refused at once) can fill,
//!   and a handshake that finds it full is dropped (the client sends its
//!   SYN again a second later). Bind with a larger one — the gateway
//!   listens with 1,024 (`TcpSocket::listen`).
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
//!   (`src/inbound/serve/write_timeout.rs`): a write that stays pending that long
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
//! - **Upgrades** (WebSockets, `graphql/socket.rs`): hyper serves each
//!   connection `with_upgrades`; a request asking for one carries the
//!   connection's place in the table (`ConnectionLease`), which the socket it
//!   becomes keeps. The socket therefore counts against
//!   `http.max_connections` and its client's share for as long as it lives,
//!   marks itself busy while it holds a subscription (idle without one: it
//!   may then be closed for a newcomer, as an idle keep-alive connection is),
//!   and is closed when the server stops; writes keep the write timeout.
//! - **Graceful shutdown** ([`Serve::with_graceful_shutdown`]): on the
//!   signal the listener is closed, the waiting connections are closed,
//!   every served one gets hyper's graceful shutdown (idle ones close,
//!   in-flight requests finish), and the server completes once every permit
//!   is back.
//!
//! Only HTTP/1 is served (the gateway's axum is built with `http1` only).
//!
//! A refusal that answers before the request body was read carries
//! `Connection: close` ([`Rejection::unread`](crate::error::Rejection::unread)) rather than draining the body:
//! draining would read up to `max_body_bytes` for a client that is being
//! refused (a rate-limited one included), or wait for a slow one, while
//! closing costs nothing. hyper then ends the connection after the response
//! (a FIN after the response's last byte), and a well-behaved client opens a
//! new one for its next request instead of writing into a closed connection.

use crate::config::Config;
use crate::inbound::identity::{ClientPrefix, TrustedProxies};
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::response::Response;
use futures::future::BoxFuture;
use http::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use idle::{UntilIdle, Watched};
use refusals::{Admission, Clients, Held};
use std::convert::Infallible;
use std::future::{Future, IntoFuture};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tower::{Service, ServiceExt};
use waiting::{Accepted, Line, Waiting};
use write_timeout::WriteTimeout;

mod idle;
mod refusals;
mod waiting;
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
/// let server = fanout_budget::inbound::serve(listener, app, &config);
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
        clients: Arc::new(Clients::new(
            http.max_connections_per_client,
            ClientPrefix::new(r.ipv4_prefix, r.ipv6_prefix),
            TrustedProxies::new(&r.trusted_proxies),
        )),
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
            listener,
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
        let (stopping, stop) = watch::channel(false);
        let serving = Serving {
            http1,
            service,
            write_timeout,
            stop,
        };
        let mut signal = std::pin::pin!(signal);
        let mut held = Held::new();
        let mut waiting = Waiting::new();
        loop {
            tokio::select! {
                // A freed slot goes to the waiting first.
                permit = permits.clone().acquire_owned(), if !waiting.is_empty() => {
                    let permit = permit.expect("the semaphore is never closed");
                    if let Some(next) = waiting.pop() {
                        serving.spawn(next, permit);
                    }
                }
                accepted = accept(&listener) => {
                    let Some((stream, peer)) = accepted else { continue };
                    let slot = match clients.admit(peer.ip()) {
                        Admission::Admitted(slot) => slot,
                        Admission::Reset => {
                            refusals::reset(stream);
                            continue;
                        }
                        Admission::Hold => {
                            held.hold(stream);
                            continue;
                        }
                    };
                    let accepted = Accepted { stream, peer, slot };
                    if waiting.is_empty() {
                        if let Ok(permit) = permits.clone().try_acquire_owned() {
                            serving.spawn(accepted, permit);
                            continue;
                        }
                    }
                    // The table is full: it waits, or is refused.
                    let alone = accepted.slot.alone();
                    if !waiting.has_room(alone) {
                        refuse(&clients, &mut held, accepted);
                        continue;
                    }
                    // Its client holding fewer than another, that one's
                    // longest-idle connection is closed for it.
                    let made_room = clients.make_room_for(accepted.slot.key());
                    let line = match (alone, made_room) {
                        (true, _) => Line::Fresh,
                        (false, true) => Line::MadeRoom,
                        (false, false) => Line::Rest,
                    };
                    if let Some(displaced) = waiting.push(accepted, line) {
                        refuse(&clients, &mut held, displaced);
                    }
                }
                () = held.release() => {}
                () = &mut signal => break,
            }
        }
        drop((listener, held, waiting));
        // Every connection closes when idle, or after its answer; each
        // holds a permit until it has ended.
        let _ = stopping.send(true);
        let all = u32::try_from(max_connections).unwrap_or(u32::MAX);
        let _ = permits.acquire_many(all).await;
        Ok(())
    }
}

/// How a connection is served: hyper's HTTP/1 connection on the stream
/// (under the write timeout), the service with the peer's address and the
/// connection's idle marks, closed gracefully when the table asks for its
/// slot or the server stops.
struct Serving<S> {
    http1: hyper::server::conn::http1::Builder,
    service: S,
    write_timeout: Duration,
    /// True once the server stops.
    stop: watch::Receiver<bool>,
}

impl<S> Serving<S>
where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    fn spawn(&self, accepted: Accepted, permit: OwnedSemaphorePermit) {
        let Accepted {
            stream,
            peer,
            mut slot,
        } = accepted;
        let conn = slot.serve();
        // The permit and the client's share, held as long as the connection
        // lives — past an upgrade too, by the WebSocket it became.
        let hold = Arc::new(Hold {
            _permit: permit,
            _slot: slot,
            conn: conn.clone(),
            stop: self.stop.clone(),
        });
        let (busy, idle, upgrade) = (conn.clone(), conn.clone(), hold.clone());
        let service = self
            .service
            .clone()
            .map_request(move |request: Request<Incoming>| {
                busy.busy();
                let mut request = request.map(Body::new);
                request.extensions_mut().insert(ConnectInfo(peer));
                if request.headers().contains_key(http::header::UPGRADE) {
                    request
                        .extensions_mut()
                        .insert(ConnectionLease(upgrade.clone()));
                }
                request
            })
            .map_response(move |response: Response| {
                response.map(|body| UntilIdle::wrap(body, idle.clone()))
            });
        let stream = WriteTimeout::new(stream, self.write_timeout);
        let stream = TokioIo::new(Watched::new(stream, conn.clone()));
        let connection = self
            .http1
            .serve_connection(stream, TowerToHyperService::new(service))
            .with_upgrades();
        let mut stop = self.stop.clone();
        tokio::spawn(async move {
            let mut connection = std::pin::pin!(connection);
            let mut closing = false;
            let ended = loop {
                tokio::select! {
                    ended = connection.as_mut() => break ended,
                    () = conn.evicted(), if !closing => {
                        // Its slot is wanted: idle, it is dropped now.
                        if conn.is_idle() {
                            break Ok(());
                        }
                    }
                    _ = stop.wait_for(|stop| *stop), if !closing => {}
                }
                // Closes now if idle, else after the answer in progress.
                connection.as_mut().graceful_shutdown();
                closing = true;
            };
            if let Err(e) = ended {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            drop(hold);
        });
    }
}

/// A served connection's permit and its client's share, with its idle marks
/// and the server's stop signal: dropped when the connection and every
/// WebSocket it became have ended.
struct Hold {
    _permit: OwnedSemaphorePermit,
    _slot: refusals::ClientSlot,
    conn: Arc<idle::Conn>,
    stop: watch::Receiver<bool>,
}

/// What a request that asks for an upgrade carries in its extensions when
/// [`serve`] serves it: the connection's place in the table. The WebSocket
/// the connection becomes holds it, so the connection still counts against
/// `http.max_connections` and its client's share, and is closed when the
/// server stops or, idle, when the table needs its slot.
#[derive(Clone)]
pub(crate) struct ConnectionLease(Arc<Hold>);

impl std::fmt::Debug for ConnectionLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionLease").finish_non_exhaustive()
    }
}

impl ConnectionLease {
    /// The socket has work (a subscription): not idle.
    pub(crate) fn busy(&self) {
        self.0.conn.busy();
    }

    /// The socket has no subscription: idle, as a keep-alive connection
    /// between requests.
    pub(crate) fn idle(&self) {
        self.0.conn.idle();
    }

    /// Completes when the table asks for this connection's slot (it is
    /// closed if idle) or the server stops.
    pub(crate) async fn wanted(&self) -> Wanted {
        let mut stop = self.0.stop.clone();
        tokio::select! {
            () = self.0.conn.evicted() => Wanted::Slot,
            _ = stop.wait_for(|stop| *stop) => Wanted::Stop,
        }
    }
}

/// Why the server wants a socket's connection back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wanted {
    /// The table is full and this connection is idle: its slot.
    Slot,
    /// The server is stopping.
    Stop,
}

/// Refuses `accepted`, which found the table and its waiting line full.
fn refuse(clients: &Clients, held: &mut Held, accepted: Accepted) {
    match clients.refuse(accepted.slot) {
        Admission::Hold => held.hold(accepted.stream),
        Admission::Reset | Admission::Admitted(_) => refusals::reset(accepted.stream),
    }
}

/// The next connection, or `None` after an error. Accept errors are handled
/// as axum's listener handles them: at once for a connection's own failure,
/// after a second (logged) for anything else, `EMFILE` included.
async fn accept(listener: &TcpListener) -> Option<(TcpStream, SocketAddr)> {
    match listener.accept().await {
        Ok(accepted) => Some(accepted),
        Err(e) if is_connection_error(&e) => None,
        Err(e) => {
            tracing::error!("accept error: {e}");
            tokio::time::sleep(Duration::from_secs(1)).await;
            None
        }
    }
}

/// A connection's own failure, which says nothing of the listener.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
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
