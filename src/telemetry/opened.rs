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
//!   filter's `on_new_span`: only the spans it exports), the request's
//!   sampling is noted in the span's extensions ([`note`]), as a `Weak`: it
//!   holds the allocation, so no other request's sampling takes its
//!   address while the span lives. A span opened outside any request's
//!   task notes nothing.
//! - A read carried with no span kept asks whether the current span was
//!   opened under the sampling it carries ([`current_is_of`]): the span's
//!   slot found in the subscriber's registry, one extension looked up.

use std::sync::{Arc, Weak};
use tracing::span::Id;
use tracing::Subscriber;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// The sampling of the request in whose task a span was opened.
#[derive(Debug)]
struct OpenedIn<T>(Weak<T>);

/// Notes on the span `id` the sampling of the request in whose task it
/// opens.
pub(crate) fn note<S, T>(id: &Id, cx: &Context<'_, S>, sampling: Weak<T>)
where
    S: Subscriber + for<'span> LookupSpan<'span>,
    T: Send + Sync + 'static,
{
    if let Some(span) = cx.span(id) {
        span.extensions_mut().insert(OpenedIn(sampling));
    }
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
    tracing::dispatcher::get_default(|dispatch| {
        let current = dispatch.current_span();
        let Some(id) = current.id() else {
            return true;
        };
        let Some(registry) = dispatch.downcast_ref::<tracing_subscriber::Registry>() else {
            return true;
        };
        let Some(span) = registry.span(id) else {
            return false;
        };
        let extensions = span.extensions();
        extensions
            .get::<OpenedIn<T>>()
            .is_some_and(|opened| std::ptr::eq(opened.0.as_ptr(), Arc::as_ptr(sampling)))
    })
}
