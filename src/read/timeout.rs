//! The timed send: when a read is cut, and the send under that limit.
//!
//! A read sent (or joined) at `now` is cut at
//! `min(now + read_timeout, deadline)`: `UPSTREAM_TIMEOUT` when the read
//! timeout cut it, `DEADLINE_EXCEEDED` when the request's deadline did. A
//! coalesced read's own send is bounded by the read timeout alone (the
//! others wait for it too). On the wire, the host's metrics count the read:
//! its in-flight gauge while it runs, its latency, its outcome — and a read
//! dropped unfinished (its request was cancelled) as `cancelled`.

use crate::error::ReadError;
use crate::metrics::HostMetrics;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;

/// When a read is cut, and by what.
#[derive(Clone, Copy)]
pub(crate) struct Limit {
    /// When it was sent (or joined).
    pub(crate) started: Instant,
    /// `min(started + read_timeout, deadline)`.
    pub(crate) until: Instant,
    /// Whether `until` is the deadline.
    by_deadline: bool,
    read_timeout: Duration,
}

impl Limit {
    /// `min(now + read_timeout, deadline)`.
    pub(crate) fn new(now: Instant, read_timeout: Duration, deadline: Instant) -> Self {
        let by_read_timeout = now + read_timeout;
        Self {
            started: now,
            until: by_read_timeout.min(deadline),
            by_deadline: deadline < by_read_timeout,
            read_timeout,
        }
    }

    /// `now + read_timeout`, whatever any request's deadline (a shared
    /// read's own send).
    pub(crate) fn read_timeout(now: Instant, read_timeout: Duration) -> Self {
        Self {
            started: now,
            until: now + read_timeout,
            by_deadline: false,
            read_timeout,
        }
    }

    /// `UPSTREAM_TIMEOUT`, or `DEADLINE_EXCEEDED` when the deadline cut it.
    pub(crate) fn error(&self, host: &str) -> ReadError {
        if self.by_deadline {
            ReadError::DeadlineExceeded
        } else {
            ReadError::UpstreamTimeout {
                host: host.to_string(),
                timeout_ms: self.read_timeout.as_millis() as u64,
            }
        }
    }

    /// [`error`](Self::error) for a call to `host` cut at `until`, counted
    /// in the host's metrics `m`.
    pub(crate) fn elapsed(&self, m: &HostMetrics, host: &str) -> ReadError {
        m.timeouts.increment(1);
        let counter = if self.by_deadline {
            &m.deadline
        } else {
            &m.timeout
        };
        counter.increment(1);
        self.error(host)
    }
}

/// `fetch` (a read to `host` on the wire) until `limit.until`, its response
/// made a result by `answer`, then seen by `finish`; `m`, the host's
/// metrics, count it from now. One future holding each part once, polled
/// in place: no layer of its own moves it (an `async fn` holds its
/// arguments twice; a `map` moves the whole future out as it ends).
pub(crate) fn send<'m, F, R, T, A, E>(
    fetch: F,
    m: &'m HostMetrics,
    host: &'m str,
    limit: Limit,
    answer: A,
    finish: E,
) -> Sent<'m, F, A, E>
where
    F: Future<Output = Result<R, ReadError>>,
    A: FnOnce(R) -> Result<T, ReadError>,
    E: FnOnce(&Result<T, ReadError>),
{
    Sent {
        timed: tokio::time::timeout_at(limit.until, fetch),
        end: Some(End {
            // Dropped with the future if it never ends: `cancelled`.
            wire: Wire::start(m, limit.started),
            answer,
            finish,
        }),
        m,
        host,
        limit,
    }
}

pin_project_lite::pin_project! {
    /// A read on the wire until its limit ([`send`]).
    pub(crate) struct Sent<'m, F, A, E> {
        #[pin]
        timed: tokio::time::Timeout<F>,
        end: Option<End<'m, A, E>>,
        m: &'m HostMetrics,
        host: &'m str,
        limit: Limit,
    }
}

/// What a read on the wire does as it ends.
pub(crate) struct End<'m, A, E> {
    wire: Wire<'m>,
    answer: A,
    finish: E,
}

impl<F, R, T, A, E> Future for Sent<'_, F, A, E>
where
    F: Future<Output = Result<R, ReadError>>,
    A: FnOnce(R) -> Result<T, ReadError>,
    E: FnOnce(&Result<T, ReadError>),
{
    type Output = Result<T, ReadError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let sent = std::task::ready!(this.timed.poll(cx));
        let End {
            mut wire,
            answer,
            finish,
        } = this.end.take().expect("polled after it ended");
        wire.finished = true;
        let (m, host) = (*this.m, *this.host);
        let outcome = match sent {
            Ok(sent) => {
                let outcome = sent.and_then(answer);
                let counter = if outcome.is_ok() { &m.ok } else { &m.error };
                counter.increment(1);
                outcome
            }
            Err(_elapsed) => Err(this.limit.elapsed(m, host)),
        };
        // The host's gauge and latency first, as the read's end.
        drop(wire);
        finish(&outcome);
        Poll::Ready(outcome)
    }
}

/// One read on the wire, as the host's metrics see it: the in-flight gauge
/// is held while it exists, and a read dropped before it finished counts as
/// `cancelled`.
struct Wire<'a> {
    metrics: &'a HostMetrics,
    started: Instant,
    finished: bool,
}

impl<'a> Wire<'a> {
    fn start(metrics: &'a HostMetrics, started: Instant) -> Self {
        metrics.in_flight.increment(1.0);
        Self {
            metrics,
            started,
            finished: false,
        }
    }
}

impl Drop for Wire<'_> {
    fn drop(&mut self) {
        self.metrics.in_flight.decrement(1.0);
        self.metrics
            .latency
            .record(self.started.elapsed().as_secs_f64());
        if !self.finished {
            self.metrics.cancelled.increment(1);
        }
    }
}
