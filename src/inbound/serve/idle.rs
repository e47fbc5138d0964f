//! Idle connections, and the room they make when the table is full.
//!
//! Every served connection has a [`Conn`]: whether it is idle — no request
//! in the service (none since it was accepted, or since its last answer's
//! body was dropped: [`UntilIdle`]) and no write waiting for the client to
//! read ([`Watched`]: hyper flushes what it has before it waits, so nothing
//! of an answer is left unsent) — and since when, and a way to ask its task
//! to close it. Its client's entry in the table (`refusals.rs`) lists it.
//!
//! When the table is full, `Clients::make_room_for` (`refusals.rs`, with
//! [`longest_idle_of_the_most`]) picks, for a
//! connection whose client holds fewer connections than another, the
//! longest-idle connection of the client holding the most (one that holds
//! more than the newcomer's, an idle connection among them, not already
//! asked to close), and asks its task to close it. The task, between two
//! polls of hyper's connection, looks again: idle, the connection is
//! dropped (closed with a FIN, as the header timeout would have closed it a
//! little later; a request head not yet complete is dropped with it); busy
//! after all, it gets hyper's `graceful_shutdown` and closes after its
//! answer — no answer is ever cut. The freed slot goes to the connection
//! that asked for it.
//!
//! Why *strictly more*: the client whose connection was closed reconnects,
//! holding as many as before, and finds no client holding more than it
//! (each eviction moves a slot from a client holding more to one holding
//! fewer), so connections closed this way cannot chase each other round the
//! table; a client that reconnects waits for a slot like any other.

use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

/// One served connection, as its client's entry sees it.
pub(super) struct Conn {
    /// Microseconds from the table's epoch to when it went idle, plus one;
    /// 0 while a request is in the service.
    idle_since: AtomicU64,
    /// A write is waiting for the client to read.
    writing: AtomicBool,
    /// Asked to close (so it is not picked twice).
    evicted: AtomicBool,
    evict: Notify,
    epoch: Instant,
}

impl Conn {
    /// A connection accepted now: idle (no request yet).
    pub(super) fn new(epoch: Instant) -> Arc<Self> {
        let conn = Arc::new(Self {
            idle_since: AtomicU64::new(0),
            writing: AtomicBool::new(false),
            evicted: AtomicBool::new(false),
            evict: Notify::new(),
            epoch,
        });
        conn.idle();
        conn
    }

    /// A request entered the service.
    pub(super) fn busy(&self) {
        self.idle_since.store(0, Relaxed);
    }

    /// Its answer's body was dropped (written, or the connection ended).
    pub(super) fn idle(&self) {
        let since = Instant::now().duration_since(self.epoch).as_micros() as u64;
        self.idle_since.store(since + 1, Relaxed);
    }

    /// When it went idle (in the table's microseconds), if it is idle.
    fn idle_since(&self) -> Option<u64> {
        match self.idle_since.load(Relaxed) {
            0 => None,
            _ if self.writing.load(Relaxed) => None,
            since => Some(since),
        }
    }

    /// Whether it is idle: nothing in the service, nothing left to write.
    /// Asked by its own task between two polls of the connection, it is
    /// exact.
    pub(super) fn is_idle(&self) -> bool {
        self.idle_since().is_some()
    }

    /// Asks its task to close it (once).
    pub(super) fn evict(&self) {
        self.evicted.store(true, Relaxed);
        self.evict.notify_one();
    }

    /// Completes once the table asks for this connection to be closed.
    pub(super) async fn evicted(&self) {
        self.evict.notified().await;
    }
}

/// Of the clients holding more than `mine` connections — each given as
/// how many it holds and its served connections — the longest-idle
/// connection (not already asked to close) of the one holding the most that
/// has one.
pub(super) fn longest_idle_of_the_most<'a>(
    mine: usize,
    clients: impl Iterator<Item = (usize, &'a [Arc<Conn>])>,
) -> Option<&'a Arc<Conn>> {
    let mut victim: Option<(usize, u64, &Arc<Conn>)> = None;
    for (open, conns) in clients.filter(|&(open, _)| open > mine) {
        if victim.is_some_and(|(most, _, _)| open < most) {
            continue;
        }
        let oldest = conns
            .iter()
            .filter(|conn| !conn.evicted.load(Relaxed))
            .filter_map(|conn| Some((conn.idle_since()?, conn)))
            .min_by_key(|&(since, _)| since);
        if let Some((since, conn)) = oldest {
            let better =
                victim.is_none_or(|(most, then, _)| open > most || (open == most && since < then));
            if better {
                victim = Some((open, since, conn));
            }
        }
    }
    victim.map(|(_, _, conn)| conn)
}

/// A connection's stream, marking whether a write waits for the client.
pub(super) struct Watched<T> {
    io: T,
    conn: Arc<Conn>,
}

impl<T> Watched<T> {
    /// `io`, its writes watched for `conn`.
    pub(super) fn new(io: T, conn: Arc<Conn>) -> Self {
        Self { io, conn }
    }

    fn mark<R>(&self, result: Poll<R>) -> Poll<R> {
        self.conn.writing.store(result.is_pending(), Relaxed);
        result
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.io).poll_write(cx, buf);
        self.mark(result)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.mark(result)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.io).poll_flush(cx);
        self.mark(result)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.io).poll_shutdown(cx);
        self.mark(result)
    }
}

/// An answer's body that marks its connection idle when dropped (hyper
/// drops it once it is written, or when the connection ends).
pub(super) struct UntilIdle {
    body: Body,
    conn: Arc<Conn>,
}

impl UntilIdle {
    /// `body`, marking `conn` idle when dropped.
    pub(super) fn wrap(body: Body, conn: Arc<Conn>) -> Body {
        Body::new(Self { body, conn })
    }
}

impl Drop for UntilIdle {
    fn drop(&mut self) {
        self.conn.idle();
    }
}

impl http_body::Body for UntilIdle {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
