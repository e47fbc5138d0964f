//! `http.client.request.duration` bound to its attributes, per thread: a
//! record names its attribute set with a small key, and the SDK's series
//! for it is found once (`Histogram::bind`), not looked up at every record.
//!
//! An unbound record hashes its attributes — every key's and value's text,
//! with the SDK's SipHash — to find the series, then compares them: about
//! 1,500 instructions for the four attributes of an upstream request,
//! recorded for every read of every request, sampled or not. Bound, a
//! record is the key's hash (a few integers and a short text) and the
//! histogram's update (the series' own lock, as before). A thread's first
//! record of a set is made unbound, and the set bound after it: the series
//! exists, with a value, before any handle names it, so no empty series is
//! ever exported.
//!
//! Each thread keeps its own bindings, as it keeps its handle on the
//! instruments (`instruments.rs`), and lets them go with those: at its
//! first record after the telemetry they were bound to has ended. A thread
//! binds at most [`MAX_BOUND`] keys (a key names one attribute set: the
//! host's label has one id for the process's life); past that its records
//! are unbound, as before.
//!
//! The request's and operations' histograms (`http.server.request.duration`,
//! `fanout.request.reads`, `fanout.operation.*`), a few records a request,
//! are bound the same way to the few attribute sets they take (a route and
//! a status, an operation's type), found by comparing the sets themselves
//! ([`Few`]): at most [`MAX_FEW`] a histogram and a thread.

use foldhash::fast::FixedState;
use opentelemetry::metrics::{BoundHistogram, Histogram};
use opentelemetry::KeyValue;
use std::collections::HashMap;

/// The keys one thread binds, at most.
pub(crate) const MAX_BOUND: usize = 256;

/// The attribute sets one thread binds a [`Few`] histogram to, at most.
pub(crate) const MAX_FEW: usize = 16;

/// An upstream request's attributes, named by what they are built from.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) struct ClientKey {
    /// The host's label (`HostMetrics::id`): its `server.address` and
    /// `server.port`.
    pub(crate) host: u64,
    /// `http.request.method`.
    pub(crate) method: &'static str,
    /// `http.response.status_code`, when an answer came.
    pub(crate) status: Option<u16>,
    /// `error.type`.
    pub(crate) error: Option<ClientError>,
}

/// An upstream request's `error.type`: an answer's status, or a failure's
/// code.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum ClientError {
    Status(u16),
    Code(&'static str),
}

/// One thread's bound histograms: `http.client.request.duration` by
/// [`ClientKey`], the others by their few attribute sets.
pub(crate) struct Bound {
    client: HashMap<ClientKey, BoundHistogram<f64>, FixedState>,
    pub(crate) server: Few<f64>,
    pub(crate) request_reads: Few<u64>,
    pub(crate) operation_reads: Few<u64>,
    pub(crate) operation_delta: Few<f64>,
}

/// A histogram bound to each of a few attribute sets, found by comparing
/// the sets: a route and a status, an operation's type.
pub(crate) struct Few<T> {
    bound: Vec<(Box<[KeyValue]>, BoundHistogram<T>)>,
}

/// A value a histogram keeps: the SDK drops one that is not finite, and
/// a set bound after such a record would be exported as an empty series.
pub(crate) trait Finite: Copy {
    fn is_finite(self) -> bool;
}

impl Finite for f64 {
    fn is_finite(self) -> bool {
        f64::is_finite(self)
    }
}

impl Finite for u64 {
    fn is_finite(self) -> bool {
        true
    }
}

impl<T: Finite> Few<T> {
    const fn new() -> Self {
        Self { bound: Vec::new() }
    }

    /// Records `value` on `histogram`'s series for `attributes`: bound once
    /// this thread has recorded a finite value on it (the first record made
    /// unbound, so the series has a value before a handle names it), while
    /// it has bound fewer than [`MAX_FEW`] sets. The sets hold no float
    /// (compared with `==`, a NaN would never be found again).
    pub(crate) fn record(&mut self, histogram: &Histogram<T>, value: T, attributes: &[KeyValue]) {
        debug_assert!(
            !attributes
                .iter()
                .any(|kv| matches!(kv.value, opentelemetry::Value::F64(_))),
            "a float attribute"
        );
        if let Some((_, bound)) = self.bound.iter().find(|(set, _)| **set == *attributes) {
            bound.record(value);
            return;
        }
        histogram.record(value, attributes);
        if self.bound.len() < MAX_FEW && value.is_finite() {
            let bound = histogram.bind(attributes);
            self.bound.push((attributes.into(), bound));
        }
    }

    /// The sets bound.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.bound.len()
    }
}

impl Bound {
    /// None bound.
    pub(crate) const fn new() -> Self {
        Self {
            client: HashMap::with_hasher(FixedState::with_seed(0)),
            server: Few::new(),
            request_reads: Few::new(),
            operation_reads: Few::new(),
            operation_delta: Few::new(),
        }
    }

    /// The histogram this thread bound to `key`'s attributes, if it has.
    pub(crate) fn client(&self, key: &ClientKey) -> Option<&BoundHistogram<f64>> {
        self.client.get(key)
    }

    /// Keeps `bind()` for `key`, unless this thread bound [`MAX_BOUND`]
    /// keys already. Called after the set's first record, made unbound.
    pub(crate) fn bind_client(
        &mut self,
        key: ClientKey,
        bind: impl FnOnce() -> BoundHistogram<f64>,
    ) {
        if self.client.len() < MAX_BOUND {
            self.client.insert(key, bind());
        }
    }

    /// The client's keys bound.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.client.len()
    }
}
