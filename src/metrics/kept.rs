//! A counter kept once registered: the handles an owner keeps
//! (`request.rs`, `inbound.rs`) are registered with the recorder the first
//! time they count, not looked up by name each time.

use metrics::{counter, Counter};
use std::sync::OnceLock;

/// Counts one more on the counter `name` kept in `cell`, registered the
/// first time.
pub(crate) fn count(cell: &OnceLock<Counter>, name: &'static str) {
    cell.get_or_init(|| counter!(name)).increment(1);
}
