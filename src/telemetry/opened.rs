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
//! - As the telemetry's layer opens a span in a request's task (its
//!   filter's `on_new_span`, `carried.rs`: only the spans it exports), the
//!   request's sampling is noted in the span's extensions ([`note`]), as a
//!   `Weak`: it holds the allocation, so no other request's sampling takes
//!   its address while the span lives. A span opened outside any request's
//!   task notes nothing. In a task a read was carried to, the carried
//!   sampling is the task's: a read's span opened there is the request's
//!   (the current span when that is the request's, else made a child of
//!   the request's caller's span and noted so: `carried.rs`).
//! - A read carried with no span kept asks whether the current span was
//!   opened under the sampling it carries ([`current_is_of`]): the span's
//!   slot found in the subscriber's registry, one extension looked up.

use std::sync::{Arc, Weak};
use tracing::span::Id;
use tracing::{Dispatch, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// The sampling of the request in whose task a span was opened.
#[derive(Debug)]
struct OpenedIn<T>(Weak<T>);

/// Notes on the span `id` the sampling of the request in whose task it
/// opens (or whose read the task makes: a span opened there is under one
/// of the request's, `carried.rs`).
pub(crate) fn note<S, T>(id: &Id, cx: &Context<'_, S>, sampling: &Arc<T>)
where
    S: Subscriber + for<'span> LookupSpan<'span>,
    T: Send + Sync + 'static,
{
    if let Some(span) = cx.span(id) {
        // `replace`, not `insert` (which panics on a value there): a
        // second telemetry's layer on the same registry notes the same.
        span.extensions_mut()
            .replace(OpenedIn(Arc::downgrade(sampling)));
    }
}

/// Notes on `span` the sampling of the request it was made a span of
/// (a read's span given the request's parent where it was opened under
/// none of the request's: `carried.rs`).
pub(crate) fn note_span<T: Send + Sync + 'static>(span: &tracing::Span, sampling: &Arc<T>) {
    span.with_subscriber(|(id, dispatch)| {
        let registry = dispatch.downcast_ref::<tracing_subscriber::Registry>()?;
        let span = registry.span(id)?;
        span.extensions_mut()
            .replace(OpenedIn(Arc::downgrade(sampling)));
        Some(())
    });
}

/// Whether the noted sampling is `sampling` (the `Weak` holds the
/// allocation: no other sampling has its address while the span lives).
fn opened_in<T>(opened: &OpenedIn<T>, sampling: &Arc<T>) -> bool {
    std::ptr::eq(opened.0.as_ptr(), Arc::as_ptr(sampling))
}

/// Whether the current span may be taken as one of the request whose
/// sampling is `sampling`, in a task its read was carried to with no span
/// of the request's kept: there is none; it was opened in the request's
/// task; or that cannot be told (a subscriber not built on
/// `tracing-subscriber`'s registry). Not a span opened outside any
/// request's task or in another request's, nor one the telemetry's layer
/// does not export (it has no context to name). A span the application
/// opened around the request before the engine saw it is never asked
/// about: when exported, it was current as the request's handle was made,
/// and kept.
pub(crate) fn current_is_of<T: Send + Sync + 'static>(sampling: &Arc<T>) -> bool {
    tracing::dispatcher::get_default(|dispatch| match dispatch.current_span().id() {
        Some(id) => of(dispatch, id, sampling),
        None => true,
    })
}

/// [`current_is_of`], for `span`.
pub(crate) fn is_of<T: Send + Sync + 'static>(span: &tracing::Span, sampling: &Arc<T>) -> bool {
    span.with_subscriber(|(id, dispatch)| of(dispatch, id, sampling))
        .unwrap_or(true)
}

fn of<T: Send + Sync + 'static>(dispatch: &Dispatch, id: &Id, sampling: &Arc<T>) -> bool {
    let Some(registry) = dispatch.downcast_ref::<tracing_subscriber::Registry>() else {
        return true;
    };
    let Some(span) = registry.span(id) else {
        return false;
    };
    let extensions = span.extensions();
    extensions
        .get::<OpenedIn<T>>()
        .is_some_and(|opened| opened_in(opened, sampling))
}
