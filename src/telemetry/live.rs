//! Whether a telemetry that exports spans lives in this process: until one
//! made its layer, propagation and sampling cost one atomic load.

use std::sync::atomic::{AtomicUsize, Ordering};

/// How many [`Telemetry`](super::Telemetry) values that made a layer are
/// alive in this process.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);

/// One more telemetry exports spans.
pub(crate) fn activate() {
    ACTIVE.fetch_add(1, Ordering::Relaxed);
}

/// One telemetry that exported spans is gone.
pub(crate) fn deactivate() {
    ACTIVE.fetch_sub(1, Ordering::Relaxed);
}

/// Whether a telemetry that made a layer lives.
pub(crate) fn is_active() -> bool {
    ACTIVE.load(Ordering::Relaxed) > 0
}

/// Whether exactly one telemetry that made a layer lives.
pub(crate) fn is_alone() -> bool {
    ACTIVE.load(Ordering::Relaxed) == 1
}
