//! The spans of a read, in OpenTelemetry's terms (`telemetry`, the `otel`
//! feature) and the log's:
//!
//! - `upstream.read` ([`read_span`]): one per read a resolver asks for,
//!   answered or refused, sent or not. What answered it is recorded on it as
//!   the read goes ([`note`]): `fanout.cache_hit`, `fanout.dedup`,
//!   `fanout.coalesced`, `fanout.charged` (each `true`, present only when
//!   so: an exporter keeps every value recorded, so a field set `false`
//!   first would be exported twice), `fanout.refused` (why it was refused
//!   before it was sent), then `fanout.outcome` (`ok` or the error code). The requests the read sends — a redirect hop, a `401` sent again
//!   with credentials — are its children, and so is `upstream.token`
//!   ([`token_span`]), a token fetch it ran.
//! - a CLIENT span ([`client_span`]) per upstream request sent, in the HTTP
//!   client conventions: `GET` (the method is the name),
//!   `http.request.method`, `server.address`, `server.port`, `url.full`,
//!   then `http.response.status_code` and, for an answer of 400 or more or a
//!   request that failed, `error.type` (the status, or the error code) and
//!   the error status. A read answered by the request's de-duplication, by
//!   an identical read in flight or by the engine's cache sends nothing and
//!   has none. The transport runs inside it, so the `traceparent` it writes
//!   (`telemetry`) names it.
//!
//! `url.full` is the scheme, host, port and path only, and `upstream.read`
//! names the path alone: userinfo and a query string may carry secrets.
//! A span no subscriber wants is `Span::none()` (with tracing's `log`
//! feature on, a disabled span still offers every enter, exit and record to
//! `log`), and [`note`] looks for the current span only when some
//! subscriber takes debug spans: a process that exports nothing formats
//! nothing.

mod client;
mod spanned;

pub(crate) use client::{client_span, ClientSpan};

#[cfg(feature = "otel")]
use spanned::direct;
use spanned::{enabled, wanted, Note, Spanned};

use super::message::Read;
use crate::error::ReadError;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// The span of one read a resolver asks for (see the module docs).
pub(crate) fn read_span(read: &Read) -> Spanned {
    // Asked once, up front: a read no subscriber wants spans for (the
    // common case without a debug log or telemetry) checks nothing else.
    if !wanted() {
        return Spanned::Off;
    }
    #[cfg(feature = "otel")]
    if let Some(span) = direct_read("upstream.read", read) {
        return span;
    }
    Spanned::tracing(enabled(|| {
        tracing::debug_span!(
            "upstream.read",
            server.address = read.url.host_str(),
            url.path = read.url.path(),
            fanout.cache_hit = tracing::field::Empty,
            fanout.dedup = tracing::field::Empty,
            fanout.coalesced = tracing::field::Empty,
            fanout.charged = tracing::field::Empty,
            fanout.refused = tracing::field::Empty,
            fanout.granted = tracing::field::Empty,
            fanout.spent = tracing::field::Empty,
            fanout.outcome = tracing::field::Empty,
        )
    }))
}

/// The span of a token fetch `ask` runs for the read it is under.
pub(crate) fn token_span(ask: &Read) -> Spanned {
    #[cfg(feature = "otel")]
    if let Some(span) = direct_read("upstream.token", ask) {
        return span;
    }
    Spanned::tracing(enabled(|| {
        tracing::debug_span!(
            "upstream.token",
            server.address = ask.url.host_str(),
            url.path = ask.url.path(),
            fanout.charged = tracing::field::Empty,
            fanout.refused = tracing::field::Empty,
        )
    }))
}

/// The direct span `name` of a read (or token fetch): INTERNAL, with its
/// `server.address` and `url.path` (see [`direct`]).
#[cfg(feature = "otel")]
fn direct_read(name: &'static str, read: &Read) -> Option<Spanned> {
    use opentelemetry::KeyValue;
    direct(|| {
        let mut attributes = Vec::with_capacity(6);
        if let Some(host) = read.url.host_str() {
            attributes.push(KeyValue::new("server.address", host.to_owned()));
        }
        attributes.push(KeyValue::new("url.path", read.url.path().to_owned()));
        (name, opentelemetry::trace::SpanKind::Internal, attributes)
    })
}

pin_project_lite::pin_project! {
    /// A read's future inside its span (entered at each poll), how it
    /// ended recorded as `fanout.outcome` (`ok` or its code). Without a
    /// span, polled as it is.
    pub(crate) struct Traced<F> {
        #[pin]
        read: F,
        span: Spanned,
    }
}

impl<F> Traced<F> {
    /// `read`, inside `span`.
    pub(crate) fn new(span: Spanned, read: F) -> Self {
        Traced { read, span }
    }
}

impl<T, F> Future for Traced<F>
where
    F: Future<Output = Result<T, ReadError>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let span = this.span;
        if span.is_none() {
            return this.read.poll(cx);
        }
        let read = this.read;
        let outcome = std::task::ready!(span.in_scope(|| read.poll(cx)));
        span.record(
            "fanout.outcome",
            outcome.as_ref().map_or_else(ReadError::code, |_| "ok"),
        );
        // The span ends as the read does, not when its future is dropped.
        *span = Spanned::Off;
        Poll::Ready(outcome)
    }
}

/// Records `value` as `field` of the read's span (or token fetch's) the
/// caller is in — when some subscriber takes debug spans at all: else one
/// atomic load.
#[inline]
pub(crate) fn note<V: Note>(field: &'static str, value: V) {
    if wanted() {
        noted(field, value);
    }
}

/// [`note`], once some subscriber wants the value: out of line, so that the
/// check above is all a read pays without one.
#[inline(never)]
fn noted<V: Note>(field: &'static str, value: V) {
    #[cfg(feature = "otel")]
    // A direct span entered: the read's, or its operation's, which takes no
    // note (as its `tracing` span has no such field).
    if crate::telemetry::direct::with_current(|span| span.note(field, value.otel())).is_some() {
        return;
    }
    tracing::Span::current().record(field, value.field());
}
