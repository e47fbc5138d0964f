//! What every span of the read path is: a `tracing` span or a direct one
//! ([`Spanned`]), the values noted on them ([`Note`]), and whether they
//! are opened at all ([`wanted`]).

use futures::future::Either;
use std::future::Future;
use tracing::Instrument;

/// A read path's span: none (no subscriber wants it: nothing to record,
/// enter or drop), a `tracing` one, or, for a request a telemetry sampled,
/// a direct one (`telemetry/direct.rs`).
pub(crate) enum Spanned {
    Off,
    Tracing(tracing::Span),
    #[cfg(feature = "otel")]
    Direct(crate::telemetry::direct::Span),
}

impl Spanned {
    /// `span`, or [`Off`](Spanned::Off) when it is `Span::none()`.
    pub(super) fn tracing(span: tracing::Span) -> Self {
        if span.is_none() {
            Spanned::Off
        } else {
            Spanned::Tracing(span)
        }
    }

    /// Whether there is no span at all.
    pub(super) fn is_none(&self) -> bool {
        match self {
            Spanned::Off => true,
            Spanned::Tracing(span) => span.is_none(),
            #[cfg(feature = "otel")]
            Spanned::Direct(_) => false,
        }
    }

    /// `f`, inside the span.
    pub(super) fn in_scope<R>(&self, f: impl FnOnce() -> R) -> R {
        match self {
            Spanned::Off => f(),
            Spanned::Tracing(span) if span.is_none() => f(),
            Spanned::Tracing(span) => span.in_scope(f),
            #[cfg(feature = "otel")]
            Spanned::Direct(span) => span.enter(f),
        }
    }

    /// Records `field` = `value`.
    pub(super) fn record<V: Note>(&self, field: &'static str, value: V) {
        match self {
            Spanned::Off => {}
            Spanned::Tracing(span) => {
                span.record(field, value.field());
            }
            #[cfg(feature = "otel")]
            Spanned::Direct(span) => span.set(field, value.otel()),
        }
    }

    /// Marks the span failed (`otel.status_code = "error"`).
    pub(super) fn fail(&self) {
        match self {
            Spanned::Off => {}
            Spanned::Tracing(span) => {
                span.record("otel.status_code", "error");
            }
            #[cfg(feature = "otel")]
            Spanned::Direct(span) => span.fail(),
        }
    }

    /// `future` run inside the span.
    pub(crate) fn around<F: Future>(
        self,
        future: F,
    ) -> Either<Either<F, tracing::instrument::Instrumented<F>>, Entered<F>> {
        match self {
            Spanned::Off => Either::Left(Either::Left(future)),
            Spanned::Tracing(span) if span.is_none() => Either::Left(Either::Left(future)),
            Spanned::Tracing(span) => Either::Left(Either::Right(future.instrument(span))),
            #[cfg(feature = "otel")]
            Spanned::Direct(span) => Either::Right(span.around(future)),
        }
    }
}

/// A future inside a direct span (`telemetry/direct.rs`).
#[cfg(feature = "otel")]
pub(crate) type Entered<F> = crate::telemetry::direct::Entered<F>;
/// Without the `otel` feature, never built.
#[cfg(not(feature = "otel"))]
pub(crate) type Entered<F> = F;

/// A value the read path notes on its spans: as `tracing` records it, and
/// as OpenTelemetry's.
pub(crate) trait Note: Copy {
    /// The value as a `tracing` field: an integer signed (the
    /// OpenTelemetry layer formats an unsigned one into text).
    type Field: tracing::Value;

    /// The value as a `tracing` field.
    fn field(self) -> Self::Field;

    /// The value as an OpenTelemetry attribute's.
    #[cfg(feature = "otel")]
    fn otel(self) -> opentelemetry::Value;
}

impl Note for bool {
    type Field = bool;

    fn field(self) -> bool {
        self
    }

    #[cfg(feature = "otel")]
    fn otel(self) -> opentelemetry::Value {
        self.into()
    }
}

impl Note for &'static str {
    type Field = &'static str;

    fn field(self) -> &'static str {
        self
    }

    #[cfg(feature = "otel")]
    fn otel(self) -> opentelemetry::Value {
        self.into()
    }
}

impl Note for u64 {
    type Field = i64;

    fn field(self) -> i64 {
        i64::try_from(self).unwrap_or(i64::MAX)
    }

    #[cfg(feature = "otel")]
    fn otel(self) -> opentelemetry::Value {
        self.field().into()
    }
}

impl Note for u16 {
    type Field = i64;

    fn field(self) -> i64 {
        i64::from(self)
    }

    #[cfg(feature = "otel")]
    fn otel(self) -> opentelemetry::Value {
        self.field().into()
    }
}

/// An HTTP status as `error.type`, which the conventions have as text.
#[derive(Clone, Copy)]
pub(super) struct StatusText(pub(super) u16);

impl Note for StatusText {
    type Field = tracing::field::DisplayValue<u16>;

    fn field(self) -> Self::Field {
        tracing::field::display(self.0)
    }

    #[cfg(feature = "otel")]
    fn otel(self) -> opentelemetry::Value {
        self.0.to_string().into()
    }
}

/// A direct span (`telemetry/direct.rs`), named, of the kind and with the
/// attributes `describe` gives, when the request is sampled and its
/// operation's span exported; `None` otherwise.
#[cfg(feature = "otel")]
pub(super) fn direct<N: Into<std::borrow::Cow<'static, str>>>(
    describe: impl FnOnce() -> (
        N,
        opentelemetry::trace::SpanKind,
        Vec<opentelemetry::KeyValue>,
    ),
) -> Option<Spanned> {
    use crate::telemetry::direct;
    if !crate::telemetry::is_exporting() || !wanted() {
        return None;
    }
    let (name, kind, attributes) = describe();
    direct::Span::child(name, kind, attributes).map(Spanned::Direct)
}

/// `span()`, or `Span::none()` when no subscriber wants it. Built only
/// when some subscriber takes debug spans at all (one atomic load): else
/// tracing's `log` feature, on while no subscriber is set, would offer each
/// disabled span's fields to `log` — 30 ns a span on the read path.
pub(super) fn enabled(span: impl FnOnce() -> tracing::Span) -> tracing::Span {
    if !wanted() {
        return tracing::Span::none();
    }
    let span = span();
    if span.is_disabled() {
        return tracing::Span::none();
    }
    // Exported with no span of its request's above it: under the
    // request's caller's, as the request's own span would be.
    #[cfg(feature = "otel")]
    crate::telemetry::adopt_request_parent(&span);
    span
}

/// Whether the read's spans are opened: some subscriber takes debug spans,
/// and the request is not one a telemetry sampled out (whose debug spans
/// no layer gets: `telemetry::sampled_out`).
#[inline]
pub(super) fn wanted() -> bool {
    if !tracing::level_enabled!(tracing::Level::DEBUG) {
        return false;
    }
    #[cfg(feature = "otel")]
    if crate::telemetry::sampled_out() {
        return false;
    }
    true
}
