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
//!   filled, a list made with room for a whole batch: it never grows. A
//!   batch filled is set aside whole, a new one started, and the export
//!   thread woken: a full batch leaves at once, the rest every
//!   `export_interval`.
//! - The thread takes the oldest full batch, else the one being filled,
//!   as it is (no span copied), exports it (`futures::executor::block_on`,
//!   the exporter posting on the application's runtime: `export_client.rs`),
//!   then gives its places and bytes back to the queue's bound, the weights
//!   its spans were admitted with, and counts a failed batch's spans as
//!   dropped (`export_failed`).
//! - [`Batches::flush`] waits until every span queued before it was
//!   exported (spans that keep arriving meanwhile do not hold it up);
//!   [`Batches::shutdown`] exports what is queued, then stops the thread.
//!   After it, a span pushed is let go at once.

use super::in_flight::InFlight;
use crate::metrics;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use std::collections::VecDeque;
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
    max_batch: usize,
    interval: Duration,
}

#[derive(Debug, Default)]
struct State {
    /// The batch being filled, and its spans' weights as they were
    /// admitted.
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
        let max_batch = max_batch.max(1);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                filling: Batch::with_room(max_batch),
                ..State::default()
            }),
            wake: Condvar::new(),
            progress: Condvar::new(),
            in_flight,
            max_batch,
            interval,
        });
        let thread = shared.clone();
        std::thread::Builder::new()
            .name("fanout-telemetry-export".to_owned())
            .spawn(move || thread.run(&exporter))?;
        Ok(Batches { shared })
    }

    /// Queues `span`, admitted with `weight`; after the shutdown, lets it
    /// go (its place and bytes given back).
    pub(crate) fn push(&self, span: SpanData, weight: u64) {
        let mut state = self.shared.state();
        if state.stopping {
            drop(state);
            self.shared.in_flight.release(1, weight);
            return;
        }
        if state.filling.spans.capacity() == 0 {
            state.filling = Batch::with_room(self.shared.max_batch);
        }
        state.filling.spans.push(span);
        state.filling.bytes += weight;
        state.pushed += 1;
        let full = state.filling.spans.len() >= self.shared.max_batch;
        if full {
            let filled =
                std::mem::replace(&mut state.filling, Batch::with_room(self.shared.max_batch));
            state.full.push_back(filled);
        }
        drop(state);
        if full {
            self.shared.wake.notify_one();
        }
    }

    /// Exports every span queued before the call and waits for it (up to
    /// 5 s): an error if one of those exports failed, or the wait ran out.
    pub(crate) fn flush(&self) -> OTelSdkResult {
        let mut state = self.shared.state();
        let (target, failures) = (state.pushed, state.failures);
        if state.exported >= target {
            return Ok(());
        }
        if state.stopped {
            return Err(OTelSdkError::AlreadyShutdown);
        }
        state.flush_to = state.flush_to.max(target);
        self.shared.wake.notify_one();
        let deadline = Instant::now() + FLUSH_TIMEOUT;
        while state.exported < target && !state.stopped {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return Err(OTelSdkError::Timeout(FLUSH_TIMEOUT));
            };
            state = self.shared.wait(&self.shared.progress, state, left);
        }
        if state.exported < target {
            return Err(OTelSdkError::AlreadyShutdown);
        }
        if state.failures > failures {
            return Err(OTelSdkError::InternalFailure(
                "an export of the flushed spans failed".to_owned(),
            ));
        }
        Ok(())
    }

    /// Exports what is queued, then stops the thread (which shuts its
    /// exporter down); waits up to `timeout`.
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
            state = self.shared.wait(&self.shared.progress, state, left);
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

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // Every section leaves the state whole: a poisoned lock is still.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(
        &self,
        on: &Condvar,
        state: MutexGuard<'a, State>,
        at_most: Duration,
    ) -> MutexGuard<'a, State> {
        match on.wait_timeout(state, at_most) {
            Ok((state, _)) => state,
            Err(poisoned) => poisoned.into_inner().0,
        }
    }

    /// The export thread: a batch out whenever one is full, a flush or the
    /// shutdown asks, or `interval` has passed since the last.
    fn run<E: SpanExporter>(&self, exporter: &E) {
        let mut last = Instant::now();
        loop {
            let mut state = self.state();
            loop {
                let due = !state.full.is_empty() || state.taken < state.flush_to || state.stopping;
                let left = (last + self.interval).checked_duration_since(Instant::now());
                match left {
                    Some(left) if !due && !left.is_zero() => {
                        state = self.wait(&self.wake, state, left);
                    }
                    _ => break,
                }
            }
            if state.full.is_empty() && state.filling.spans.is_empty() {
                if state.stopping {
                    state.stopped = true;
                    drop(state);
                    self.progress.notify_all();
                    let _ = exporter.shutdown();
                    return;
                }
                // Nothing queued at the interval: nothing to take.
                last = Instant::now();
                continue;
            }
            let Batch {
                spans: batch,
                bytes,
            } = take(&mut state);
            let spans = batch.len();
            drop(state);
            last = Instant::now();
            let result = futures::executor::block_on(exporter.export(batch));
            self.in_flight.release(spans, bytes);
            if result.is_err() {
                metrics::spans_dropped("export_failed", spans as u64);
            }
            let mut state = self.state();
            state.exported += spans as u64;
            state.failures += u64::from(result.is_err());
            drop(state);
            self.progress.notify_all();
        }
    }
}

/// The oldest full batch, else the one being filled (a new one started
/// when a span comes).
fn take(state: &mut State) -> Batch {
    let batch = match state.full.pop_front() {
        Some(full) => full,
        None => std::mem::take(&mut state.filling),
    };
    state.taken += batch.spans.len() as u64;
    batch
}

/// Spans to export together, and the weights they were admitted with.
#[derive(Debug, Default)]
struct Batch {
    spans: Vec<SpanData>,
    bytes: u64,
}

impl Batch {
    /// Empty, with room for `spans` spans.
    fn with_room(spans: usize) -> Self {
        Batch {
            spans: Vec::with_capacity(spans),
            bytes: 0,
        }
    }
}

#[cfg(test)]
#[path = "batches_tests.rs"]
mod tests;
