//! Which request's task opened a span: what tells a span of the request's
//! from one of another request's, or of a task of its own, where a read is
//! carried with no span of its request's kept (`carried.rs`).
//!
//! A read made through an operation's handle in a task of no request (a
//! `DataLoader`'s spawned load) takes the current `tracing` span as its
//! parent when its request kept none (a per-target filter keeps the
//! engine's spans out) — rightly when the load runs in the spans of the
//! request's task (async-graphql spawns loads `in_current_span`), wrongly
//! when it runs in another request's (a loader shared between requests)
//! or under a span opened in the task itself. Neither the trace id nor
//! the task tells these apart: where the span was opened does.
//!
//! How it works:
//! - As the telemetry's layer opens a span (its filter's `on_new_span`,
//!   `carried.rs`: only the spans it exports), the sampling of the request
//!   whose task opens it is noted in the span's extensions ([`note`]), as a
//!   `Weak`: it holds the allocation, so no other request's sampling takes
//!   its address while the span lives; a span opened in no request's task
//!   is noted as such. In a task a read was carried to, or of no request's,
//!   a span is whose its parent is (a span a load opens in the request's
//!   spans is the request's); a read's span opened under none of the
//!   request's is made a child of the request's caller's span and noted so
//!   ([`adopted`]).
//! - A read asks what the nearest exported span at or above the current
//!   one is to its request ([`above_current`]), and names that span
//!   ([`exported_current`]): the current span's slot found in the
//!   subscriber's registry, then its ancestors' until one is noted. Spans
//!   only another layer takes (a log's, async-graphql's field spans) are
//!   skipped, as `tracing-opentelemetry` skips them when it parents a span
//!   opened in its parent's scope (as the read path's are).
//! - A span noted as opened in no request's task holds no value at all (a
//!   marker of no size: its box allocates nothing); one of a request's, one
//!   boxed `Weak`.

use std::any::Any;
use std::sync::{Arc, Weak};
use tracing::span::Id;
use tracing::{Dispatch, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::{LookupSpan, SpanRef};

/// The sampling of the request in whose task a span was opened.
#[derive(Debug)]
struct OpenedIn(Weak<dyn Any + Send + Sync>);

/// A span opened in no request's task.
#[derive(Debug)]
struct OpenedOutside;

/// What the nearest span the telemetry exports, at or above the current
/// one, is to a request ([`above_current`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Above {
    /// A span of the request's: opened in its task.
    Its,
    /// One opened in no request's task (an application's span around the
    /// request, opened before the engine saw it; a task's own).
    NoRequests,
    /// One of another request's.
    Another,
    /// None: no span the telemetry exports is current or above it.
    Nothing,
    /// Cannot be told: a subscriber not built on `tracing-subscriber`'s
    /// registry.
    Unknown,
}

/// Notes on the span `id`, which the telemetry's layer exports, the
/// request it is of: in the request's own task, that request (`sampling`,
/// whatever the span opens under); in a task a read of a request's was
/// carried to (`carried_here`) or a task of no request's, whose its
/// `tracing` parent is, as the layer sees it (a later `set_parent` of the
/// application's is not followed), none without one.
pub(crate) fn note<S, T>(
    id: &Id,
    cx: &Context<'_, S>,
    sampling: Option<&Arc<T>>,
    carried_here: bool,
) where
    S: Subscriber + for<'span> LookupSpan<'span>,
    T: Send + Sync + 'static,
{
    let Some(span) = cx.span(id) else {
        return;
    };
    let by = match sampling {
        // In the request's own task: the request's, whatever it opens under.
        Some(sampling) if !carried_here => Some(Arc::downgrade(sampling) as Weak<_>),
        // Elsewhere (a task a read was carried to, a task of no request's):
        // whose its parent is, as the layer sees it — a span a load opens
        // in the request's spans is the request's, one under another
        // request's is that one's, a task's first is its own.
        _ => span.parent().and_then(|parent| {
            let extensions = parent.extensions();
            extensions.get::<OpenedIn>().map(|opened| opened.0.clone())
        }),
    };
    mark(&mut span.extensions_mut(), by);
}

/// Notes `span` as one of the request whose sampling is `sampling`, if the
/// telemetry's layer exports it (noted as it opened): a read's span made a
/// child of the request's caller's span where it opened under none of the
/// request's (`carried.rs`).
pub(crate) fn adopted<T: Send + Sync + 'static>(span: &tracing::Span, sampling: &Arc<T>) {
    span.with_subscriber(|(id, dispatch)| {
        let registry = dispatch.downcast_ref::<tracing_subscriber::Registry>()?;
        let span = registry.span(id)?;
        opened_by(&span)?;
        mark(
            &mut span.extensions_mut(),
            Some(Arc::downgrade(sampling) as Weak<_>),
        );
        Some(())
    });
}

/// Marks a span opened in the task of the request whose sampling `by`
/// holds (none: in no request's task), in place of any mark before.
fn mark(
    extensions: &mut tracing_subscriber::registry::ExtensionsMut<'_>,
    by: Option<Weak<dyn Any + Send + Sync>>,
) {
    extensions.remove::<OpenedOutside>();
    extensions.remove::<OpenedIn>();
    match by {
        Some(by) => extensions.insert(OpenedIn(by)),
        None => extensions.insert(OpenedOutside),
    }
}

/// Whose `span` is, if the telemetry's layer noted it: the address of its
/// request's sampling (held by the `Weak`, so no other sampling has it
/// while the span lives), or `None` for a span opened in no request's
/// task.
fn opened_by<'a, R: LookupSpan<'a>>(span: &SpanRef<'a, R>) -> Option<Option<*const ()>> {
    let extensions = span.extensions();
    if let Some(opened) = extensions.get::<OpenedIn>() {
        return Some(Some(opened.0.as_ptr().cast::<()>()));
    }
    extensions.get::<OpenedOutside>().map(|_| None)
}

/// What a span opened by `by` ([`opened_by`]) is to the request whose
/// sampling is `sampling`.
fn what<T>(by: Option<*const ()>, sampling: &Arc<T>) -> Above {
    match by {
        Some(by) if std::ptr::eq(by, Arc::as_ptr(sampling).cast()) => Above::Its,
        Some(_) => Above::Another,
        None => Above::NoRequests,
    }
}

/// What the nearest span the telemetry exports, at or above the current
/// one, is to the request whose sampling is `sampling`.
pub(crate) fn above_current<T: Send + Sync + 'static>(sampling: &Arc<T>) -> Above {
    tracing::dispatcher::get_default(|dispatch| {
        let Some(id) = dispatch.current_span().id().cloned() else {
            return Above::Nothing;
        };
        match nearest(dispatch, &id, |by| what(by, sampling)) {
            Ok(found) => found.map_or(Above::Nothing, |(what, _)| what),
            Err(Unknown) => Above::Unknown,
        }
    })
}

/// [`above_current`], at or above `span`.
pub(crate) fn above_span<T: Send + Sync + 'static>(
    span: &tracing::Span,
    sampling: &Arc<T>,
) -> Above {
    let found =
        span.with_subscriber(|(id, dispatch)| nearest(dispatch, id, |by| what(by, sampling)));
    match found {
        Some(Ok(Some((what, _)))) => what,
        Some(Err(Unknown)) => Above::Unknown,
        Some(Ok(None)) | None => Above::Nothing,
    }
}

/// The OpenTelemetry context the current span names, when valid: its own,
/// else that of the nearest span above it the telemetry exports — the span
/// a read there is under, however many spans only another layer takes (a
/// log's, async-graphql's field spans) lie between.
/// The current span is named by its id, not held: no handle of it is
/// cloned and dropped (two more look-ups in the registry) for each read.
pub(crate) fn exported_current() -> Option<opentelemetry::trace::SpanContext> {
    tracing::dispatcher::get_default(|dispatch| {
        let current = dispatch.current_span();
        own_or_exported(dispatch, current.id()?)
    })
}

/// [`exported_current`], for `span`.
pub(crate) fn exported_of(span: &tracing::Span) -> Option<opentelemetry::trace::SpanContext> {
    span.with_subscriber(|(id, dispatch)| own_or_exported(dispatch, id))
        .flatten()
}

/// The context of the span `id` when valid, else of the nearest span
/// above it the telemetry exports.
fn own_or_exported(dispatch: &Dispatch, id: &Id) -> Option<opentelemetry::trace::SpanContext> {
    use opentelemetry::trace::TraceContextExt as _;
    if let Some(cx) = tracing_opentelemetry::get_otel_context(id, dispatch) {
        let own = cx.span().span_context().clone();
        if own.is_valid() {
            return Some(own);
        }
    }
    exported(dispatch, id)
}

fn exported(dispatch: &Dispatch, id: &Id) -> Option<opentelemetry::trace::SpanContext> {
    use opentelemetry::trace::TraceContextExt as _;
    // Found, and the registry's guards let go, before the context is built.
    let (_, found) = nearest(dispatch, id, |_| ()).ok()??;
    let cx = tracing_opentelemetry::get_otel_context(&found, dispatch)?;
    let context = cx.span().span_context().clone();
    context.is_valid().then_some(context)
}

/// Not built on `tracing-subscriber`'s registry: nothing can be told.
struct Unknown;

/// The nearest noted span at or above `id`: `judge` of whose it is
/// (decided while the span is held), and its id.
fn nearest<J>(
    dispatch: &Dispatch,
    id: &Id,
    judge: impl Fn(Option<*const ()>) -> J,
) -> Result<Option<(J, Id)>, Unknown> {
    let registry = dispatch
        .downcast_ref::<tracing_subscriber::Registry>()
        .ok_or(Unknown)?;
    let Some(span) = registry.span(id) else {
        return Ok(None);
    };
    Ok(span
        .scope()
        .find_map(|span| opened_by(&span).map(|by| (judge(by), span.id()))))
}
