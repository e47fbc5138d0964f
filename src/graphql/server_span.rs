//! The inbound request's span, `graphql.request`: the trace's HTTP SERVER
//! span in OpenTelemetry's conventions (`telemetry`, the `otel` feature),
//! and the log's span of the request.
//!
//! Opened once the request is known to be a GraphQL one (not a WebSocket,
//! not GraphiQL), so every such request has one, refused or answered: its
//! name (`POST /graphql`: the route, never the path a client chose), the
//! method, the matched route, the TCP peer; then the caller class, the
//! operations and reads as they become known; last the status, `error`
//! for a 5xx. An inbound `traceparent` is its parent. With telemetry on,
//! the request is sampled as it arrives, and runs under that decision
//! ([`within`]): a request sampled out opens no span for the exporter.

use crate::inbound::Caller;
use axum::body::Body;
use axum::extract::{ConnectInfo, MatchedPath};
use std::net::SocketAddr;
use tracing::field::Empty;
use tracing::Span;

/// The span of `request`, a GraphQL `GET` (`get`) or `POST`.
/// A count or status as a span's field: a signed integer, which the
/// OpenTelemetry layer keeps as an integer attribute (an unsigned one it
/// formats into a string: an allocation, and the wrong type for
/// `http.response.status_code`).
pub(super) fn int(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

pub(super) fn open(request: &http::Request<Body>, get: bool, opened: &Opened) -> Span {
    #[cfg(feature = "otel")]
    return crate::telemetry::within_sync(opened.sampling.clone(), || span(request, get));
    #[cfg(not(feature = "otel"))]
    {
        let _ = opened;
        span(request, get)
    }
}

/// `answer`, the request's future, under its sampling decision
/// (`telemetry`): a request sampled out builds no span. Not an `async fn`,
/// which would hold `answer` twice.
pub(super) fn within<F: std::future::Future>(
    opened: &Opened,
    answer: F,
) -> impl std::future::Future<Output = F::Output> {
    #[cfg(feature = "otel")]
    return crate::telemetry::within(opened.sampling.clone(), answer);
    #[cfg(not(feature = "otel"))]
    {
        let _ = opened;
        answer
    }
}

/// `run`, a WebSocket event (a trace that starts here), under a sampling
/// decision of its own (`telemetry`).
pub(super) fn event<F: std::future::Future>(
    run: F,
) -> impl std::future::Future<Output = F::Output> {
    #[cfg(feature = "otel")]
    return crate::telemetry::within(crate::telemetry::root_decision(), run);
    #[cfg(not(feature = "otel"))]
    run
}

/// One poll of a [`SharedPoll`](crate::graphql::SharedPoll), the future
/// `make` gives: a trace of its own, under a sampling decision of its own,
/// rooted at its `upstream.poll` span. A poll reads for subscribers of many
/// connections, so for no one request's trace. `make` runs inside that
/// span, so the operation handle it opens keeps its trace (`telemetry`).
pub(crate) fn poll<F: std::future::Future>(
    make: impl FnOnce() -> F,
) -> impl std::future::Future<Output = F::Output> {
    use tracing::Instrument as _;
    event(async move {
        let span = tracing::debug_span!(parent: None, "upstream.poll");
        let run = span.in_scope(make);
        run.instrument(span).await
    })
}

fn span(request: &http::Request<Body>, get: bool) -> Span {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str);
    // One field list, two callsites: a request sampled out opens its span
    // at a callsite the telemetry's layer refuses once and for all (marked
    // `fanout.sampled_out`): only another layer (a log's) makes it.
    macro_rules! request_span {
        ($($marker:tt)*) => {
            tracing::info_span!(
                "graphql.request",
                $($marker)*
                otel.name = match (get, route) {
                    (true, Some(route)) => format!("GET {route}"),
                    (false, Some(route)) => format!("POST {route}"),
                    (true, None) => "GET".to_owned(),
                    (false, None) => "POST".to_owned(),
                },
                otel.kind = "server",
                http.request.method = if get { "GET" } else { "POST" },
                http.route = route,
                http.response.status_code = Empty,
                otel.status_code = Empty,
                client.address = request
                    .extensions()
                    .get::<ConnectInfo<SocketAddr>>()
                    .map(|peer| tracing::field::display(peer.0.ip())),
                fanout.caller = Empty,
                fanout.operations = Empty,
                fanout.reads = Empty,
                fanout.budget.reads = Empty,
                fanout.budget.deadline_ms = Empty,
                fanout.budget.hops = Empty,
                fanout.spent = Empty,
            )
        };
    }
    #[cfg(feature = "otel")]
    if crate::telemetry::decided_out() {
        return request_span!(fanout.sampled_out = true,);
    }
    let span = request_span!();
    #[cfg(feature = "otel")]
    crate::telemetry::adopt_parent(&span, request.headers());
    span
}

/// Who is calling: `public` or `internal`.
pub(super) fn caller(span: &Span, caller: Caller) {
    span.record(
        "fanout.caller",
        match caller {
            Caller::Internal => "internal",
            Caller::Public => "public",
        },
    );
}

/// What the request's `Fanout-Budget` gave it, when its caller is a
/// service on the engine (`chain/`): the members as received.
pub(super) fn received(span: &Span, scope: &crate::request::FanoutRequest) {
    let Some(received) = scope.received() else {
        return;
    };
    let members = received.members();
    let fields = [
        ("fanout.budget.reads", members.reads),
        ("fanout.budget.deadline_ms", members.deadline_ms),
        ("fanout.budget.hops", members.hops),
    ];
    for (field, value) in fields {
        if let Some(value) = value {
            span.record(field, int(value));
        }
    }
}

/// What the request reported back to such a caller (`Fanout-Spent`).
pub(super) fn spent(span: &Span, scope: Option<&crate::request::FanoutRequest>) {
    if let Some(scope) = scope.filter(|scope| scope.received().is_some()) {
        span.record("fanout.spent", int(scope.budget().used()));
    }
}

/// The answer's status; how long the request took
/// (`fanout_request_seconds`, on `metrics`), and, while telemetry lives,
/// `http.server.request.duration`.
pub(super) fn close(
    span: &Span,
    opened: Opened,
    status: http::StatusCode,
    metrics: &crate::metrics::RequestMetrics,
) {
    span.record("http.response.status_code", i64::from(status.as_u16()));
    if status.is_server_error() {
        span.record("otel.status_code", "error");
    }
    metrics.request_seconds(opened.started.elapsed());
    #[cfg(feature = "otel")]
    if let Some(metric) = opened.metric {
        metric.record(status);
    }
}

/// What [`close`] records of a request once it is consumed: nothing unless
/// telemetry lives.
pub(super) struct Opened {
    started: std::time::Instant,
    /// Whether the request is sampled, while spans are exported.
    #[cfg(feature = "otel")]
    sampling: Option<std::sync::Arc<crate::telemetry::Sampling>>,
    #[cfg(feature = "otel")]
    metric: Option<Metric>,
}

impl Opened {
    /// `request` (a `GET` when `get`) begins now.
    pub(super) fn now(request: &http::Request<Body>, get: bool) -> Self {
        #[cfg(not(feature = "otel"))]
        let _ = (request, get);
        Opened {
            started: std::time::Instant::now(),
            #[cfg(feature = "otel")]
            sampling: crate::telemetry::decide(request.headers()),
            #[cfg(feature = "otel")]
            metric: Metric::of(request, get),
        }
    }
}

/// `http.server.request.duration`'s instrument, attributes and start.
#[cfg(feature = "otel")]
struct Metric {
    /// The method and the route; the status goes in the last place.
    attributes: [opentelemetry::KeyValue; 3],
    len: usize,
    started: std::time::Instant,
}

#[cfg(feature = "otel")]
thread_local! {
    /// The last route's attribute this thread made: a request on the same
    /// route (nearly every one: a service has a route or two) shares its
    /// text, not a copy.
    static ROUTE: std::cell::RefCell<Option<opentelemetry::KeyValue>> =
        const { std::cell::RefCell::new(None) };
}

#[cfg(feature = "otel")]
impl Metric {
    fn of(request: &http::Request<Body>, get: bool) -> Option<Metric> {
        use opentelemetry::KeyValue;
        if !crate::telemetry::is_recording() {
            return None;
        }
        let method = KeyValue::new("http.request.method", if get { "GET" } else { "POST" });
        let unused = || KeyValue::new("", false);
        let mut metric = Metric {
            attributes: [method, unused(), unused()],
            len: 1,
            started: std::time::Instant::now(),
        };
        if let Some(route) = request.extensions().get::<MatchedPath>() {
            metric.attributes[1] = route_attribute(route.as_str());
            metric.len = 2;
        }
        Some(metric)
    }

    fn record(mut self, status: http::StatusCode) {
        self.attributes[self.len] =
            opentelemetry::KeyValue::new("http.response.status_code", i64::from(status.as_u16()));
        let attributes = &self.attributes[..=self.len];
        let took = self.started.elapsed();
        crate::telemetry::instruments(|i| i.server_request(took, attributes));
    }
}

/// `http.route = route`, the text shared with the thread's last one when
/// it is the same route.
#[cfg(feature = "otel")]
fn route_attribute(route: &str) -> opentelemetry::KeyValue {
    let make = || opentelemetry::KeyValue::new("http.route", std::sync::Arc::<str>::from(route));
    ROUTE
        .try_with(|last| {
            let mut last = last.borrow_mut();
            match &*last {
                Some(kept) if kept.value.as_str() == route => kept.clone(),
                _ => last.insert(make()).clone(),
            }
        })
        .unwrap_or_else(|_| make())
}
