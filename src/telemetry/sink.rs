//! Where a telemetry's direct spans go (`direct.rs`): its bounded
//! processor, under the scope its tracer exports spans with. A request
//! sampled by a telemetry's filter keeps that telemetry's sink
//! (`sampling.rs`), so its spans go where its other spans go, whatever
//! other telemetry lives in the process.

use super::processor::CountingProcessor;
use opentelemetry::InstrumentationScope;
use opentelemetry_sdk::trace::{SpanData, SpanProcessor as _};
use std::sync::Arc;

/// Where a telemetry's direct spans go: its processor, and the scope its
/// spans are exported under (the tracer's).
#[derive(Debug)]
pub(crate) struct Sink {
    processor: Arc<CountingProcessor>,
    scope: InstrumentationScope,
    /// Whether the operations' spans are direct ones: the telemetry
    /// exports the engine's spans alone (`graphql/operation_span.rs`).
    operations_direct: bool,
}

impl Sink {
    /// Spans handed to `processor`, under the scope `name`; the
    /// operations' spans direct ones when `operations_direct`.
    pub(crate) fn new(
        processor: Arc<CountingProcessor>,
        name: &'static str,
        operations_direct: bool,
    ) -> Arc<Sink> {
        Arc::new(Sink {
            processor,
            scope: InstrumentationScope::builder(name).build(),
            operations_direct,
        })
    }

    /// Whether the operations' spans are direct ones.
    pub(crate) fn operations_direct(&self) -> bool {
        self.operations_direct
    }

    /// Hands an ended span to the processor (cut, weighed, queued or
    /// dropped and counted).
    pub(crate) fn end(&self, span: SpanData) {
        self.processor.on_end(span);
    }

    /// The scope the spans are exported under.
    pub(crate) fn scope(&self) -> &InstrumentationScope {
        &self.scope
    }
}
