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

use super::message::{Read, UpstreamResponse};
use crate::error::ReadError;
use crate::metrics::HostMetrics;
use futures::future::{BoxFuture, Either};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tracing::Instrument;

/// The span of one request about to be sent, and (with the `otel`
/// feature, while telemetry lives) when it started: small, as it is held
/// in the read's future.
pub(crate) struct ClientSpan {
    span: Spanned,
    #[cfg(feature = "otel")]
    metric: Option<Metric>,
}

/// `http.client.request.duration`'s start and method; the instrument and
/// the host's attributes are taken at the end (nothing allocated per
/// request: the attributes' list is on the stack).
#[cfg(feature = "otel")]
struct Metric {
    method: &'static str,
    started: std::time::Instant,
}

#[cfg(feature = "otel")]
impl Metric {
    fn of(read: &Read) -> Option<Metric> {
        crate::telemetry::is_recording().then(|| Metric {
            method: method_name(&read.method),
            started: std::time::Instant::now(),
        })
    }

    fn record(self, host: &HostMetrics, status: Option<u16>, error: Option<ErrorType>) {
        use opentelemetry::KeyValue;
        // On the stack: the method, the host's one or two, a status and an
        // error at most; the unused places are never read.
        let mut attributes: [KeyValue; 5] = std::array::from_fn(|_| KeyValue::new("", false));
        let mut len = 0;
        let mut push = |attribute| {
            attributes[len] = attribute;
            len += 1;
        };
        push(KeyValue::new("http.request.method", self.method));
        host.server.iter().take(2).cloned().for_each(&mut push);
        if let Some(status) = status {
            push(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
        }
        match error {
            Some(ErrorType::Status(status)) => {
                push(KeyValue::new("error.type", status.to_string()));
            }
            Some(ErrorType::Code(code)) => push(KeyValue::new("error.type", code)),
            None => {}
        }
        let took = self.started.elapsed();
        // Nothing when the telemetry ended meanwhile.
        crate::telemetry::instruments(|i| i.client_request(took, &attributes[..len]));
    }
}

/// A request's `error.type`: an answer's status, or a failure's code.
#[cfg(feature = "otel")]
enum ErrorType {
    Status(u16),
    Code(&'static str),
}

/// The conventions' name of a method: one of HTTP's, else `_OTHER`.
#[cfg(feature = "otel")]
fn method_name(method: &http::Method) -> &'static str {
    use http::Method;
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::OPTIONS => "OPTIONS",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "_OTHER",
    }
}

/// The span of one request about to be sent to `read.url`.
pub(crate) fn client_span(read: &Read) -> ClientSpan {
    ClientSpan {
        span: span(read),
        #[cfg(feature = "otel")]
        metric: Metric::of(read),
    }
}

fn span(read: &Read) -> Spanned {
    let url = &read.url;
    #[cfg(feature = "otel")]
    if let Some(span) = direct(|| {
        use opentelemetry::KeyValue;
        // HTTP's own methods by their static names: no copy.
        let method = match method_name(&read.method) {
            "_OTHER" => std::borrow::Cow::Owned(read.method.as_str().to_owned()),
            known => std::borrow::Cow::Borrowed(known),
        };
        let mut attributes = Vec::with_capacity(7);
        attributes.push(KeyValue::new("http.request.method", method.clone()));
        if let Some(host) = url.host_str() {
            attributes.push(KeyValue::new("server.address", host.to_owned()));
        }
        if let Some(port) = url.port_or_known_default() {
            attributes.push(KeyValue::new("server.port", i64::from(port)));
        }
        attributes.push(KeyValue::new("url.full", SafeUrl(url).text()));
        (method, opentelemetry::trace::SpanKind::Client, attributes)
    }) {
        return span;
    }
    Spanned::Tracing(enabled(|| {
        tracing::debug_span!(
            "upstream.request",
            otel.name = read.method.as_str(),
            otel.kind = "client",
            http.request.method = read.method.as_str(),
            server.address = url.host_str(),
            server.port = url.port_or_known_default().map(i64::from),
            url.full = %SafeUrl(url),
            http.response.status_code = tracing::field::Empty,
            error.type = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        )
    }))
}

/// The span of one read a resolver asks for (see the module docs).
pub(crate) fn read_span(read: &Read) -> Spanned {
    #[cfg(feature = "otel")]
    if let Some(span) = direct_read("upstream.read", read) {
        return span;
    }
    Spanned::Tracing(enabled(|| {
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
    Spanned::Tracing(enabled(|| {
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

/// A direct span (`telemetry/direct.rs`), named, of the kind and with the
/// attributes `describe` gives, when the request is sampled and its
/// operation's span exported; `None` otherwise.
#[cfg(feature = "otel")]
fn direct<N: Into<std::borrow::Cow<'static, str>>>(
    describe: impl FnOnce() -> (
        N,
        opentelemetry::trace::SpanKind,
        Vec<opentelemetry::KeyValue>,
    ),
) -> Option<Spanned> {
    use crate::telemetry::direct;
    if !crate::telemetry::is_exporting() || !wanted() {
        return None;
    }
    let (name, kind, attributes) = describe();
    direct::Span::child(name, kind, attributes).map(Spanned::Direct)
}

/// A read path's span: a `tracing` one (`Span::none()` when no subscriber
/// wants it), or, for a request a telemetry sampled, a direct one
/// (`telemetry/direct.rs`).
pub(crate) enum Spanned {
    Tracing(tracing::Span),
    #[cfg(feature = "otel")]
    Direct(crate::telemetry::direct::Span),
}

impl Spanned {
    /// Whether there is no span at all.
    fn is_none(&self) -> bool {
        matches!(self, Spanned::Tracing(span) if span.is_none())
    }

    /// `f`, inside the span.
    fn in_scope<R>(&self, f: impl FnOnce() -> R) -> R {
        match self {
            Spanned::Tracing(span) if span.is_none() => f(),
            Spanned::Tracing(span) => span.in_scope(f),
            #[cfg(feature = "otel")]
            Spanned::Direct(span) => span.enter(f),
        }
    }

    /// Records `field` = `value`.
    fn record<V: Note>(&self, field: &'static str, value: V) {
        match self {
            Spanned::Tracing(span) => {
                span.record(field, value.field());
            }
            #[cfg(feature = "otel")]
            Spanned::Direct(span) => span.set(field, value.otel()),
        }
    }

    /// Marks the span failed (`otel.status_code = "error"`).
    fn fail(&self) {
        match self {
            Spanned::Tracing(span) => {
                span.record("otel.status_code", "error");
            }
            #[cfg(feature = "otel")]
            Spanned::Direct(span) => span.fail(),
        }
    }

    /// `future` run inside the span.
    pub(crate) fn around<F: Future>(
        self,
        future: F,
    ) -> Either<Either<F, tracing::instrument::Instrumented<F>>, Entered<F>> {
        match self {
            Spanned::Tracing(span) if span.is_none() => Either::Left(Either::Left(future)),
            Spanned::Tracing(span) => Either::Left(Either::Right(future.instrument(span))),
            #[cfg(feature = "otel")]
            Spanned::Direct(span) => Either::Right(span.around(future)),
        }
    }
}

/// A future inside a direct span (`telemetry/direct.rs`).
#[cfg(feature = "otel")]
type Entered<F> = crate::telemetry::direct::Entered<F>;
/// Without the `otel` feature, never built.
#[cfg(not(feature = "otel"))]
type Entered<F> = F;

/// A value the read path notes on its spans: as `tracing` records it, and
/// as OpenTelemetry's.
pub(crate) trait Note: Copy {
    /// The value as a `tracing` field: an integer signed (the
    /// OpenTelemetry layer formats an unsigned one into text).
    type Field: tracing::Value;

    /// The value as a `tracing` field.
    fn field(self) -> Self::Field;

    /// The value as an OpenTelemetry attribute's.
    #[cfg(feature = "otel")]
    fn otel(self) -> opentelemetry::Value;
}

impl Note for bool {
    type Field = bool;

    fn field(self) -> bool {
        self
    }

    #[cfg(feature = "otel")]
    fn otel(self) -> opentelemetry::Value {
        self.into()
    }
}

impl Note for &'static str {
    type Field = &'static str;

    fn field(self) -> &'static str {
        self
    }

    #[cfg(feature = "otel")]
    fn otel(self) -> opentelemetry::Value {
        self.into()
    }
}

impl Note for u64 {
    type Field = i64;

    fn field(self) -> i64 {
        i64::try_from(self).unwrap_or(i64::MAX)
    }

    #[cfg(feature = "otel")]
    fn otel(self) -> opentelemetry::Value {
        self.field().into()
    }
}

impl Note for u16 {
    type Field = i64;

    fn field(self) -> i64 {
        i64::from(self)
    }

    #[cfg(feature = "otel")]
    fn otel(self) -> opentelemetry::Value {
        self.field().into()
    }
}

/// An HTTP status as `error.type`, which the conventions have as text.
#[derive(Clone, Copy)]
struct StatusText(u16);

impl Note for StatusText {
    type Field = tracing::field::DisplayValue<u16>;

    fn field(self) -> Self::Field {
        tracing::field::display(self.0)
    }

    #[cfg(feature = "otel")]
    fn otel(self) -> opentelemetry::Value {
        self.0.to_string().into()
    }
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
        *span = Spanned::Tracing(tracing::Span::none());
        Poll::Ready(outcome)
    }
}

/// Records `value` as `field` of the read's span (or token fetch's) the
/// caller is in — when some subscriber takes debug spans at all: else one
/// atomic load.
pub(crate) fn note<V: Note>(field: &'static str, value: V) {
    if wanted() {
        #[cfg(feature = "otel")]
        if crate::telemetry::direct::with_current(|span| span.set(field, value.otel())).is_some() {
            return;
        }
        tracing::Span::current().record(field, value.field());
    }
}

/// `span()`, or `Span::none()` when no subscriber wants it. Built only
/// when some subscriber takes debug spans at all (one atomic load): else
/// tracing's `log` feature, on while no subscriber is set, would offer each
/// disabled span's fields to `log` — 30 ns a span on the read path.
fn enabled(span: impl FnOnce() -> tracing::Span) -> tracing::Span {
    if !wanted() {
        return tracing::Span::none();
    }
    let span = span();
    if span.is_disabled() {
        tracing::Span::none()
    } else {
        span
    }
}

/// Whether the read's spans are opened: some subscriber takes debug spans,
/// and the request is not one a telemetry sampled out (whose debug spans
/// no layer gets: `telemetry::sampled_out`).
pub(crate) fn wanted() -> bool {
    if !tracing::level_enabled!(tracing::Level::DEBUG) {
        return false;
    }
    #[cfg(feature = "otel")]
    if crate::telemetry::sampled_out() {
        return false;
    }
    true
}

impl ClientSpan {
    /// `fetch` (the transport's future) run inside the span: the
    /// `traceparent` the transport writes names it. Without a span,
    /// `fetch` as it is: nothing wraps the read's future.
    pub(crate) fn around<'a, T: 'a>(&self, fetch: BoxFuture<'a, T>) -> BoxFuture<'a, T> {
        match &self.span {
            Spanned::Tracing(span) if span.is_none() => fetch,
            Spanned::Tracing(span) => Box::pin(fetch.instrument(span.clone())),
            #[cfg(feature = "otel")]
            Spanned::Direct(span) => Box::pin(span.around(fetch)),
        }
    }

    /// Records how the request ended (and, while telemetry lives, how long
    /// it took): its status, or its error. `host`: the metric handles of
    /// its host's label (a host without an entry of its own is
    /// `server.address = "other"`, without a port: the series stay bounded
    /// by the configuration, as the Prometheus `host` label does).
    pub(crate) fn finish<T: Answered>(self, outcome: &Result<T, ReadError>, host: &HostMetrics) {
        #[cfg(not(feature = "otel"))]
        let _ = host;
        #[cfg(feature = "otel")]
        if let Some(metric) = self.metric {
            match outcome {
                Ok(answer) => {
                    let status = answer.status();
                    metric.record(
                        host,
                        Some(status),
                        (status >= 400).then_some(ErrorType::Status(status)),
                    );
                }
                Err(err) => {
                    let status = match err {
                        ReadError::Upstream { status, .. } => *status,
                        _ => None,
                    };
                    metric.record(host, status, Some(ErrorType::Code(err.code())));
                }
            }
        }
        let span = self.span;
        if span.is_none() {
            return;
        }
        match outcome {
            Ok(answer) => {
                let status = answer.status();
                span.record("http.response.status_code", status);
                if status >= 400 {
                    // The conventions' `error.type` of an HTTP error answer.
                    span.record("error.type", StatusText(status));
                    span.fail();
                }
            }
            Err(err) => {
                if let ReadError::Upstream {
                    status: Some(status),
                    ..
                } = err
                {
                    span.record("http.response.status_code", *status);
                }
                span.record("error.type", err.code());
                span.fail();
            }
        }
    }
}

/// An answer with an HTTP status.
pub(crate) trait Answered {
    /// Its status code.
    fn status(&self) -> u16;
}

impl<R: std::ops::Deref<Target = UpstreamResponse>> Answered for R {
    fn status(&self) -> u16 {
        self.status.as_u16()
    }
}

/// A URL without its userinfo, query or fragment.
struct SafeUrl<'a>(&'a reqwest::Url);

impl SafeUrl<'_> {
    /// As a `String`, made at its length at once (`to_string` grows it as
    /// each part is written: three allocations, not one).
    #[cfg(feature = "otel")]
    fn text(&self) -> String {
        use fmt::Write as _;
        let mut text = String::with_capacity(self.0.as_str().len());
        write!(text, "{self}").expect("a String takes any text");
        text
    }
}

impl fmt::Display for SafeUrl<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let url = self.0;
        write!(f, "{}://{}", url.scheme(), url.host_str().unwrap_or(""))?;
        if let Some(port) = url.port() {
            write!(f, ":{port}")?;
        }
        f.write_str(url.path())
    }
}

#[cfg(test)]
mod tests {
    use super::SafeUrl;

    #[test]
    fn url_full_drops_credentials_and_the_query() {
        let url = "https://user:secret@registry.test:5000/v2/x/manifests/1?token=abc#f"
            .parse()
            .unwrap();
        assert_eq!(
            SafeUrl(&url).to_string(),
            "https://registry.test:5000/v2/x/manifests/1"
        );
        #[cfg(feature = "otel")]
        assert_eq!(SafeUrl(&url).text(), SafeUrl(&url).to_string());
    }
}
