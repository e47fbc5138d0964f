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
/// made a result by `answer`; `m`, the host's metrics, count it.
pub(crate) async fn send<R, T>(
    fetch: impl Future<Output = Result<R, ReadError>>,
    m: &HostMetrics,
    host: &str,
    limit: Limit,
    answer: impl FnOnce(R) -> Result<T, ReadError>,
) -> Result<T, ReadError> {
    let mut wire = Wire::start(m, limit.started);
    let sent = tokio::time::timeout_at(limit.until, fetch).await;
    wire.finished = true;
    let outcome = match sent {
        Ok(Ok(response)) => answer(response),
        Ok(Err(err)) => Err(err),
        Err(_elapsed) => return Err(limit.elapsed(m, host)),
    };
    let counter = if outcome.is_ok() { &m.ok } else { &m.error };
    counter.increment(1);
    outcome
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
