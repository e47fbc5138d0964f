//! Steps 1–6 of the acquisition point (see [`crate::upstream`]): what one
//! [`Upstream::read`] does.

use super::read::HostName;
use super::{ReadResult, Upstream};
use crate::budget::bump;
use crate::dedup::Origin;
use crate::error::FanoutError;
use crate::hosts::{HeldSlot, HostEntry};
use crate::metrics::{self, HostMetrics};
use crate::upstream::{Read, UpstreamResponse};
use http::HeaderValue;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tracing::Instrument;

/// What makes two reads the same read: the URL and the `Accept` header.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct ReadKey {
    url: Box<str>,
    accept: Option<HeaderValue>,
}

/// Hashes the URL's bytes alone, in one write: reads that differ only in
/// `Accept` are rare, and equality still tells them apart.
impl std::hash::Hash for ReadKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write(self.url.as_bytes());
    }
}

impl Upstream<'_> {
    /// Reads `read` through the acquisition point (see [`crate::upstream`]).
    ///
    /// A redirect (301, 302, 303, 307, 308 with a `Location`) is followed
    /// here, up to `upstream.max_redirects` hops, each hop a read of its own
    /// through every step (de-duplicated, capped per host and charged); a
    /// hop back to a URL of the same chain, past the last hop, or to
    /// something that is not `http(s)` ends the read with `UPSTREAM_ERROR`.
    pub async fn read(&self, read: Read) -> Result<Arc<UpstreamResponse>, FanoutError> {
        let max_redirects = self
            .op
            .request
            .inner
            .engine
            .inner
            .config
            .upstream
            .max_redirects;
        let accept = read.accept.clone();
        let mut url = read.url.clone();
        let mut response = self.read_once(read).await?;
        let mut chain: Vec<reqwest::Url> = Vec::new();
        while let Some(location) = redirect(&response) {
            if max_redirects == 0 {
                break;
            }
            let fail = |message: String| Err(response.error(message));
            let next = match url.join(location) {
                Ok(next) if matches!(next.scheme(), "http" | "https") => next,
                _ => return fail(format!("redirect to {location:?}, not an http(s) URL")),
            };
            if chain.len() as u32 >= max_redirects {
                return fail(format!("more than {max_redirects} redirects"));
            }
            if next == url || chain.contains(&next) {
                return fail(format!("redirect loop at {next}"));
            }
            chain.push(std::mem::replace(&mut url, next.clone()));
            let hop = Read {
                url: next,
                accept: accept.clone(),
            };
            response = self.read_once(hop).await?;
        }
        Ok(response)
    }

    /// One read through the acquisition point, redirects not followed.
    async fn read_once(&self, read: Read) -> Result<Arc<UpstreamResponse>, FanoutError> {
        let scope = &*self.op.request.inner;
        let span = tracing::debug_span!(
            "upstream.read",
            host = %HostName(&read.url),
            path = %read.url.path(),
            dedup = tracing::field::Empty,
            outcome = tracing::field::Empty,
            duration_ms = tracing::field::Empty,
        );
        let key = ReadKey {
            url: read.url.as_str().into(),
            accept: read.accept.clone(),
        };
        let send = || self.send(read);
        // A disabled span (no subscriber wants it) is neither entered nor
        // timed. (The read's future is built in place in each branch.)
        let (result, origin) = if span.is_disabled() {
            scope.dedup.get_or_run(key, send).await
        } else {
            let started = std::time::Instant::now();
            let (result, origin) = scope
                .dedup
                .get_or_run(key, send)
                .instrument(span.clone())
                .await;
            let outcome = match &result {
                Ok(_) => "ok",
                Err(err) => err.code(),
            };
            span.record("dedup", origin == Origin::Shared);
            span.record("outcome", outcome);
            span.record("duration_ms", started.elapsed().as_secs_f64() * 1e3);
            (result, origin)
        };
        if origin == Origin::Shared {
            bump(&scope.budget.stats().dedup_hits);
            metrics::dedup_hit();
        }
        // A read answered at once (de-duplicated, refused) never waits, and
        // the many fields woken together when one shared read lands all go on
        // in the same poll; each read's end spends a unit of tokio's
        // cooperative budget, so such an operation still yields — to other
        // requests, and to its deadline.
        tokio::task::consume_budget().await;
        result
    }

    /// Steps 2–6 for a read no other caller answers. The request's clock is
    /// read once here (and again only after waiting for a host slot).
    async fn send(&self, read: Read) -> ReadResult {
        let scope = &*self.op.request.inner;
        let engine = &*scope.engine.inner;
        let budget = &scope.budget;
        let stats = budget.stats();
        let host = engine.host_table.resolve(&read.url, &*engine.hosts);
        let refused = |err: FanoutError| {
            match &err {
                FanoutError::BudgetExhausted { .. } => {
                    bump(&stats.refused_budget);
                    metrics::budget_exhausted();
                }
                FanoutError::HostSaturated { .. } => {
                    bump(&stats.refused_host);
                    host.metrics.rejections.increment(1);
                }
                _ => bump(&stats.refused_deadline),
            }
            Err(err)
        };
        if budget.is_exhausted() {
            return refused(FanoutError::BudgetExhausted {
                limit: budget.limit(),
            });
        }
        let _request_slot = match budget.try_in_flight_slot() {
            Some(slot) => slot,
            None => match budget.in_flight_slot().await {
                Ok(slot) => slot,
                Err(err) => return refused(err),
            },
        };
        let now = budget.now();
        let Some(left) = budget.time_left_at(now) else {
            return refused(FanoutError::DeadlineExceeded);
        };
        let free = match &host.cap {
            Some(cap) => cap.try_borrow(),
            None => Ok(None),
        };
        let (_host_slot, now, left) = match free {
            Ok(Some(permit)) => (HeldSlot::Borrowed { _permit: permit }, now, left),
            Err(err) => return refused(err),
            Ok(None) => {
                let slot = match &host.cap {
                    Some(cap) => cap.acquire(left).await,
                    None => engine.hosts.acquire(&host.name, left).await,
                };
                let slot = match slot {
                    Ok(slot) => slot,
                    Err(err) => return refused(err),
                };
                // Waiting may have used up the time; check it again.
                let now = budget.now();
                let Some(left) = budget.time_left_at(now) else {
                    return refused(FanoutError::DeadlineExceeded);
                };
                (HeldSlot::Owned { _slot: slot }, now, left)
            }
        };
        // Waiting may have used up the budget; charge last.
        if let Err(err) = budget.try_charge() {
            return refused(err);
        }
        self.op.reads.fetch_add(1, Relaxed);
        bump(&stats.issued);
        self.timed_send(read, &host, now, left).await
    }

    /// Sends the read under its time limit (the acquisition point's last
    /// step); `now` is the request clock's, `left` the time left at `now`.
    async fn timed_send(
        &self,
        read: Read,
        host: &HostEntry,
        now: Instant,
        left: Duration,
    ) -> ReadResult {
        let engine = &self.op.request.inner.engine.inner;
        let budget = self.op.request.budget();
        let stats = budget.stats();
        let read_timeout = engine.config.budget.read_timeout();
        let by_deadline = read_timeout > left;
        let limit = read_timeout.min(left);
        let m = &host.metrics;
        let fetch = engine.transport.fetch(read, &host.name);
        // The timer runs on tokio's clock: when the request's clock is tokio's,
        // `now + limit` is `min(now + read_timeout, deadline)`, no new reading.
        let (started, sent) = if budget.on_tokio_clock() {
            (now, tokio::time::timeout_at(now + limit, fetch))
        } else {
            (Instant::now(), tokio::time::timeout(limit, fetch))
        };
        // Owned by this future: if the inbound request is cancelled mid-read,
        // dropping it still balances the gauge and the counters.
        let mut sending = Sending::start(m, stats, started);
        let sent = sent.await;
        sending.finish();
        match sent {
            Ok(Ok(response)) => {
                // Every answer is kept for the rest of the request (it may
                // answer an identical read): their bytes together are bounded
                // too, not only each one's.
                let scope = &*self.op.request.inner;
                let max = engine.config.upstream.max_request_bytes as u64;
                let len = response.body.len() as u64;
                if scope.kept_bytes.fetch_add(len, Relaxed).saturating_add(len) > max {
                    scope.kept_bytes.fetch_sub(len, Relaxed);
                    bump(&stats.failed);
                    m.error.increment(1);
                    return Err(response.error(format!(
                        "this request's upstream answers would pass {max} bytes"
                    )));
                }
                bump(&stats.succeeded);
                m.ok.increment(1);
                Ok(Arc::new(response))
            }
            Ok(Err(err)) => {
                bump(&stats.failed);
                m.error.increment(1);
                Err(err)
            }
            Err(_elapsed) => {
                bump(&stats.timed_out);
                m.timeouts.increment(1);
                if by_deadline {
                    m.deadline.increment(1);
                    Err(FanoutError::DeadlineExceeded)
                } else {
                    m.timeout.increment(1);
                    let timeout_ms = read_timeout.as_millis() as u64;
                    Err(FanoutError::UpstreamTimeout {
                        host: host.name.to_string(),
                        timeout_ms,
                    })
                }
            }
        }
    }
}

/// The `Location` of a redirect answer, if `response` is one.
fn redirect(response: &UpstreamResponse) -> Option<&str> {
    match response.status.as_u16() {
        301 | 302 | 303 | 307 | 308 => response.header("location"),
        _ => None,
    }
}

/// One read on the wire: the in-flight gauge is held while it exists, and a
/// read dropped before it finished (its request was cancelled) counts as
/// `cancelled`, so `issued = succeeded + failed + timed_out + cancelled`.
struct Sending<'a> {
    metrics: &'a HostMetrics,
    stats: &'a crate::budget::ReadStats,
    started: Instant,
    finished: bool,
}

impl<'a> Sending<'a> {
    /// A read sent at `started` (tokio's clock).
    fn start(
        metrics: &'a HostMetrics,
        stats: &'a crate::budget::ReadStats,
        started: Instant,
    ) -> Self {
        metrics.in_flight.increment(1.0);
        Self {
            metrics,
            stats,
            started,
            finished: false,
        }
    }

    fn finish(&mut self) {
        self.finished = true;
    }
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        self.metrics.in_flight.decrement(1.0);
        self.metrics
            .latency
            .record(self.started.elapsed().as_secs_f64());
        if !self.finished {
            bump(&self.stats.cancelled);
            self.metrics.cancelled.increment(1);
        }
    }
}
