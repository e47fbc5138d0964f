//! Histograms bound to their attributes, per thread: a record names its
//! attribute set with a small key, and the SDK's series for it is found
//! once (`Histogram::bind`), not looked up at every record.
//!
//! An unbound record hashes its attributes — every key's and value's text,
//! with the SDK's SipHash — to find the series, then compares them: about
//! 1,500 instructions for the four attributes of an upstream request,
//! recorded for every read of every request, sampled or not. Bound, a
//! record is the key's hash (a few integers and a short text) and the
//! histogram's update. A set is bound the first time a thread records it,
//! so no series is made before it has a value.
//!
//! Each thread keeps its own bindings, as it keeps its handle on the
//! instruments (`instruments.rs`): no lock is shared between threads, and
//! they go with the instruments they were bound to. A thread binds at most
//! [`MAX_BOUND`] attribute sets; past that a record is unbound, as before.

use foldhash::fast::FixedState;
use opentelemetry::metrics::BoundHistogram;
use opentelemetry::KeyValue;
use std::collections::hash_map::{Entry, HashMap};

/// The attribute sets one thread binds, at most.
pub(crate) const MAX_BOUND: usize = 256;

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

/// One thread's bound histograms, by attribute set:
/// `http.client.request.duration` by [`ClientKey`], and the operations'
/// two by `graphql.operation.type`.
#[derive(Default)]
pub(crate) struct Bound {
    client: HashMap<ClientKey, BoundHistogram<f64>, FixedState>,
    operations: HashMap<&'static str, Operation, FixedState>,
}

/// `fanout.operation.reads` and `fanout.operation.delta` for one
/// `graphql.operation.type`.
pub(crate) struct Operation {
    pub(crate) reads: BoundHistogram<u64>,
    pub(crate) delta: BoundHistogram<f64>,
}

impl Bound {
    /// The histogram bound to `key`'s attributes: this thread's, else bound
    /// now (`bind`, with the attributes `attributes` writes), else — this
    /// thread bound [`MAX_BOUND`] sets already — none.
    pub(crate) fn client(
        &mut self,
        key: &ClientKey,
        bind: impl FnOnce(&[KeyValue]) -> BoundHistogram<f64>,
        attributes: impl FnOnce() -> ([KeyValue; 5], usize),
    ) -> Option<&BoundHistogram<f64>> {
        let full = self.len() >= MAX_BOUND;
        match self.client.entry(*key) {
            Entry::Occupied(bound) => Some(bound.into_mut()),
            Entry::Vacant(_) if full => None,
            Entry::Vacant(place) => {
                let (attributes, len) = attributes();
                Some(place.insert(bind(&attributes[..len])))
            }
        }
    }

    /// The operations' histograms bound to `graphql.operation.type = kind`,
    /// as [`client`](Self::client) binds.
    pub(crate) fn operation(
        &mut self,
        kind: &'static str,
        bind: impl FnOnce(&[KeyValue]) -> Operation,
    ) -> Option<&Operation> {
        let full = self.len() >= MAX_BOUND;
        match self.operations.entry(kind) {
            Entry::Occupied(bound) => Some(bound.into_mut()),
            Entry::Vacant(_) if full => None,
            Entry::Vacant(place) => {
                let attributes = [KeyValue::new("graphql.operation.type", kind)];
                Some(place.insert(bind(&attributes)))
            }
        }
    }

    /// The attribute sets bound.
    pub(crate) fn len(&self) -> usize {
        self.client.len() + self.operations.len()
    }
}
