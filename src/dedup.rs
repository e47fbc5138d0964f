//! Request-scoped de-duplication: identical reads anywhere in one inbound
//! HTTP request are one read.
//!
//! Each distinct key owns one `tokio::sync::OnceCell` in a `DashMap`. The first
//! caller for a key runs the read inside `OnceCell::get_or_init`; concurrent
//! callers for the same key wait on the same cell and get the same result
//! (single-flight), and later callers find it completed (a cache for the rest
//! of the request). The outcome — success or error — is the read's outcome for
//! the whole request: a second identical selection costs nothing and sees the
//! same answer.
//!
//! Cancellation never poisons a key: if the caller running the read is dropped
//! (its operation was cancelled), the cell stays empty and the next waiter runs
//! the read itself. The map lives exactly as long as the request.

use dashmap::DashMap;
use std::hash::Hash;
use std::sync::Arc;
use tokio::sync::OnceCell;

/// A single-flight cache for one request.
pub struct Dedup<K, V> {
    cells: DashMap<K, Arc<OnceCell<V>>>,
}

/// Whether a value came from a read this caller ran or from one it shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// This caller ran the read.
    Ran,
    /// Another caller's read (in flight or completed) answered.
    Shared,
}

impl<K: Eq + Hash, V: Clone> Dedup<K, V> {
    /// An empty cache.
    pub fn new() -> Self {
        Self {
            cells: DashMap::new(),
        }
    }

    /// The value for `key`: shared when a read for it exists, else `read()`'s.
    pub async fn get_or_run<F, Fut>(&self, key: K, read: F) -> (V, Origin)
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = V>,
    {
        let cell = self.cells.entry(key).or_default().clone();
        if let Some(done) = cell.get() {
            return (done.clone(), Origin::Shared);
        }
        let mut origin = Origin::Shared;
        let value = cell
            .get_or_init(|| {
                origin = Origin::Ran;
                read()
            })
            .await;
        (value.clone(), origin)
    }

    /// Distinct keys seen so far.
    pub fn len(&self) -> usize {
        self.cells.len()
    }

    /// Whether no key was seen yet.
    pub fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }
}

impl<K: Eq + Hash, V: Clone> Default for Dedup<K, V> {
    fn default() -> Self {
        Self::new()
    }
}
