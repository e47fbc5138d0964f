//! Traces exported over OTLP (the `otel` feature): what a binary installs so
//! the engine's `tracing` spans reach an OpenTelemetry collector.
//!
//! The engine records `tracing` spans whatever the build; this module turns
//! them into OpenTelemetry spans and ships them. A binary builds a
//! [`Telemetry`] from `[telemetry]` (the standard `OTEL_*` variables
//! resolved first), adds its [`layer`](Telemetry::layer) to its subscriber,
//! and keeps it alive: dropped, it sends the spans still queued.
//!
//! How a span travels:
//! - `tracing-opentelemetry`'s layer builds the OpenTelemetry span from the
//!   `tracing` one (`otel.kind`, `otel.name` and the semantic-convention
//!   fields set where the engine opens its spans). The layer sees only the
//!   engine's targets, at `DEBUG` and above, whatever the log's own filter.
//!   The spans of a sampled request's reads skip `tracing`: they are built
//!   as span data straight away and queued as they end (`direct.rs`); so
//!   are its operations' while the telemetry exports the engine's spans
//!   alone and no other layer takes them (`graphql/operation_span.rs`).
//! - Each inbound request is sampled once, as it arrives: an inbound
//!   `traceparent`'s flag, else `sample_ratio`. A request sampled out
//!   opens no span but its `graphql.request` (`sampling.rs`, the layer's
//!   filter, and the engine's own check before its DEBUG spans). A read
//!   made through an operation's handle outside the request's task (a
//!   `DataLoader`'s spawned load) runs under the request's sampling and
//!   span all the same (`carried.rs`).
//! - An ended span has every text past `attribute_value_length_limit` cut
//!   (`truncate.rs`) and is queued without blocking; past `max_queued_spans`
//!   or `max_queued_bytes` of estimated weight (`weight.rs`) it is dropped
//!   and counted (`processor.rs`). A thread of the telemetry's exports
//!   batches (`batches.rs`: each span moved once, into the queue) over
//!   OTLP/HTTP protobuf with the engine's HTTP stack on the
//!   application's runtime, each export bounded by a timeout
//!   (`export_client.rs`). A collector that is down or slow costs dropped
//!   spans, never a slower request or memory without bound.
//! - `traceparent` is read from the inbound request (`inbound.rs`) and
//!   written on upstream requests — the span they run in, or the caller's
//!   as it came with its `tracestate` (`context.rs`); an inbound
//!   `tracestate` is kept to 512 bytes, as the W3C advises.
//! - Metrics (`http.client.request.duration`, `fanout.request.reads`) are
//!   recorded while a telemetry lives and exported over OTLP every
//!   `metric_interval` (`instruments.rs`).
//!
//! ```no_run
//! use fanout_budget::{config::TelemetryConfig, telemetry::Telemetry};
//! use tracing_subscriber::layer::SubscriberExt as _;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let config = TelemetryConfig::default().otlp_endpoint("http://collector:4318").with_env()?;
//! let telemetry = Telemetry::builder(config).service_name("my-gateway").build()?;
//! let subscriber = tracing_subscriber::registry().with(telemetry.as_ref().map(Telemetry::layer));
//! tracing::subscriber::set_global_default(subscriber)?;
//! // … serve; `telemetry` dropped last sends what is queued.
//! # Ok(()) }
//! ```

mod batches;
mod carried;
mod context;
pub(crate) mod direct;
mod encode;
mod error;
mod export_client;
mod in_flight;
mod inbound;
mod instruments;
mod limits;
mod live;
mod opened;
mod processor;
mod provider;
mod sampling;
mod sink;
mod span_exporter;
mod truncate;
mod weight;

pub(crate) use carried::{adopt_request_parent, hand_over, CarriedTrace};

/// `future` run under `sampling` (`sampling.rs`: as it is without one),
/// outside any direct span of the task it runs in (`direct.rs`): a request
/// served in process inside another's operation is a trace of its own.
pub(crate) fn within<F: std::future::Future>(
    sampling: Option<std::sync::Arc<Sampling>>,
    future: F,
) -> direct::Outside<impl std::future::Future<Output = F::Output>> {
    direct::Outside::new(sampling::within(sampling, future))
}

/// `open` run under `sampling`, outside any direct span ([`within`]).
pub(crate) fn within_sync<R>(
    sampling: Option<std::sync::Arc<Sampling>>,
    open: impl FnOnce() -> R,
) -> R {
    direct::outside(|| sampling::within_sync(sampling, open))
}

/// A read's future made and run under its request's trace, away from that
/// request's task ([`carry`]).
pub(crate) type Carried<F> = carried::Scoped<direct::Outside<F>>;

/// The read `make` gives, made and run under `away` — its request's
/// sampling and the span its reads are under (`carried.rs`) — and outside
/// any direct span of the task it runs in (`direct.rs`): an operation's of
/// another request's, entered while the read is polled in that
/// operation's future (a lent handle), is not its parent.
pub(crate) fn carry<F: std::future::Future>(
    away: carried::Away,
    make: impl FnOnce() -> F,
) -> Carried<F> {
    direct::outside(|| carried::carry(away, || direct::Outside::new(make())))
}
pub(crate) use context::{adopt_parent, current_context};
pub(crate) use instruments::{
    is_recording, with as instruments, ClientError, ClientKey, Instruments,
};
pub(crate) use live::is_active as is_exporting;
pub(crate) use sampling::{decide, decided_out, root as root_decision, sampled_out, Sampling};

/// Adds `traceparent`, naming the current span, to `headers` (an upstream
/// request's) while a [`Telemetry`] layer exports spans; else nothing. A
/// caller's `traceparent` passed on as it came (nothing of its request is
/// recorded here) takes its `tracestate` with it.
/// [`HttpTransport`](crate::read::HttpTransport) does it for every request
/// it sends; a [`Transport`](crate::read::Transport) of your own calls it
/// as it builds each request (it runs inside the request's CLIENT span).
pub fn inject_traceparent(headers: &mut http::HeaderMap) {
    context::inject_current(headers);
}

use crate::config::TelemetryConfig;
pub use error::TelemetryError;
use limits::Limits;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::SdkTracerProvider;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tracing_subscriber::filter::FilterExt as _;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// How long dropping a [`Telemetry`] waits for the queued spans to leave.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Builds a [`Telemetry`]: [`Telemetry::builder`].
#[derive(Debug)]
pub struct TelemetryBuilder {
    config: TelemetryConfig,
    service_name: String,
    targets: Vec<String>,
    limits: Limits,
}

impl TelemetryBuilder {
    /// The `service.name` when `[telemetry] service_name` is empty
    /// (default: `fanout-budget`); a binary passes its own name.
    #[must_use]
    pub fn service_name(mut self, name: impl Into<String>) -> Self {
        self.service_name = name.into();
        self
    }

    /// Also exports the spans of `target` (a crate's name, `my_app`) at
    /// `DEBUG` and above; the engine's (`fanout_budget`) always are. With
    /// such a target, each operation's span is a `tracing` span, so the
    /// spans a resolver opens are its children; with none, the engine
    /// builds it as it builds a read's (cheaper: the book's Telemetry
    /// chapter).
    #[must_use]
    pub fn target(mut self, target: impl Into<String>) -> Self {
        self.targets.push(target.into());
        self
    }

    /// Spans queued or being exported at most (default 2048, up to
    /// 524,288); past it an ended span is dropped and counted.
    #[must_use]
    pub fn max_queued_spans(mut self, spans: usize) -> Self {
        self.limits.max_queued_spans = spans.clamp(1, in_flight::MAX_SPANS);
        self
    }

    /// The queued spans' estimated bytes at most (default 8 MiB: name,
    /// attributes, events, links and trace state, each text already cut to
    /// `attribute_value_length_limit`); past it an ended span is dropped
    /// and counted (`reason="queue_bytes"`). Up to 64 GiB. A batch being
    /// exported is copied into its protobuf meanwhile: export holds up to
    /// about twice this.
    #[must_use]
    pub fn max_queued_bytes(mut self, bytes: u64) -> Self {
        self.limits.max_queued_bytes = bytes;
        self
    }

    /// How often queued spans are exported (default 1 s); a full batch
    /// (512 spans) leaves at once.
    #[must_use]
    pub fn export_interval(mut self, interval: Duration) -> Self {
        self.limits.export_interval = interval;
        self
    }

    /// How long one export may take (default 5 s): connection, request and
    /// answer; past it the batch is dropped and counted.
    #[must_use]
    pub fn export_timeout(mut self, timeout: Duration) -> Self {
        self.limits.export_timeout = timeout;
        self
    }

    /// How often the metrics are exported (default 10 s).
    #[must_use]
    pub fn metric_interval(mut self, interval: Duration) -> Self {
        self.limits.metric_interval = interval;
        self
    }

    /// The exporting telemetry, or `None` when no endpoint is configured.
    /// Call inside the tokio runtime that serves: exports run on it.
    pub fn build(self) -> Result<Option<Telemetry>, TelemetryError> {
        if !self.config.is_enabled() {
            return Ok(None);
        }
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|_| TelemetryError::NoRuntime)?;
        // No target of the application's: no span of its own can open
        // inside an operation, whose span can then be a direct one
        // (`graphql/operation_span.rs`).
        let operations_direct = self
            .targets
            .iter()
            .all(|target| target == env!("CARGO_CRATE_NAME"));
        let (provider, sink, meters) = provider::build(
            &self.config,
            &self.service_name,
            &self.limits,
            runtime,
            operations_direct,
        )?;
        let instruments = Instruments::publish(&meters.meter(env!("CARGO_PKG_NAME")));
        Ok(Some(Telemetry {
            provider,
            sink,
            meters,
            instruments,
            targets: self.targets,
            sample_ratio: self.config.sample_ratio,
            layered: AtomicBool::new(false),
        }))
    }
}

/// The tracer provider exporting over OTLP, and the guard that sends what is
/// queued when dropped.
#[derive(Debug)]
pub struct Telemetry {
    provider: SdkTracerProvider,
    /// Where the sampled requests' reads' spans go (`direct.rs`).
    sink: Arc<sink::Sink>,
    meters: SdkMeterProvider,
    instruments: Arc<Instruments>,
    targets: Vec<String>,
    /// `sample_ratio`, for the requests' decisions (`sampling.rs`).
    sample_ratio: f64,
    /// A layer was made: propagation is on while this lives.
    layered: AtomicBool,
}

impl Telemetry {
    /// Starts from `config`, its `OTEL_*` variables already applied
    /// ([`TelemetryConfig::with_env`]).
    pub fn builder(config: TelemetryConfig) -> TelemetryBuilder {
        TelemetryBuilder {
            config,
            service_name: env!("CARGO_PKG_NAME").to_owned(),
            targets: vec![env!("CARGO_CRATE_NAME").to_owned()],
            limits: Limits {
                max_queued_spans: 2048,
                max_queued_bytes: 8 << 20,
                max_batch_spans: 512,
                export_interval: Duration::from_secs(1),
                export_timeout: Duration::from_secs(5),
                metric_interval: Duration::from_secs(10),
            },
        }
    }

    /// The layer to add to the application's subscriber: the engine's spans
    /// (and the builder's targets') at `DEBUG` and above become OpenTelemetry
    /// spans, whatever the other layers' filters. Making it turns
    /// `traceparent` propagation on.
    pub fn layer<S>(&self) -> impl Layer<S> + Send + Sync + 'static
    where
        S: tracing::Subscriber + for<'span> LookupSpan<'span> + Send + Sync + 'static,
    {
        let targets = self.targets.iter().fold(Targets::new(), |t, target| {
            t.with_target(target.clone(), tracing::Level::DEBUG)
        });
        if !self.layered.swap(true, Ordering::Relaxed) {
            live::activate();
        }
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer(env!("CARGO_PKG_NAME")))
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_tracked_inactivity(false)
            // No OpenTelemetry context attached at each enter of a span (a
            // future's span is entered at every poll): nothing here reads
            // `Context::current()`; `traceparent` is written from the
            // tracing span's own context (`context.rs`).
            .with_context_activation(false)
            .with_filter(
                targets
                    .and(sampling::SampledOnly {
                        ratio: self.sample_ratio,
                        sink: self.sink.clone(),
                    })
                    .and(carried::Marking),
            )
    }

    /// Exports every span ended so far and the metrics, and waits for it
    /// (blocking: call from `spawn_blocking` or a thread of its own).
    pub fn flush(&self) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let spans = self.provider.force_flush();
        self.meters.force_flush()?;
        spans.map_err(Into::into)
    }
}

impl Drop for Telemetry {
    /// Sends the queued spans, waiting up to 5 s. On a multi-threaded
    /// runtime's worker the wait lets the other workers run the export; on
    /// a current-thread runtime the export cannot run while it waits, so
    /// drop it off the runtime (or outside its `block_on`).
    fn drop(&mut self) {
        if *self.layered.get_mut() {
            live::deactivate();
        }
        Instruments::withdraw(&self.instruments);
        let (provider, meters) = (self.provider.clone(), self.meters.clone());
        let shutdown = move || {
            let _ = provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT);
            let _ = meters.shutdown_with_timeout(SHUTDOWN_TIMEOUT);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime)
                if runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread =>
            {
                tokio::task::block_in_place(shutdown);
            }
            _ => shutdown(),
        }
    }
}
