//! The export queue: ended spans held until a thread of the telemetry's
//! exports them, in batches.
//!
//! The SDK's `BatchSpanProcessor` moved each span four times on its way out
//! — into a channel, out of it, into a batch, and the batch copied whole
//! (`split_off(0)`) before the exporter took it — about 800 instructions of
//! `memcpy` a span, a dozen spans to a sampled request. Here a span is moved
//! once, into the queue's list; the exporter takes the list itself.
//!
//! How it works:
//! - [`Batches::push`] adds an admitted span and its weight under one lock
//!   (`processor.rs` cut, weighed and admitted it) to the batch being
//!   filled, a list made with room for a whole batch: it never grows, so
//!   no span is copied under the lock. A batch is at most `max_batch`
//!   spans, and no more than the queue's bytes could hold (each span
//!   weighs at least its structure): the room a list reserves stays
//!   within the bound. A batch filled is set aside whole, a new one
//!   started, and the export thread woken: a full batch leaves at once,
//!   the rest every `export_interval`.
//! - The thread takes the oldest full batch, else the one being filled,
//!   as it is, exports it (`futures::executor::block_on`, the exporter
//!   posting on the application's runtime: `export_client.rs`), then gives
//!   its places and bytes back to the queue's bound, the weights its spans
//!   were admitted with, and counts a failed batch's spans as dropped
//!   (`export_failed`). An exporter that panics fails its batch; the
//!   thread goes on.
//! - [`Batches::flush`] waits until every span queued before it was
//!   exported (spans that keep arriving meanwhile do not hold it up);
//!   [`Batches::shutdown`] exports what is queued, shuts the exporter
//!   down, then stops the thread. After it, a span pushed is let go at
//!   once and counted (`shutdown`). Were the thread to end any other way,
//!   it lets go of what is queued and the queue is shut down.

use super::in_flight::InFlight;
use crate::metrics;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long [`Batches::flush`] waits for the spans queued before it.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// A queue of ended spans and the thread that exports them.
#[derive(Debug)]
pub(crate) struct Batches {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// The export thread waits here: a full batch, a flush, the shutdown.
    wake: Condvar,
    /// Flushes and the shutdown wait here for the thread's progress.
    progress: Condvar,
    in_flight: Arc<InFlight>,
    /// The spans a batch holds at most, and the room each list reserves.
    room: usize,
    interval: Duration,
}

#[derive(Debug, Default)]
struct State {
    /// The batch being filled.
    filling: Batch,
    /// Batches filled, oldest first.
    full: VecDeque<Batch>,
    /// Spans ever pushed, taken by the thread, and exported (or failed).
    pushed: u64,
    taken: u64,
    exported: u64,
    /// The most `pushed` a flush waits for.
    flush_to: u64,
    /// Batches whose export failed, ever.
    failures: u64,
    stopping: bool,
    stopped: bool,
}

/// Spans to export together, and the weights they were admitted with.
#[derive(Debug, Default)]
struct Batch {
    spans: Vec<SpanData>,
    bytes: u64,
}

impl Batches {
    /// A queue of at most `max_batch` spans a batch (at least one),
    /// exported by `exporter` every `interval` or once a batch is full;
    /// each batch's places and bytes given back to `in_flight`.
    pub(crate) fn new<E: SpanExporter + 'static>(
        exporter: E,
        in_flight: Arc<InFlight>,
        max_batch: usize,
        interval: Duration,
    ) -> std::io::Result<Self> {
        let fit = in_flight.max_bytes() / std::mem::size_of::<SpanData>() as u64;
        let room = max_batch
            .min(usize::try_from(fit).unwrap_or(usize::MAX))
            .max(1);
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            progress: Condvar::new(),
            in_flight,
            room,
            interval,
        });
        let thread = shared.clone();
        std::thread::Builder::new()
            .name("fanout-telemetry-export".to_owned())
            .spawn(move || thread.run(&exporter))?;
        Ok(Batches { shared })
    }

    /// Queues `span`, admitted with `weight`; after the shutdown, lets it
    /// go (its place and bytes given back, counted as `shutdown`).
    pub(crate) fn push(&self, span: SpanData, weight: u64) {
        let mut state = self.shared.state();
        if state.stopping {
            drop(state);
            self.shared.in_flight.release(1, weight);
            metrics::spans_dropped("shutdown", 1);
            return;
        }
        let room = self.shared.room;
        if state.filling.spans.capacity() == 0 {
            state.filling.spans.reserve_exact(room);
        }
        state.filling.spans.push(span);
        state.filling.bytes += weight;
        state.pushed += 1;
        let full = state.filling.spans.len() >= room;
        if full {
            let filled = std::mem::take(&mut state.filling);
            state.full.push_back(filled);
        }
        drop(state);
        if full {
            self.shared.wake.notify_one();
        }
    }

    /// Exports every span queued before the call and waits for it (up to
    /// 5 s): an error if one of those exports failed, the wait ran out, or
    /// the queue was shut down.
    pub(crate) fn flush(&self) -> OTelSdkResult {
        let mut state = self.shared.state();
        if state.stopping {
            return Err(OTelSdkError::AlreadyShutdown);
        }
        let (target, failures) = (state.pushed, state.failures);
        state.flush_to = state.flush_to.max(target);
        self.shared.wake.notify_one();
        let deadline = Instant::now() + FLUSH_TIMEOUT;
        while state.exported < target {
            if state.stopped {
                return Err(OTelSdkError::AlreadyShutdown);
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return Err(OTelSdkError::Timeout(FLUSH_TIMEOUT));
            };
            state = self.shared.wait(&self.shared.progress, state, Some(left));
        }
        if state.failures > failures {
            return Err(OTelSdkError::InternalFailure(
                "an export of the flushed spans failed".to_owned(),
            ));
        }
        Ok(())
    }

    /// Exports what is queued, shuts the exporter down, then stops the
    /// thread; waits up to `timeout` for all of it.
    pub(crate) fn shutdown(&self, timeout: Duration) -> OTelSdkResult {
        let mut state = self.shared.state();
        if state.stopping {
            return Err(OTelSdkError::AlreadyShutdown);
        }
        state.stopping = true;
        self.shared.wake.notify_one();
        let deadline = Instant::now() + timeout;
        while !state.stopped {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return Err(OTelSdkError::Timeout(timeout));
            };
            state = self.shared.wait(&self.shared.progress, state, Some(left));
        }
        Ok(())
    }
}

impl Drop for Batches {
    /// Stops the thread without waiting: it exports what is queued first.
    fn drop(&mut self) {
        self.shared.state().stopping = true;
        self.shared.wake.notify_one();
    }
}

/// The thread's end, however it comes: what is still queued let go, the
/// queue shut down, and whoever waits told.
struct Ended<'a>(&'a Shared);

impl Drop for Ended<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state();
        let mut left = std::mem::take(&mut state.full);
        left.push_back(std::mem::take(&mut state.filling));
        state.stopping = true;
        state.stopped = true;
        drop(state);
        for batch in left.into_iter().filter(|batch| !batch.spans.is_empty()) {
            self.0.in_flight.release(batch.spans.len(), batch.bytes);
            metrics::spans_dropped("shutdown", batch.spans.len() as u64);
        }
        self.0.progress.notify_all();
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // Every section leaves the state whole: a poisoned lock is still.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits on `on` up to `at_most` (`None`: until woken).
    fn wait<'a>(
        &self,
        on: &Condvar,
        state: MutexGuard<'a, State>,
        at_most: Option<Duration>,
    ) -> MutexGuard<'a, State> {
        match at_most {
            Some(at_most) => match on.wait_timeout(state, at_most) {
                Ok((state, _)) => state,
                Err(poisoned) => poisoned.into_inner().0,
            },
            None => on.wait(state).unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// The export thread: a batch out whenever one is full, a flush or the
    /// shutdown asks, or `interval` has passed since the last (an interval
    /// too long to add to a clock's reading: never).
    fn run<E: SpanExporter>(&self, exporter: &E) {
        let _ended = Ended(self);
        let mut last = Instant::now();
        loop {
            let mut state = self.state();
            loop {
                let due = !state.full.is_empty() || state.taken < state.flush_to || state.stopping;
                if due {
                    break;
                }
                let left = last
                    .checked_add(self.interval)
                    .map(|at| at.saturating_duration_since(Instant::now()));
                if left.is_some_and(|left| left.is_zero()) {
                    break;
                }
                state = self.wait(&self.wake, state, left);
            }
            let Some(Batch {
                spans: batch,
                bytes,
            }) = take(&mut state)
            else {
                if state.stopping {
                    drop(state);
                    let _ = exporter.shutdown();
                    return;
                }
                // Nothing queued at the interval: nothing to take.
                last = Instant::now();
                continue;
            };
            let spans = batch.len();
            drop(state);
            last = Instant::now();
            let export = || futures::executor::block_on(exporter.export(batch));
            let failed = !matches!(
                std::panic::catch_unwind(AssertUnwindSafe(export)),
                Ok(Ok(()))
            );
            self.in_flight.release(spans, bytes);
            if failed {
                metrics::spans_dropped("export_failed", spans as u64);
            }
            let mut state = self.state();
            state.exported += spans as u64;
            state.failures += u64::from(failed);
            drop(state);
            self.progress.notify_all();
        }
    }
}

/// The oldest full batch, else the one being filled (its room reserved
/// again at the next push); `None` when nothing is queued.
fn take(state: &mut State) -> Option<Batch> {
    let batch = match state.full.pop_front() {
        Some(full) => full,
        None if state.filling.spans.is_empty() => return None,
        None => std::mem::take(&mut state.filling),
    };
    state.taken += batch.spans.len() as u64;
    Some(batch)
}

#[cfg(test)]
#[path = "batches_tests.rs"]
mod tests;
