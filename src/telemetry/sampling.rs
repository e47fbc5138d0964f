//! Sampling decided once per inbound request, before its first span, so a
//! request sampled out costs the decision and nothing more.
//!
//! How it works:
//! - As a request arrives, what its caller said is kept ([`decide`]: an
//!   inbound `traceparent`'s flag and trace id), in a task-local value
//!   around the request's future ([`within`]). A WebSocket event, which has
//!   no headers, starts a trace ([`root`]).
//! - The layer's filter ([`SampledOnly`]) takes the [`Decision`] at the
//!   request's first span, once: the caller's flag, else its own
//!   `sample_ratio` applied to a fresh trace id (the arithmetic of
//!   OpenTelemetry's `TraceIdRatioBased`). Every span the engine opens
//!   while serving the request reaches the OpenTelemetry layer only when
//!   the request is sampled. A span no layer wants is `Span::none()` (the
//!   read path checks), so a request sampled out builds no span at all: no
//!   registry slot, no OpenTelemetry span data, no attribute formatted, no
//!   sampler run. (Without this filter every span of every request was
//!   built as an OpenTelemetry span, then dropped at its end.)
//! - The SDK's sampler ([`RequestSampler`]) keeps the root of a request
//!   that got through (the decision already made) and follows the parent
//!   for the rest; a span outside any request (none here; an application's
//!   own) falls back to a parent-based `sample_ratio`.
//! - A sampled-out request still sends `traceparent` upstream, with its
//!   trace id (the caller's, or the fresh one) and the unsampled flag
//!   (`context.rs`), so an upstream's own sampling follows the decision; a
//!   caller's own decision goes on as the caller wrote it, `tracestate`
//!   and all ([`passed_on`]). A request no layer saw decides nothing.

use super::live::is_active;
use super::sink::Sink;
use futures::future::Either;
use opentelemetry::trace::{
    Link, SpanContext, SpanId, SpanKind, TraceContextExt as _, TraceId, TraceState,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{
    IdGenerator, RandomIdGenerator, Sampler, SamplingDecision, SamplingResult, ShouldSample,
};
use std::future::Future;
use std::sync::{Arc, OnceLock};
use tracing::subscriber::Interest;
use tracing::Metadata;
use tracing_subscriber::layer::{Context as LayerContext, Filter};

/// One request's decision, and the trace id its `traceparent` names when
/// it is sampled out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Decision {
    pub(crate) sampled: bool,
    pub(crate) trace_id: TraceId,
}

/// A request's sampling: what its caller said, and the decision, taken by
/// the layer's filter at the request's first span with the layer's own
/// `sample_ratio` (a process may hold more than one telemetry).
#[derive(Debug)]
pub(crate) struct Sampling {
    /// What the caller's `traceparent` and `tracestate` said.
    inbound: Option<Caller>,
    decided: OnceLock<Decision>,
    /// Where the request's direct spans go (`direct.rs`): the sink of the
    /// telemetry whose filter sampled it.
    sink: OnceLock<Arc<Sink>>,
}

impl Sampling {
    fn new(inbound: Option<Caller>) -> Arc<Sampling> {
        Arc::new(Sampling {
            inbound,
            decided: OnceLock::new(),
            sink: OnceLock::new(),
        })
    }

    fn decide(&self, ratio: f64) -> Decision {
        *self.decided.get_or_init(|| {
            self.inbound
                .as_ref()
                .map(|caller| caller.decision)
                .unwrap_or_else(|| {
                    let trace_id = RandomIdGenerator::default().new_trace_id();
                    Decision {
                        sampled: kept(ratio, trace_id),
                        trace_id,
                    }
                })
        })
    }

    /// See [`passed_on`].
    fn passed_on(&self) -> Option<Passed> {
        let caller = self.inbound.as_ref();
        match (self.decided.get(), caller) {
            // The caller's decision stands, and no span of the request's
            // names the read: the caller's span stays the parent.
            (Some(decision), Some(caller)) if *decision == caller.decision => Some(caller.passed()),
            // Sampled, yet no span names the read (a per-target filter
            // keeps the engine's spans out): the decision's trace id is no
            // exported span's, so nothing is said.
            (Some(decision), _) if decision.sampled => None,
            (Some(decision), _) => Some(Passed {
                trace_id: decision.trace_id,
                span_id: RandomIdGenerator::default().new_span_id(),
                sampled: false,
                tracestate: None,
            }),
            // No layer saw the request, so none decided; nor is anything
            // decided here — a span a layer sees later in the request (an
            // application's own, under a per-target filter) decides as
            // ever. The caller's trace goes on as it came; a trace that
            // would start here sends none, the upstream starting its own.
            (None, Some(caller)) => Some(caller.passed()),
            (None, None) => None,
        }
    }
}

/// What a caller's `traceparent` said, and its `tracestate` (parsed,
/// bounded).
#[derive(Debug)]
struct Caller {
    decision: Decision,
    /// Its parent id, when its `traceparent` was written as the engine
    /// would write it (so it can go on as it came).
    parent: Option<SpanId>,
    /// Its parent id, however it was written.
    span_id: SpanId,
    tracestate: Option<http::HeaderValue>,
}

impl Caller {
    /// Its context, passed on as it came; one the engine would write
    /// otherwise goes on as its trace id and flag with a span id of the
    /// engine's own, without its `tracestate`.
    fn passed(&self) -> Passed {
        match self.parent {
            Some(parent) => Passed {
                trace_id: self.decision.trace_id,
                span_id: parent,
                sampled: self.decision.sampled,
                tracestate: self.tracestate.clone(),
            },
            None => Passed {
                trace_id: self.decision.trace_id,
                span_id: RandomIdGenerator::default().new_span_id(),
                sampled: self.decision.sampled,
                tracestate: None,
            },
        }
    }
}

/// The trace context an upstream request carries when no span of its
/// request's names it ([`passed_on`]).
#[derive(Debug, PartialEq)]
pub(crate) struct Passed {
    pub(crate) trace_id: TraceId,
    pub(crate) span_id: SpanId,
    pub(crate) sampled: bool,
    /// The caller's `tracestate`, when its `traceparent` goes on unchanged
    /// (in the caller's trace, as every upstream request is).
    pub(crate) tracestate: Option<http::HeaderValue>,
}

tokio::task_local! {
    /// The sampling of the request the current task serves (or whose
    /// read it makes: `carried.rs`).
    pub(super) static SAMPLING: Arc<Sampling>;
}

/// The sampling of a request whose headers are `headers`, while spans are
/// exported; `None` otherwise (nothing to decide).
pub(crate) fn decide(headers: &http::HeaderMap) -> Option<Arc<Sampling>> {
    if !is_active() {
        return None;
    }
    let inbound = inbound(headers).map(|parent| {
        // Passed on as it came only when it is written as it would be
        // (OpenTelemetry's parse takes more): one line, version `00`, the
        // canonical 55 bytes. Its `tracestate` goes with it as parsed —
        // valid members, 32 at most, within 512 bytes — never empty.
        let verbatim = super::inbound::canonical_traceparent(headers);
        let state = parent.trace_state().header();
        let tracestate = (verbatim && !state.is_empty())
            // Owned by its `Bytes`: each upstream request's clone shares it.
            .then(|| http::HeaderValue::from_maybe_shared(bytes::Bytes::from_owner(state)).ok())
            .flatten();
        Caller {
            decision: Decision {
                sampled: parent.is_sampled(),
                trace_id: parent.trace_id(),
            },
            parent: verbatim.then(|| parent.span_id()),
            span_id: parent.span_id(),
            tracestate,
        }
    });
    Some(Sampling::new(inbound))
}

/// The sampling of a trace that starts here (a WebSocket event), while
/// spans are exported.
pub(crate) fn root() -> Option<Arc<Sampling>> {
    is_active().then(|| Sampling::new(None))
}

/// The span context an inbound `traceparent` names, when it is valid
/// (its `tracestate`, every line joined and bounded, parsed with it).
fn inbound(headers: &http::HeaderMap) -> Option<SpanContext> {
    if !headers.contains_key("traceparent") {
        return None;
    }
    let parent = super::inbound::extract(headers);
    let context = parent.span().span_context().clone();
    context.is_valid().then_some(context)
}

/// `TraceIdRatioBased`'s arithmetic: the trace id's low 63 bits under
/// `ratio` × 2^63.
fn kept(ratio: f64, trace_id: TraceId) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    let bound = (ratio.max(0.0) * (1u64 << 63) as f64) as u64;
    let low = u64::from_be_bytes(trace_id.to_bytes()[8..].try_into().expect("8 bytes"));
    (low >> 1) < bound
}

/// `future` run under `sampling` (as is, without one). A plain wrapper,
/// not an `async fn`: an `async fn` would hold `future` twice (as its
/// argument, and again as what it awaits) — and the request's whole future
/// passes through here.
pub(crate) fn within<F: Future>(
    sampling: Option<Arc<Sampling>>,
    future: F,
) -> impl Future<Output = F::Output> {
    match sampling {
        Some(sampling) => Either::Left(SAMPLING.scope(sampling, future)),
        None => Either::Right(future),
    }
}

/// `open` run under `sampling` (as is, without one): for the span that
/// opens the request, before its future runs.
pub(crate) fn within_sync<R>(sampling: Option<Arc<Sampling>>, open: impl FnOnce() -> R) -> R {
    match sampling {
        Some(sampling) => SAMPLING.sync_scope(sampling, open),
        None => open(),
    }
}

/// The sampling of the request the current task serves, for work it
/// hands to a task of its own (a coalesced read's send): run under it
/// ([`within`]), that work names the request's trace upstream, sampled or
/// not.
pub(crate) fn carried() -> Option<Arc<Sampling>> {
    SAMPLING.try_with(Arc::clone).ok()
}

/// The decision of the request the current task serves, once taken.
pub(crate) fn current() -> Option<Decision> {
    SAMPLING
        .try_with(|sampling| sampling.decided.get().copied())
        .ok()
        .flatten()
}

/// The `traceparent` of an upstream request the current task sends for
/// its request when no span of the request's names it — the request sampled
/// out, or seen by no telemetry's layer at all (an application's level
/// filter kept its span out): the caller's trace id, parent id and flag,
/// and its `tracestate`, as they came when the caller's decision stands
/// (nothing of the request is recorded here); else, for a request sampled out, its trace id, a span
/// id of its own and the unsampled flag. `None` for a trace that would
/// start at a request no layer saw, and outside a request.
pub(crate) fn passed_on() -> Option<Passed> {
    SAMPLING
        .try_with(|sampling| sampling.passed_on())
        .ok()
        .flatten()
}

/// The `tracestate` of the caller of the request the current task serves,
/// for an upstream request in the caller's trace (`trace_id`): `Some(None)`
/// when it sent none, or a `traceparent` not written as the W3C writes it,
/// or the trace is not the caller's; `None` outside a request the engine
/// opened.
pub(crate) fn caller_tracestate(trace_id: TraceId) -> Option<Option<http::HeaderValue>> {
    let of_caller = |sampling: &Arc<Sampling>| {
        let caller = sampling.inbound.as_ref()?;
        (caller.decision.trace_id == trace_id)
            .then(|| caller.tracestate.clone())
            .flatten()
    };
    SAMPLING.try_with(of_caller).ok()
}

/// The caller's span, as a remote parent, of the request the current task
/// serves (or whose read it makes), if it had a caller: where a span the
/// engine opens with no span of the request's above it joins the caller's
/// trace, as the request's own span does (`adopt_parent`).
pub(crate) fn caller_parent() -> Option<SpanContext> {
    let of_caller = |sampling: &Arc<Sampling>| {
        let caller = sampling.inbound.as_ref()?;
        let state = caller.tracestate.as_ref().and_then(|state| {
            let state = state.to_str().ok()?;
            state.parse::<TraceState>().ok()
        });
        let flags = if caller.decision.sampled {
            opentelemetry::trace::TraceFlags::SAMPLED
        } else {
            opentelemetry::trace::TraceFlags::default()
        };
        Some(SpanContext::new(
            caller.decision.trace_id,
            caller.span_id,
            flags,
            true,
            state.unwrap_or_default(),
        ))
    };
    SAMPLING.try_with(of_caller).ok().flatten()
}

/// Where the direct spans of the request the current task serves go, when
/// a telemetry sampled it (`direct.rs`).
pub(crate) fn sink() -> Option<Arc<Sink>> {
    SAMPLING
        .try_with(|sampling| sampling.sink.get().cloned())
        .ok()
        .flatten()
}

/// Whether the request the current task serves was sampled out: then the
/// engine opens none of its DEBUG spans (reads, requests, operations), for
/// any layer. The layer's filter alone would not spare them: with
/// per-layer filters, tracing-subscriber's registry opens a span unless
/// all 64 of its filter slots disable it, so every read of every request
/// cost its spans whatever the sampling said.
pub(crate) fn sampled_out() -> bool {
    is_active() && current().is_some_and(|decision| !decision.sampled)
}

/// The field that marks the span of a request sampled out
/// (`graphql.request` opened at a callsite of its own): the layer's filter
/// refuses that callsite once and for all, so with no other layer
/// listening the registry opens no span for the request — instead of one
/// it enters and leaves at every poll for nobody — while a log's layer
/// still gets it, the field saying why no trace has it.
/// (`graphql/server_span.rs` names it in its macro: a test fails if the two
/// differ.)
const SAMPLED_OUT: &str = "fanout.sampled_out";

/// Whether the request the current task serves is sampled out, deciding it
/// now if no span did yet: the layers' filters are asked as for a span of
/// the request's level (a hint; the decision is the filter's, with its
/// telemetry's `sample_ratio`). False outside a request or while no
/// telemetry exports.
pub(crate) fn decided_out() -> bool {
    if !is_active() || SAMPLING.try_with(|_| ()).is_err() {
        return false;
    }
    // At the request span's own target, so a filter by target decides
    // for the hint as it would for the span.
    let _ = tracing::enabled!(target: "fanout_budget::graphql::server_span", tracing::Level::INFO);
    sampled_out()
}

/// The field that marks the callsite asked whether a layer other than the
/// telemetry's takes an operation's span (`graphql/operation_span.rs`):
/// the layer's filter refuses it once and for all.
const DIRECT: &str = "fanout.direct";

/// Whether `meta` is the callsite of a request sampled out, or the one
/// asking whether other layers take an operation's span.
fn marked_out(meta: &Metadata<'_>) -> bool {
    let fields = meta.fields();
    fields.field(SAMPLED_OUT).is_some() || fields.field(DIRECT).is_some()
}

/// The OpenTelemetry layer's filter: within a request, only a sampled
/// request's spans and events; outside any, everything (the sampler
/// decides); never the span of a request sampled out ([`SAMPLED_OUT`]).
#[derive(Clone, Debug)]
pub(crate) struct SampledOnly {
    /// `sample_ratio`, for a request whose caller did not decide.
    pub(crate) ratio: f64,
    /// The telemetry's sink, left in each request it samples.
    pub(crate) sink: Arc<Sink>,
}

impl<S> Filter<S> for SampledOnly {
    fn enabled(&self, meta: &Metadata<'_>, _cx: &LayerContext<'_, S>) -> bool {
        if marked_out(meta) {
            return false;
        }
        SAMPLING
            .try_with(|sampling| {
                let sampled = sampling.decide(self.ratio).sampled;
                if sampled && sampling.sink.get().is_none() {
                    let _ = sampling.sink.set(self.sink.clone());
                }
                sampled
            })
            .unwrap_or(true)
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        // Decided per request, never per callsite, but for the one that
        // says its request was sampled out.
        if marked_out(meta) {
            Interest::never()
        } else {
            Interest::sometimes()
        }
    }
}

/// The SDK's sampler: a root within a request is kept (its spans reach the
/// SDK only when the request was sampled); anything else follows its
/// parent, or `sample_ratio` for a root outside any request.
#[derive(Clone, Debug)]
pub(crate) struct RequestSampler {
    otherwise: Sampler,
}

impl RequestSampler {
    pub(crate) fn new(ratio: f64) -> Self {
        RequestSampler {
            otherwise: Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio))),
        }
    }
}

impl ShouldSample for RequestSampler {
    fn should_sample(
        &self,
        parent_context: Option<&Context>,
        trace_id: TraceId,
        name: &str,
        span_kind: &SpanKind,
        attributes: &[KeyValue],
        links: &[Link],
    ) -> SamplingResult {
        let root = parent_context.is_none_or(|cx| !cx.has_active_span());
        match current() {
            Some(decision) if root => SamplingResult {
                decision: if decision.sampled {
                    SamplingDecision::RecordAndSample
                } else {
                    SamplingDecision::Drop
                },
                attributes: Vec::new(),
                trace_state: TraceState::default(),
            },
            _ => self.otherwise.should_sample(
                parent_context,
                trace_id,
                name,
                span_kind,
                attributes,
                links,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ratio_keeps_its_share_of_trace_ids() {
        let ids = RandomIdGenerator::default();
        let kept = (0..10_000)
            .filter(|_| kept(0.1, ids.new_trace_id()))
            .count();
        assert!((700..1300).contains(&kept), "{kept} of 10,000 at 0.1");
        assert!(!kept_at(0.0));
        assert!(kept_at(1.0));
    }

    fn kept_at(ratio: f64) -> bool {
        kept(ratio, RandomIdGenerator::default().new_trace_id())
    }

    #[test]
    fn a_request_is_decided_once_and_a_caller_decides_for_its_own() {
        assert_eq!(current(), None, "outside a request");
        let (before, first, second) = SAMPLING.sync_scope(Sampling::new(None), || {
            let before = current();
            let sampling = SAMPLING.with(Arc::clone);
            (before, sampling.decide(0.0), sampling.decide(1.0))
        });
        assert_eq!(before, None, "not decided before its first span");
        assert!(!first.sampled);
        assert_eq!(first, second, "decided once");
        let caller = Decision {
            sampled: true,
            trace_id: TraceId::from_bytes([7; 16]),
        };
        let parent = SpanId::from_bytes([9; 8]);
        let tracestate = Some(http::HeaderValue::from_static("rojo=00f067aa0ba902b7"));
        let called = Sampling::new(Some(Caller {
            decision: caller,
            parent: Some(parent),
            span_id: parent,
            tracestate: tracestate.clone(),
        }));
        assert_eq!(called.decide(0.0), caller, "the caller's flag and trace");
        let passed = called.passed_on().expect("passed on");
        assert_eq!(
            (passed.trace_id, passed.span_id, passed.sampled),
            (caller.trace_id, parent, true),
            "as it came"
        );
        assert_eq!(passed.tracestate, tracestate, "its tracestate with it");
    }

    #[test]
    fn a_request_no_layer_saw_decides_nothing_and_passes_its_caller_on() {
        let unseen = Sampling::new(None);
        assert_eq!(unseen.passed_on(), None, "no trace starts upstream");
        assert!(unseen.decided.get().is_none(), "nothing decided");
        // A layer that sees a span of the request later decides as ever.
        assert!(unseen.decide(1.0).sampled);
        let caller = Decision {
            sampled: false,
            trace_id: TraceId::from_bytes([3; 16]),
        };
        let parent = SpanId::from_bytes([4; 8]);
        let called = Sampling::new(Some(Caller {
            decision: caller,
            parent: Some(parent),
            span_id: parent,
            tracestate: None,
        }));
        let passed = called.passed_on().expect("passed on");
        assert_eq!(
            (passed.trace_id, passed.span_id, passed.sampled),
            (caller.trace_id, parent, false),
            "as it came"
        );
        assert!(called.decided.get().is_none(), "nothing decided");
    }
}
