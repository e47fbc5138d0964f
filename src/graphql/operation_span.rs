//! The span an operation runs in, `graphql.operation`, in OpenTelemetry's
//! GraphQL conventions: named after its type (its name, as the document
//! gives it, is an attribute: names are many), INTERNAL under the
//! request's SERVER span; what it was priced, and after it ran
//! ([`OperationSpan::record`]) what it sent. A WebSocket event's
//! ([`OperationSpan::event`]) is the SERVER span of a trace of its own: a
//! connection lives for hours, and a trace per event is what a tracing
//! backend can show.
//!
//! How it works:
//! - Without a telemetry, or for a request it did not sample, the span is a
//!   `tracing` span at `DEBUG`, as any layer sees it (`Span::none()` for a
//!   request sampled out: no layer gets the engine's debug spans).
//! - For a request a telemetry sampled, when that telemetry exports the
//!   engine's spans alone (no target of the application's added: no span
//!   of the application's can open inside it) and no other layer (a log's
//!   at `DEBUG`) takes the operation's span, the span is built straight as
//!   OpenTelemetry span data (`telemetry/direct.rs`) and no `tracing` span
//!   is opened: entered at each poll as a thread-local handle, so the
//!   reads' spans are its children — not a registry slot looked up, locked
//!   and clocked at every poll of the operation. The request's span is the
//!   current `tracing` span inside it: an event of the engine's logged
//!   there is exported on the request's span (an application's is not
//!   exported without its target). Whether another layer takes the span is
//!   asked of a callsite the telemetry's layer refuses (`fanout.direct`), of
//!   the subscriber the operation runs under; while more than one
//!   telemetry that made a layer lives, the span is a `tracing` one. Only `FanoutGraphQL` samples a request as it arrives
//!   (behind `FanoutLayer`, the span is a `tracing` one).

use opentelemetry_support::Direct;
use std::future::Future;
use tracing::Instrument as _;

/// The callsites of the operation's `tracing` span: one field list, the
/// target the span always had; `parent` `parent: None,` and `kind` its
/// `otel.kind` for an event's.
macro_rules! operation_span {
    ($op:expr, [$($parent:tt)*] $(, $($kind:tt)*)?) => {
        tracing::debug_span!(
            target: "fanout_budget::graphql::pipeline",
            $($parent)*
            "graphql.operation",
            otel.name = $op.kind.unwrap_or("GraphQL Operation"),
            $($($kind)*)?
            graphql.operation.type = $op.kind,
            graphql.operation.name = $op.name,
            graphql.document = tracing::field::Empty,
            fanout.requested = $op.requested.map(super::server_span::int),
            fanout.reads = tracing::field::Empty,
            fanout.cache_hits = tracing::field::Empty,
            fanout.delta = tracing::field::Empty,
            fanout.would_refuse = tracing::field::Empty,
        )
    };
}

/// What an operation's span says of it as it opens.
pub(super) struct Described<'a> {
    /// `query`, `mutation` or `subscription`, when the document names it.
    pub(super) kind: Option<&'static str>,
    /// Its name, as the document gives it.
    pub(super) name: Option<&'a str>,
    /// Its estimate, when a cost table priced it.
    pub(super) requested: Option<u64>,
    /// Its text, when `telemetry.record_document` asks for it.
    pub(super) document: Option<&'a str>,
}

/// What an operation sent, recorded on its span as it ends.
pub(super) struct Sent {
    pub(super) reads: u64,
    pub(super) cache_hits: u64,
    /// Reads a limit in measure mode let through, so far in the request.
    pub(super) would_refuse: u64,
    /// Requested − reads, when it was priced.
    pub(super) delta: Option<i64>,
}

/// An operation's span: a `tracing` one or a direct one (module docs).
pub(super) struct OperationSpan {
    tracing: tracing::Span,
    direct: Direct,
}

impl OperationSpan {
    /// The span of an operation of a request, opened in the request's span.
    pub(super) fn open(described: &Described<'_>) -> OperationSpan {
        // A request a telemetry sampled out opens none of the engine's
        // debug spans, for any layer (`telemetry::sampled_out`).
        #[cfg(feature = "otel")]
        if crate::telemetry::sampled_out() {
            return OperationSpan {
                tracing: tracing::Span::none(),
                direct: Direct::none(),
            };
        }
        if let Some(direct) = Direct::open(described) {
            return OperationSpan {
                tracing: tracing::Span::none(),
                direct,
            };
        }
        let tracing = operation_span!(described, []);
        OperationSpan {
            tracing: with_document(tracing, described),
            direct: Direct::none(),
        }
    }

    /// The span of a WebSocket event: the root of a trace of its own, a
    /// `tracing` span.
    pub(super) fn event(described: &Described<'_>) -> OperationSpan {
        let tracing = operation_span!(described, [parent: None,], otel.kind = "server",);
        OperationSpan {
            tracing: with_document(tracing, described),
            direct: Direct::none(),
        }
    }

    /// Makes the reads `operation` makes away from the request's task
    /// children of this span.
    pub(super) fn trace(&self, operation: &crate::request::Operation) {
        if !self.direct.keep_for(operation) {
            operation.traced_under(&self.tracing);
        }
    }

    /// `future`, run inside the span (or inside none: as it is).
    pub(super) fn around<F: Future>(&self, future: F) -> impl Future<Output = F::Output> {
        self.direct.around(future.instrument(self.tracing.clone()))
    }

    /// Records what the operation sent.
    pub(super) fn record(&self, sent: &Sent) {
        self.direct.record(sent);
        let span = &self.tracing;
        if span.is_disabled() {
            return;
        }
        let int = super::server_span::int;
        span.record("fanout.reads", int(sent.reads));
        span.record("fanout.cache_hits", int(sent.cache_hits));
        if sent.would_refuse > 0 {
            span.record("fanout.would_refuse", int(sent.would_refuse));
        }
        if let Some(delta) = sent.delta {
            span.record("fanout.delta", delta);
        }
    }
}

/// `span` with the operation's document, when asked for.
fn with_document(span: tracing::Span, described: &Described<'_>) -> tracing::Span {
    if let Some(document) = described.document {
        if !span.is_disabled() {
            span.record("graphql.document", document);
        }
    }
    span
}

#[cfg(feature = "otel")]
mod opentelemetry_support {
    //! The direct half of an operation's span (`telemetry/direct.rs`).

    use super::{Described, Sent};
    use crate::telemetry::direct;
    use futures::future::Either;
    use opentelemetry::KeyValue;
    use std::future::Future;

    /// The operation's direct span, when it has one.
    pub(super) struct Direct(Option<direct::Span>);

    impl Direct {
        /// None.
        pub(super) fn none() -> Direct {
            Direct(None)
        }

        /// A direct span for the operation `described`, when its request was
        /// sampled by a telemetry that exports the engine's spans alone,
        /// its `tracing` span would be exported (the engine's debug spans
        /// are enabled where it opens, under an exported span of the
        /// request's) and no other layer would take it.
        pub(super) fn open(described: &Described<'_>) -> Option<Direct> {
            if !crate::telemetry::is_exporting() || !direct::operations_direct() {
                return None;
            }
            // Its `tracing` span would be opened where it opens (no level
            // filter keeps it out), and no layer but the telemetry's would
            // take it (a callsite that layer refuses, asked).
            let opened = tracing::enabled!(
                kind: tracing::metadata::Kind::SPAN,
                target: "fanout_budget::graphql::pipeline",
                tracing::Level::DEBUG
            );
            if !opened
                || tracing::enabled!(
                    kind: tracing::metadata::Kind::SPAN,
                    target: "fanout_budget::graphql::pipeline",
                    tracing::Level::DEBUG,
                    fanout.direct
                )
            {
                return None;
            }
            let mut attributes = Vec::with_capacity(4);
            if let Some(kind) = described.kind {
                attributes.push(KeyValue::new("graphql.operation.type", kind));
            }
            if let Some(name) = described.name {
                attributes.push(KeyValue::new("graphql.operation.name", name.to_owned()));
            }
            if let Some(document) = described.document {
                attributes.push(KeyValue::new("graphql.document", document.to_owned()));
            }
            if let Some(requested) = described.requested {
                let requested = super::super::server_span::int(requested);
                attributes.push(KeyValue::new("fanout.requested", requested));
            }
            let name = described.kind.unwrap_or("GraphQL Operation");
            direct::Span::operation(name, attributes).map(|span| Direct(Some(span)))
        }

        /// Keeps the span as the parent of the reads `operation` makes away
        /// from the request's task; false without one.
        pub(super) fn keep_for(&self, operation: &crate::request::Operation) -> bool {
            match &self.0 {
                Some(span) => {
                    operation.traced_under_direct(span.context());
                    true
                }
                None => false,
            }
        }

        /// `future`, with the span entered at each poll.
        pub(super) fn around<F: Future>(&self, future: F) -> Either<direct::Entered<F>, F> {
            match &self.0 {
                Some(span) => Either::Left(span.around(future)),
                None => Either::Right(future),
            }
        }

        /// Records what the operation sent.
        pub(super) fn record(&self, sent: &Sent) {
            let Some(span) = &self.0 else {
                return;
            };
            let int = super::super::server_span::int;
            span.set("fanout.reads", int(sent.reads));
            span.set("fanout.cache_hits", int(sent.cache_hits));
            if sent.would_refuse > 0 {
                span.set("fanout.would_refuse", int(sent.would_refuse));
            }
            if let Some(delta) = sent.delta {
                span.set("fanout.delta", delta);
            }
        }
    }
}

#[cfg(not(feature = "otel"))]
mod opentelemetry_support {
    //! Without the `otel` feature, an operation's span is a `tracing` one.

    use super::{Described, Sent};
    use std::future::Future;

    /// Never a direct span.
    pub(super) struct Direct;

    impl Direct {
        pub(super) fn none() -> Direct {
            Direct
        }

        pub(super) fn open(_: &Described<'_>) -> Option<Direct> {
            None
        }

        pub(super) fn keep_for(&self, _: &crate::request::Operation) -> bool {
            false
        }

        pub(super) fn around<F: Future>(&self, future: F) -> F {
            future
        }

        pub(super) fn record(&self, _: &Sent) {}
    }
}
