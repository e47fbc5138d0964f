//! The spans queued or being exported and their estimated bytes, in one
//! word: what the processor admits a span against (`processor.rs`) and
//! the export thread gives back when a batch's export returns
//! (`batches.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One span in [`InFlight`]'s word: the spans count above bit 44, the
/// bytes below.
const SPAN: u64 = 1 << 44;
/// The bytes' part of the word.
const BYTES: u64 = SPAN - 1;
/// The most spans a queue may hold: the word's span part (20 bits) never
/// overflows, however many threads add at once.
pub(crate) const MAX_SPANS: usize = 1 << 19;
/// The most bytes a queue may hold (64 GiB): one span weighs at most
/// that, so 255 threads adding at once cannot carry the bytes' part into
/// the spans'.
pub(crate) const MAX_BYTES: u64 = 1 << 36;

/// The spans queued or being exported and their estimated bytes, in one
/// word, shared by the processor that admits them and the exporter that
/// lets them go.
#[derive(Debug)]
pub(crate) struct InFlight {
    word: AtomicU64,
    max_spans: u64,
    max_bytes: u64,
}

impl InFlight {
    /// An empty queue of at most `max_spans` spans (up to [`MAX_SPANS`])
    /// and `max_bytes` (up to [`MAX_BYTES`]).
    pub(crate) fn new(max_spans: usize, max_bytes: u64) -> Arc<Self> {
        Arc::new(InFlight {
            word: AtomicU64::new(0),
            max_spans: max_spans.clamp(1, MAX_SPANS) as u64,
            max_bytes: max_bytes.min(MAX_BYTES),
        })
    }

    /// Takes a place and `bytes` for one span, or says why not
    /// (`queue_full`, `queue_bytes`): one atomic add, and a [`release`]
    /// to give back a refusal (saturating: an over-release meanwhile must
    /// not make the give-back wrap).
    ///
    /// [`release`]: InFlight::release
    pub(crate) fn admit(&self, bytes: u64) -> Result<(), &'static str> {
        if bytes > self.max_bytes {
            return Err("queue_bytes");
        }
        let add = SPAN + bytes;
        let before = self.word.fetch_add(add, Ordering::Relaxed);
        let refusal = if before / SPAN >= self.max_spans {
            "queue_full"
        } else if (before & BYTES) + bytes > self.max_bytes {
            "queue_bytes"
        } else {
            return Ok(());
        };
        self.release(1, bytes);
        Err(refusal)
    }

    /// Gives back the places and bytes of `spans` spans weighing `bytes`,
    /// each part stopping at zero: a release that does not match what was
    /// admitted (none should: each span is given back with the weight it was
    /// admitted with) never wraps the word nor borrows from the spans' part. Too much given
    /// back only loosens the bounds until the queue drains; it never makes
    /// them refuse for ever. One compare-and-swap, retried while others
    /// change the word.
    pub(crate) fn release(&self, spans: usize, bytes: u64) {
        let spans = u64::try_from(spans).unwrap_or(u64::MAX);
        let less = |word: u64| {
            let held_spans = (word / SPAN).saturating_sub(spans);
            Some(held_spans * SPAN + (word & BYTES).saturating_sub(bytes))
        };
        // `less` always answers: the update cannot fail.
        let _ = self
            .word
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, less);
    }

    /// The bytes the queue holds at most.
    pub(crate) fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// The spans and bytes held now.
    #[cfg(test)]
    pub(crate) fn held(&self) -> (u64, u64) {
        let word = self.word.load(Ordering::Relaxed);
        (word / SPAN, word & BYTES)
    }
}

#[cfg(test)]
#[path = "in_flight_tests.rs"]
mod tests;
