//! The export queue's bounds and pace, as the builder set them.

use std::time::Duration;

/// The export queue's bounds and pace.
#[derive(Clone, Debug)]
pub(crate) struct Limits {
    pub(crate) max_queued_spans: usize,
    /// The queued spans' estimated bytes at most (`weight.rs`).
    pub(crate) max_queued_bytes: u64,
    pub(crate) max_batch_spans: usize,
    pub(crate) export_interval: Duration,
    pub(crate) export_timeout: Duration,
    pub(crate) metric_interval: Duration,
}
