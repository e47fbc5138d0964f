//! The request's in-flight slots: `max_concurrent_reads` reads of one
//! request in flight at once (see the budget's module docs).

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use tokio::sync::Notify;

/// The request's in-flight slots (see the module docs).
pub(super) struct Slots {
    pub(super) max: usize,
    pub(super) held: AtomicUsize,
    /// Reads registered on `freed`: a release wakes one only if this is not 0.
    pub(super) waiting: AtomicUsize,
    pub(super) freed: Notify,
}

/// One of a request's in-flight slots, released when dropped.
#[must_use = "the slot is released as soon as it is dropped"]
pub(crate) struct InFlightSlot<'a> {
    slots: &'a Slots,
}

impl Drop for InFlightSlot<'_> {
    fn drop(&mut self) {
        // SeqCst on both sides (here and in `acquire`): either the waiter's
        // retry sees this slot free, or this load sees the waiter.
        self.slots.held.fetch_sub(1, SeqCst);
        if self.slots.waiting.load(SeqCst) > 0 {
            self.slots.freed.notify_one();
        }
    }
}

/// A read registered as waiting, until it stops waiting (slot or cancelled).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

impl Slots {
    pub(super) fn try_acquire(&self) -> Option<InFlightSlot<'_>> {
        let mut held = self.held.load(SeqCst);
        while held < self.max {
            match self
                .held
                .compare_exchange_weak(held, held + 1, SeqCst, SeqCst)
            {
                Ok(_) => return Some(InFlightSlot { slots: self }),
                Err(now) => held = now,
            }
        }
        None
    }

    pub(super) async fn acquire(&self) -> InFlightSlot<'_> {
        loop {
            // Registered before the retry, so a release after the retry's
            // check wakes this read (or leaves the wake-up for it).
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let _waiting = {
                self.waiting.fetch_add(1, SeqCst);
                Waiting(&self.waiting)
            };
            if let Some(slot) = self.try_acquire() {
                return slot;
            }
            freed.await;
        }
    }
}
