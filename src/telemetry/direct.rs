//! The spans of a sampled request's reads, built straight as
//! OpenTelemetry's span data: no `tracing` span, no registry slot, no
//! OpenTelemetry layer in between.
//!
//! A read's spans (`upstream.read`, each upstream request's CLIENT span,
//! `upstream.token`) are the engine's own: no resolver, no layer of the
//! application runs inside them. As `tracing` spans, each one cost a slot
//! in the subscriber's registry, a filter check and a lock with a clock
//! read at every poll that entered it, a `String` per attribute and the
//! OpenTelemetry layer's builder, context and sampler at its end — about
//! thirty allocations, ten spans to a request of five reads. Here a span is
//! one allocation: its ids, start, name and kind, and its attributes as
//! they are noted (keys and most values `'static`).
//!
//! How it works:
//! - A read's span is made direct when its request is sampled (the
//!   decision the layer's filter took, which also left the telemetry's
//!   [`Sink`] in the request's sampling) and it has a parent: the direct
//!   span entered (the operation's, when it is a direct one:
//!   `graphql/operation_span.rs`), else the current `tracing` span's
//!   OpenTelemetry context when valid (the operation's `tracing` span).
//!   A read carried from another request's task runs outside the task's
//!   direct span ([`outside`]). A read made away from its request's task (a `DataLoader`'s
//!   spawned load) is under the span its operation's handle kept
//!   (`carried.rs`). Anything else (a read outside a request, no telemetry) has
//!   a `tracing` span as before (`read/spans.rs`).
//! - While a read's future is polled its span is entered ([`Span::enter`]):
//!   a thread-local handle to it, so the spans it opens (its requests, a
//!   token fetch) are its children, what the read path notes lands on it,
//!   and the `traceparent` a transport writes names the CLIENT span it runs
//!   in (`context.rs`).
//! - A span ends when its last handle is dropped: its end time taken, it is
//!   handed to the telemetry's processor as the OpenTelemetry layer would
//!   (cut, weighed, queued or dropped and counted: `processor.rs`).
//!
//! A log layer sees none of these spans: while a telemetry exports, a
//! read's spans go to it alone (the book's Telemetry chapter says so).

use super::sink::Sink;
use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags};
use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::trace::{IdGenerator as _, RandomIdGenerator, SpanData};
use std::borrow::Cow;
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::SystemTime;

/// One direct span; it ends when its last handle is dropped.
#[derive(Clone, Debug)]
pub(crate) struct Span(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    context: SpanContext,
    parent: SpanId,
    parent_is_remote: bool,
    name: Cow<'static, str>,
    kind: SpanKind,
    start: SystemTime,
    sink: Arc<Sink>,
    noted: Mutex<Noted>,
    /// Whether the read path notes what answered it here ([`note`](Span::note)):
    /// a read's span, a request's, a token fetch's; not an operation's.
    takes_notes: bool,
}

/// What was recorded on a span after it started.
#[derive(Debug, Default)]
struct Noted {
    attributes: Vec<KeyValue>,
    error: bool,
}

thread_local! {
    /// The direct span entered on this thread, while its future is polled.
    static CURRENT: RefCell<Option<Span>> = const { RefCell::new(None) };
}

impl Span {
    /// A span named `name` of `kind` with `attributes`, under the direct
    /// span entered now, else under the current `tracing` span when the
    /// request is sampled and that span is exported (`None` otherwise:
    /// the caller opens a `tracing` span instead).
    pub(crate) fn child(
        name: impl Into<Cow<'static, str>>,
        kind: SpanKind,
        attributes: Vec<KeyValue>,
    ) -> Option<Span> {
        Self::made(name.into(), kind, attributes, true)
    }

    /// An operation's span (`graphql/operation_span.rs`), made as
    /// [`child`](Self::child) is: the read path's notes never land on it
    /// (a permit taken in its resolver, say: the operation's `tracing` span
    /// has no such fields either).
    pub(crate) fn operation(name: &'static str, attributes: Vec<KeyValue>) -> Option<Span> {
        Self::made(name.into(), SpanKind::Internal, attributes, false)
    }

    fn made(
        name: Cow<'static, str>,
        kind: SpanKind,
        attributes: Vec<KeyValue>,
        takes_notes: bool,
    ) -> Option<Span> {
        let (parent, sink, parent_is_remote) =
            match with_current(|span| (span.0.context.clone(), span.0.sink.clone())) {
                Some((parent, sink)) => (parent, sink, false),
                None => {
                    let sink = super::sampling::sink()?;
                    // Away from its request's task, the span its handle
                    // kept (`carried.rs`), whatever span of another trace
                    // the task runs in — none when none was kept and the
                    // task is another request's; else the current `tracing`
                    // span.
                    let parent = match super::carried::parent() {
                        super::carried::Parent::Kept(kept) => Some(kept),
                        carried if carried.takes_current() => tracing_parent(),
                        _ => None,
                    }?;
                    if !parent.is_sampled() {
                        return None;
                    }
                    let remote = parent.is_remote();
                    (parent, sink, remote)
                }
            };
        let context = SpanContext::new(
            parent.trace_id(),
            RandomIdGenerator::default().new_span_id(),
            TraceFlags::SAMPLED,
            false,
            parent.trace_state().clone(),
        );
        Some(Span(Arc::new(Inner {
            context,
            parent: parent.span_id(),
            parent_is_remote,
            name,
            kind,
            start: SystemTime::now(),
            sink,
            noted: Mutex::new(Noted {
                attributes,
                error: false,
            }),
            takes_notes,
        })))
    }

    /// Records `key` = `value` on the span.
    pub(crate) fn set(&self, key: &'static str, value: impl Into<Value>) {
        self.0.set(key, value);
    }

    /// Records `key` = `value`, a note of the read path's, on a span that
    /// takes them; whether it does.
    pub(crate) fn note(&self, key: &'static str, value: impl Into<Value>) -> bool {
        if self.0.takes_notes {
            self.0.set(key, value);
        }
        self.0.takes_notes
    }

    /// Marks the span failed (status `Error`).
    pub(crate) fn fail(&self) {
        self.0.noted().error = true;
    }

    /// The span's own context (its `traceparent`).
    pub(crate) fn context(&self) -> &SpanContext {
        &self.0.context
    }

    /// Runs `f` with the span entered on this thread.
    pub(crate) fn enter<R>(&self, f: impl FnOnce() -> R) -> R {
        entered(Some(self.clone()), f)
    }

    /// `future`, with the span entered at each poll.
    pub(crate) fn around<F: Future>(&self, future: F) -> Entered<F> {
        Entered {
            span: self.clone(),
            future,
        }
    }
}

impl Inner {
    fn set(&self, key: &'static str, value: impl Into<Value>) {
        self.noted().attributes.push(KeyValue::new(key, value));
    }

    fn noted(&self) -> std::sync::MutexGuard<'_, Noted> {
        self.noted.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The OpenTelemetry context of the current `tracing` span, when it has a
/// valid one; else of the nearest span above it the telemetry exports
/// (past a span only another layer takes: a log's, async-graphql's field
/// spans).
fn tracing_parent() -> Option<SpanContext> {
    super::opened::exported_current()
}

/// Whether an operation of the request the current task serves has a
/// direct span: the request was sampled, by a telemetry that exports the
/// engine's spans alone and is the only one alive
/// (`graphql/operation_span.rs`).
pub(crate) fn operations_direct() -> bool {
    // With two telemetries, each refuses the callsite that asks whether
    // another layer takes the span: neither could tell the other does.
    super::live::is_alone() && super::sampling::sink().is_some_and(|sink| sink.operations_direct())
}

/// Runs `f` with `span` (none: no direct span) entered on this thread, the
/// span entered before put back after.
fn entered<R>(span: Option<Span>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Span>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            // Out of the cell before it drops: the span may end here.
            let mine = CURRENT.with(|current| current.replace(previous));
            drop(mine);
        }
    }
    let previous = CURRENT.with(|current| current.replace(span));
    let _restore = Restore(previous);
    f()
}

/// Runs `f` with no direct span entered: a read carried from another
/// request's task is under that request's spans, never under the one of
/// the task it runs in (an operation's, entered while its future is
/// polled: the read made there through a lent handle), and a request
/// served in process inside another's operation is a trace of its own
/// (`telemetry::carry`, `telemetry::within`). Nothing entered (the common
/// case): one look at the thread-local.
pub(crate) fn outside<R>(f: impl FnOnce() -> R) -> R {
    if CURRENT.with(|current| current.borrow().is_none()) {
        return f();
    }
    entered(None, f)
}

/// `f` on the direct span entered on this thread, if any.
pub(crate) fn with_current<R>(f: impl FnOnce(&Span) -> R) -> Option<R> {
    let current = CURRENT.with(|current| current.borrow().clone())?;
    Some(f(&current))
}

pin_project_lite::pin_project! {
    /// A future run with a direct span entered at each poll.
    pub(crate) struct Entered<F> {
        span: Span,
        #[pin]
        future: F,
    }
}

pin_project_lite::pin_project! {
    /// A future run with no direct span entered at each poll ([`outside`]).
    pub(crate) struct Outside<F> {
        #[pin]
        future: F,
    }
}

impl<F> Outside<F> {
    /// `future`, run outside any direct span.
    pub(crate) fn new(future: F) -> Self {
        Outside { future }
    }
}

impl<F: Future> Future for Outside<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let future = self.project().future;
        outside(|| future.poll(cx))
    }
}

impl<F: Future> Future for Entered<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let future = this.future;
        this.span.enter(|| future.poll(cx))
    }
}

impl Drop for Inner {
    /// The span's end: handed to the telemetry's processor.
    fn drop(&mut self) {
        let end = SystemTime::now();
        let noted = std::mem::take(self.noted.get_mut().unwrap_or_else(|e| e.into_inner()));
        let data = SpanData {
            span_context: self.context.clone(),
            parent_span_id: self.parent,
            parent_span_is_remote: self.parent_is_remote,
            span_kind: self.kind.clone(),
            name: std::mem::take(&mut self.name),
            start_time: self.start,
            end_time: end,
            attributes: noted.attributes,
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: if noted.error {
                Status::error("")
            } else {
                Status::Unset
            },
            instrumentation_scope: self.sink.scope().clone(),
        };
        self.sink.end(data);
    }
}
