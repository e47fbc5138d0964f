//! An OTLP/HTTP (protobuf) collector on a loopback port for the tests:
//! `POST /v1/traces` and `POST /v1/metrics` decoded with
//! `opentelemetry-proto`, every span kept with its resource's
//! `service.name`, every metric as exported.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::common::v1::KeyValue;
pub use opentelemetry_proto::tonic::metrics::v1::{metric::Data, Metric};
pub use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
pub use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A span as received, with its resource's `service.name`.
#[derive(Clone, Debug)]
pub struct Received {
    /// The span.
    pub span: Span,
    /// Its resource's `service.name`.
    pub service: String,
}

#[derive(Default)]
struct Seen {
    spans: Mutex<Vec<Received>>,
    metrics: Mutex<Vec<Metric>>,
    exports: tokio::sync::Notify,
}

/// The collector; stops when dropped.
pub struct Collector {
    /// `http://127.0.0.1:PORT`: the `otlp_endpoint`.
    pub base: String,
    seen: Arc<Seen>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Collector {
    /// Starts one on a free loopback port.
    pub async fn start() -> Self {
        let seen = Arc::new(Seen::default());
        let app = Router::new()
            .route("/v1/traces", post(traces))
            .route("/v1/metrics", post(metrics))
            .with_state(seen.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { base, seen, task }
    }

    /// One started, and a telemetry exporting to it that samples no trace
    /// of its own (`sample_ratio = 0`; a caller's sampled `traceparent`
    /// still is).
    pub async fn sampling_nothing() -> (Self, fanout_budget::telemetry::Telemetry) {
        let collector = Self::start().await;
        let config = fanout_budget::config::TelemetryConfig::default()
            .otlp_endpoint(collector.base.clone())
            .sample_ratio(0.0);
        let telemetry = fanout_budget::telemetry::Telemetry::builder(config)
            .build()
            .expect("a valid telemetry")
            .expect("an endpoint turns export on");
        (collector, telemetry)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Received> {
        self.seen.spans.lock().unwrap().clone()
    }

    /// Every metric received so far (each export's, cumulative).
    pub fn metrics(&self) -> Vec<Metric> {
        self.seen.metrics.lock().unwrap().clone()
    }

    /// Waits (at most `within`) until the spans received satisfy `done`;
    /// them, or a panic naming `what`.
    pub async fn wait_for(
        &self,
        within: Duration,
        what: &str,
        done: impl Fn(&[Received]) -> bool,
    ) -> Vec<Received> {
        let deadline = Instant::now() + within;
        loop {
            let notified = self.seen.exports.notified();
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not received within {within:?}"
            );
            let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
        }
    }
}

async fn traces(State(seen): State<Arc<Seen>>, body: Bytes) -> StatusCode {
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf body");
    let mut spans = seen.spans.lock().unwrap();
    for resource in request.resource_spans {
        let service = resource
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .map(text)
            .unwrap_or_default();
        for scope in resource.scope_spans {
            spans.extend(scope.spans.into_iter().map(|span| Received {
                span,
                service: service.clone(),
            }));
        }
    }
    seen.exports.notify_waiters();
    StatusCode::OK
}

async fn metrics(State(seen): State<Arc<Seen>>, body: Bytes) -> StatusCode {
    let request = ExportMetricsServiceRequest::decode(body).expect("an OTLP protobuf body");
    let mut metrics = seen.metrics.lock().unwrap();
    for resource in request.resource_metrics {
        for scope in resource.scope_metrics {
            metrics.extend(scope.metrics);
        }
    }
    seen.exports.notify_waiters();
    StatusCode::OK
}

/// An attribute's value as text.
pub fn text(kv: &KeyValue) -> String {
    match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Any::StringValue(s)) => s.clone(),
        Some(Any::IntValue(i)) => i.to_string(),
        Some(Any::BoolValue(b)) => b.to_string(),
        Some(Any::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

/// An attribute as (key, value as text).
pub fn attribute_of(kv: &KeyValue) -> (String, String) {
    (kv.key.clone(), text(kv))
}

/// Whether the span's attribute `key` is an integer (a count, a status
/// code), not text.
pub fn is_int(span: &Span, key: &str) -> bool {
    span.attributes.iter().any(|kv| {
        kv.key == key
            && matches!(
                kv.value.as_ref().and_then(|v| v.value.as_ref()),
                Some(Any::IntValue(_))
            )
    })
}

/// The span's attribute `key`, as text.
pub fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes.iter().find(|kv| kv.key == key).map(text)
}

/// Ids as `traceparent` writes them.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Every text of the span (name, attributes, events) joined, to look for
/// what must never be there (a password, a token).
pub fn all_text(span: &Span) -> String {
    let mut text = span.name.clone();
    for kv in span
        .attributes
        .iter()
        .chain(span.events.iter().flat_map(|e| &e.attributes))
    {
        text.push(' ');
        text.push_str(&kv.key);
        text.push('=');
        text.push_str(&self::text(kv));
    }
    text
}
