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
//!   is noted as such. In a task a read was carried to, the carried
//!   sampling is the task's: a span opened there is the request's only
//!   under one of the request's; a read's span opened under none is made a
//!   child of the request's caller's span and noted so ([`adopted`]).
//! - A read asks what the nearest exported span at or above the current
//!   one is to its request ([`above_current`]): the current span's slot
//!   found in the subscriber's registry, then its ancestors' until one is
//!   noted — the span `tracing-opentelemetry` makes the parent of a span
//!   opened now (spans only another layer takes are skipped, as it skips
//!   them).

use std::sync::{Arc, Weak};
use tracing::span::Id;
use tracing::{Dispatch, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// The sampling of the request in whose task a span was opened (none: in
/// no request's task).
#[derive(Debug)]
struct OpenedIn<T>(Option<Weak<T>>);

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
/// request whose task opened it: `sampling`, that of the task — in a task a
/// read of the request's was carried to (`carried_here`), only under a
/// span of the request's (its parent, as the layer sees it), a span there
/// under another's being no span of the request's.
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
    let sampling = sampling.filter(|sampling| {
        !carried_here
            || span.parent().is_some_and(|parent| {
                let extensions = parent.extensions();
                extensions
                    .get::<OpenedIn<T>>()
                    .is_some_and(|opened| opened_in(opened, sampling))
            })
    });
    let opened = OpenedIn(sampling.map(Arc::downgrade));
    // `replace`, not `insert` (which panics on a value there): a second
    // telemetry's layer on the same registry notes the same.
    span.extensions_mut().replace(opened);
}

/// Notes `span` as one of the request whose sampling is `sampling`, if the
/// telemetry's layer exports it (noted as it opened): a read's span made a
/// child of the request's caller's span where it opened under none of the
/// request's (`carried.rs`).
pub(crate) fn adopted<T: Send + Sync + 'static>(span: &tracing::Span, sampling: &Arc<T>) {
    span.with_subscriber(|(id, dispatch)| {
        let registry = dispatch.downcast_ref::<tracing_subscriber::Registry>()?;
        let span = registry.span(id)?;
        let mut extensions = span.extensions_mut();
        let opened = extensions.get_mut::<OpenedIn<T>>()?;
        opened.0 = Some(Arc::downgrade(sampling));
        Some(())
    });
}

/// Whether the noted sampling is `sampling` (the `Weak` holds the
/// allocation: no other sampling has its address while the span lives).
fn opened_in<T>(opened: &OpenedIn<T>, sampling: &Arc<T>) -> bool {
    opened
        .0
        .as_ref()
        .is_some_and(|by| std::ptr::eq(by.as_ptr(), Arc::as_ptr(sampling)))
}

/// What the nearest span the telemetry exports, at or above the current
/// one, is to the request whose sampling is `sampling` — the span
/// `tracing-opentelemetry` makes the parent of a span opened now (spans
/// only another layer takes, a log's or async-graphql's field spans, are
/// skipped as it skips them).
pub(crate) fn above_current<T: Send + Sync + 'static>(sampling: &Arc<T>) -> Above {
    tracing::dispatcher::get_default(|dispatch| match dispatch.current_span().id() {
        Some(id) => above(dispatch, id, sampling),
        None => Above::Nothing,
    })
}

/// [`above_current`], at or above `span`.
pub(crate) fn above_span<T: Send + Sync + 'static>(
    span: &tracing::Span,
    sampling: &Arc<T>,
) -> Above {
    span.with_subscriber(|(id, dispatch)| above(dispatch, id, sampling))
        .unwrap_or(Above::Nothing)
}

fn above<T: Send + Sync + 'static>(dispatch: &Dispatch, id: &Id, sampling: &Arc<T>) -> Above {
    let Some(registry) = dispatch.downcast_ref::<tracing_subscriber::Registry>() else {
        return Above::Unknown;
    };
    let Some(span) = registry.span(id) else {
        return Above::Nothing;
    };
    for span in span.scope() {
        let extensions = span.extensions();
        if let Some(opened) = extensions.get::<OpenedIn<T>>() {
            return if opened_in(opened, sampling) {
                Above::Its
            } else if opened.0.is_none() {
                Above::NoRequests
            } else {
                Above::Another
            };
        }
    }
    Above::Nothing
}
