//! A request's trace, carried by an operation's handle to the reads made
//! through it outside the request's task: a `DataLoader` whose loads
//! async-graphql spawns, a task a resolver spawns, a shared poll's read.
//! Such a task has none of the request's task-local sampling
//! (`sampling.rs`) and none of its `tracing` spans entered: without this,
//! its reads' spans were traces of their own, sampled by `sample_ratio`,
//! and the `traceparent` they sent named those.
//!
//! How it works:
//! - As the handle is made in the request's task ([`CarriedTrace::here`]),
//!   it keeps the request's sampling and, when the request is sampled, the
//!   context of the span current then (the request's); when the
//!   operation's span opens, that one's ([`CarriedTrace::under`]).
//! - A read made through the handle in a task without a request's sampling,
//!   or in another request's task (a handle lent, a loader shared between
//!   requests: [`CarriedTrace::away`]), is made and run under the kept sampling
//!   ([`carry`]), its direct spans parented to the kept span ([`parent`],
//!   `direct.rs`): the request's trace, sampled or not, as in its own task.
//! - Nothing is kept while no telemetry exports, and a read in the
//!   request's own task costs two atomic loads and a task-local look-up.

use super::live::is_active;
use super::opened::{above_current, above_span, adopted, exported_of, note, Above};
use super::sampling::{caller_parent, carried, sampled_out, Sampling, SAMPLING};
use futures::future::Either;
use opentelemetry::trace::{SpanContext, TraceContextExt as _};
use std::sync::atomic::{AtomicUsize, Ordering::Acquire, Ordering::Release};
use std::sync::{Arc, Mutex};
use tokio::task::futures::TaskLocalFuture;
use tracing::span::{Attributes, Id};
use tracing::subscriber::Interest;
use tracing::Metadata;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::layer::{Context as LayerContext, Filter};
use tracing_subscriber::registry::LookupSpan;

/// The trace an operation's reads belong to, for those made outside its
/// request's task.
#[derive(Debug, Default)]
pub(crate) struct CarriedTrace {
    kept: Mutex<Option<Away>>,
    /// The kept sampling's address (0: none kept), to tell the request's
    /// own task from another request's without a lock. The kept `Arc`
    /// holds it, so no other sampling has it meanwhile.
    at: AtomicUsize,
}

/// A request's sampling, and the span its reads are under when it is
/// sampled.
#[derive(Clone, Debug)]
pub(crate) struct Away {
    sampling: Arc<Sampling>,
    parent: Option<SpanContext>,
}

/// Where a read made away from its request's task is ([`PARENT`]).
#[derive(Clone, Debug)]
pub(crate) struct Under {
    /// The span its request's reads are under, if one was kept.
    kept: Option<SpanContext>,
    /// Whether the task serves another request.
    foreign: bool,
}

tokio::task_local! {
    /// Where a read made away from its request's task is.
    static PARENT: Under;
}

/// A future made and run under a request's trace ([`carry`]).
pub(crate) type Scoped<F> = TaskLocalFuture<Arc<Sampling>, TaskLocalFuture<Under, F>>;

impl CarriedTrace {
    /// The trace of the request the current task serves, under its current
    /// span (nothing outside a request, or while no telemetry exports).
    pub(crate) fn here() -> Self {
        let trace = CarriedTrace::default();
        trace.under(&tracing::Span::current());
        trace
    }

    /// Keeps `span` (in the request's task) as the parent of the reads made
    /// away from it, with the request's sampling.
    pub(crate) fn under(&self, span: &tracing::Span) {
        if !is_active() {
            return;
        }
        let Some(sampling) = carried() else {
            return;
        };
        // In a task a read of the request's was carried to, the span the
        // request's reads are under there: a span of another trace (the
        // application's, opened in that task) is not the request's. With
        // none kept there, in another request's task, no span of that
        // task's is.
        let carried_to = parent();
        // A request sampled out has no span to name. The span's own context,
        // or (a span only another layer takes) that of the nearest span
        // above it the telemetry exports — asked for only of a span of the
        // request's where the read was carried (no span of another's is
        // started for nothing).
        let named = |span: &tracing::Span| {
            exported_of(span).filter(|parent| parent.is_valid() && parent.is_sampled())
        };
        let parent = match &carried_to {
            _ if sampled_out() || span.is_none() => None,
            Parent::Current => named(span),
            Parent::Kept(to) => {
                let own = span.context().span().span_context().clone();
                Some(own)
                    .filter(|own| own.is_valid() && own.is_sampled())
                    .filter(|own| own.trace_id() == to.trace_id())
            }
            Parent::OpenedThere | Parent::NoSpan => (above_span(span, &sampling) == Above::Its)
                .then(|| named(span))
                .flatten(),
        };
        let parent = match carried_to {
            Parent::Kept(to) if parent.is_none() && to.is_valid() => Some(to),
            _ => parent,
        };
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        // A span no layer opened (the application's level filter keeps
        // DEBUG out: no operation span) names nothing: the reads stay
        // under the span kept before, the request's.
        let parent = parent.or_else(|| {
            kept.as_ref()
                .filter(|before| Arc::ptr_eq(&before.sampling, &sampling))
                .and_then(|before| before.parent.clone())
        });
        self.at.store(Arc::as_ptr(&sampling) as usize, Release);
        *kept = Some(Away { sampling, parent });
    }

    /// Keeps `parent`, the operation's direct span (`direct.rs`), as the
    /// parent of the reads made away from the request's task, with the
    /// request's sampling: that span was made under the span the request's
    /// reads are under where it opened, and is sampled.
    pub(crate) fn under_direct(&self, parent: &SpanContext) {
        if !is_active() {
            return;
        }
        let Some(sampling) = carried() else {
            return;
        };
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        self.at.store(Arc::as_ptr(&sampling) as usize, Release);
        *kept = Some(Away {
            sampling,
            parent: Some(parent.clone()),
        });
    }

    /// The operation ended: a read made through its handle later (a handle
    /// the application kept) is no longer its request's, and the request's
    /// sampling (and with it its telemetry's queue) is let go.
    pub(crate) fn end(&self) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        self.at.store(0, Release);
        *kept = None;
    }

    /// The kept trace, when a read is made in a task other than its
    /// request's — one without a request's sampling, or another request's
    /// (a handle lent, a loader shared between requests): the read is the
    /// handle's request's, charged to its budget, and in its trace. `None`
    /// in the request's own task (no lock taken), or with nothing kept.
    pub(crate) fn away(&self) -> Option<Away> {
        if !is_active() {
            return None;
        }
        // Nothing kept (0), or kept for the request this task serves. `at`
        // is not 0 only while a trace is kept (both change under the lock).
        let at = self.at.load(Acquire);
        let here = SAMPLING.try_with(|here| Arc::as_ptr(here) as usize).ok();
        if at == 0 || here == Some(at) {
            return None;
        }
        self.kept.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The future `make` gives, made and run under `away`: the request's
/// sampling, and the span its reads' spans are under.
pub(crate) fn carry<F: std::future::Future>(away: Away, make: impl FnOnce() -> F) -> Scoped<F> {
    carry_from(away, false, make)
}

/// [`carry`], from a task of another request's when `foreign` (as it was
/// for the task handing work over, [`hand_over`]) or when the current task
/// serves another request.
fn carry_from<F: std::future::Future>(
    away: Away,
    foreign: bool,
    make: impl FnOnce() -> F,
) -> Scoped<F> {
    let Away { sampling, parent } = away;
    // Into another request's task: a span there is that request's.
    let foreign = foreign
        || SAMPLING
            .try_with(|here| !Arc::ptr_eq(here, &sampling))
            .unwrap_or(false);
    let under = Under {
        kept: parent,
        foreign,
    };
    let made = SAMPLING.sync_scope(sampling.clone(), || PARENT.sync_scope(under.clone(), make));
    SAMPLING.scope(sampling, PARENT.scope(under, made))
}

/// `work` the current task hands to a task of its own (a coalesced read's
/// send), to run there under the current request's trace: its sampling
/// and, when it is sampled, the span current now — so its `traceparent`
/// names that span even when no span of its own is built (a level filter
/// that keeps DEBUG out). As it is outside a request or while no telemetry
/// exports.
pub(crate) fn hand_over<F: std::future::Future>(work: F) -> Either<Scoped<F>, F> {
    let kept = CarriedTrace::here().kept.into_inner();
    // Handed over from a task the read was carried to: the task it goes to
    // is as foreign to the request as this one.
    let foreign = PARENT.try_with(|under| under.foreign).unwrap_or(false);
    match kept.unwrap_or_else(|e| e.into_inner()) {
        Some(away) => Either::Left(carry_from(away, foreign, move || work)),
        None => Either::Right(work),
    }
}

/// Where the spans of a read made in the current task are parented, and
/// which span its upstream requests name with none of its own
/// ([`parent`]).
#[derive(Clone, Debug)]
pub(crate) enum Parent {
    /// Not in a task a read was carried to: the current span, if any.
    Current,
    /// Carried, with a span of the request's kept: that one, whatever span
    /// of another trace the task runs in.
    Kept(SpanContext),
    /// Carried into a task of no request's, none kept: the current span
    /// only if it is the request's (`opened.rs`: opened in the request's
    /// task, or under one of its spans) — a `DataLoader`'s load runs in
    /// the spans of the request's task that spawned it; a loader shared
    /// between requests may spawn its load in another request's spans, a
    /// task may open a span of its own.
    OpenedThere,
    /// Carried into another request's task, none kept: no span of that
    /// task's is the request's — only one the read opened there, of the
    /// request's.
    NoSpan,
}

impl Parent {
    /// Whether the current span may be taken as the request's (one
    /// look-up in the registry where it was carried with none kept).
    pub(crate) fn takes_current(&self) -> bool {
        match self {
            Parent::Current => true,
            Parent::OpenedThere | Parent::NoSpan => SAMPLING
                .try_with(|sampling| {
                    matches!(
                        above_current(sampling),
                        Above::Its | Above::Nothing | Above::Unknown
                    )
                })
                .unwrap_or(true),
            Parent::Kept(_) => false,
        }
    }
}

/// Where the spans of a read made in the current task are parented
/// ([`Parent`]).
pub(crate) fn parent() -> Parent {
    PARENT
        .try_with(|under| match &under.kept {
            Some(kept) => Parent::Kept(kept.clone()),
            None if under.foreign => Parent::NoSpan,
            None => Parent::OpenedThere,
        })
        .unwrap_or(Parent::Current)
}

/// A read path's `tracing` span, just opened where no direct span could be
/// (`direct.rs`: no span of the request's exported above it, or its
/// request not yet decided): made a child of the request's caller's span
/// (a root, with no caller) when no span of the request's is above it —
/// none exported, or the current span not the request's in a task the
/// read was carried to — as the request's own span would be. Else as it
/// was opened.
pub(crate) fn adopt_request_parent(span: &tracing::Span) {
    if !is_active() || span.is_none() {
        return;
    }
    let Ok(sampling) = SAMPLING.try_with(Arc::clone) else {
        return;
    };
    let under = parent();
    if let Parent::Kept(_) = under {
        return;
    }
    match above_current(&sampling) {
        Above::Its | Above::Unknown => return,
        // A span around the request (an application's, opened before the
        // engine saw it): the request's own reads are under it.
        Above::NoRequests if matches!(under, Parent::Current) => return,
        Above::NoRequests | Above::Another | Above::Nothing => {}
    }
    let parent = match caller_parent() {
        Some(caller) => opentelemetry::Context::new().with_remote_span_context(caller),
        None => opentelemetry::Context::new(),
    };
    if span.set_parent(parent).is_ok() {
        // A span of the request's now: the spans and requests under it
        // name it.
        adopted(span, &sampling);
    }
}

/// The telemetry layer's part that notes, on each span it exports, the
/// request whose task opened it (`opened.rs`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Marking;

impl<S> Filter<S> for Marking
where
    S: tracing::Subscriber + for<'span> LookupSpan<'span>,
{
    fn enabled(&self, _meta: &Metadata<'_>, _cx: &LayerContext<'_, S>) -> bool {
        true
    }

    fn callsite_enabled(&self, _meta: &'static Metadata<'static>) -> Interest {
        Interest::always()
    }

    fn on_new_span(&self, _attrs: &Attributes<'_>, id: &Id, cx: LayerContext<'_, S>) {
        let carried_here = PARENT.try_with(|_| ()).is_ok();
        let noted = SAMPLING.try_with(|sampling| note(id, &cx, Some(sampling), carried_here));
        if noted.is_err() {
            note::<S, Sampling>(id, &cx, None, false);
        }
    }
}
