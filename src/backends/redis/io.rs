//! Redis I/O on a thread of its own, so a replica's own slowness is never
//! taken for Redis being down.
//!
//! # Why
//!
//! A multiplexed Redis connection reads its replies in a driver task, on
//! the runtime that made the connection. Made on the request runtime, that
//! task queues behind request work: a replica whose workers are busy with
//! CPU-heavy requests reads a reply Redis sent in 0.1 ms only when a worker
//! is free again, maybe after `timeout_ms` — and a call that "timed out"
//! that way would open the breaker, sending every limit to `failure_mode`
//! on a replica whose Redis is fine.
//!
//! # How it works
//!
//! One process-wide runtime on one OS thread (`fanout-redis`), started on
//! first use, runs every call to Redis: the connections are made there (so
//! their drivers run there), each call's timeout is measured there, the
//! breaker's probe loop runs there. The caller awaits the call's task from
//! its own runtime; however late it is polled, what it finds is what Redis
//! answered. A call's task is aborted when its caller drops it (a request
//! cancelled mid-call cancels its call, as it did when the call ran in the
//! caller's task); it logs to the caller's subscriber. The thread does little — encode a command, parse a
//! reply, wake a caller — so the operating system schedules it at once even
//! when request threads take every core.

use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use tokio::runtime::Handle;
use tokio::task::{JoinError, JoinHandle};
use tracing::instrument::WithSubscriber;

/// The Redis I/O runtime's handle, the thread started on first use.
fn runtime() -> &'static Handle {
    static RUNTIME: OnceLock<Handle> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("the Redis I/O runtime starts");
        let handle = runtime.handle().clone();
        std::thread::Builder::new()
            .name("fanout-redis".into())
            .spawn(move || runtime.block_on(std::future::pending::<()>()))
            .expect("the Redis I/O thread starts");
        handle
    })
}

/// Runs `call` on the Redis I/O runtime; aborted if the returned future is
/// dropped first.
pub(super) fn spawn<T, F>(call: F) -> OnIo<T>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    // Logged where the caller logs (its subscriber, if it set its own).
    OnIo(runtime().spawn(call.with_current_subscriber()))
}

/// A call running on the Redis I/O runtime (see [`spawn`]).
pub(super) struct OnIo<T>(JoinHandle<T>);

impl<T> Future for OnIo<T> {
    type Output = Result<T, JoinError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx)
    }
}

impl<T> Drop for OnIo<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// A caller whose runtime is blocked still finds the call done, timed
    /// on the I/O thread.
    #[tokio::test(flavor = "current_thread")]
    async fn a_call_runs_while_its_callers_runtime_is_blocked() {
        let call = spawn(async {
            let started = tokio::time::Instant::now();
            tokio::time::sleep(Duration::from_millis(20)).await;
            started.elapsed()
        });
        // The caller's only thread is busy for a second: a call timed on
        // it would take the whole second; on the I/O thread, 20 ms (and
        // room for that thread to wait for a core on a loaded machine).
        let busy = Instant::now();
        while busy.elapsed() < Duration::from_millis(1_000) {
            std::hint::spin_loop();
        }
        let took = call.await.expect("the call ran");
        assert!(
            took < Duration::from_millis(700),
            "timed on the I/O thread: {took:?}"
        );
    }

    #[tokio::test]
    async fn a_dropped_call_is_aborted() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let call = spawn(async move {
            tokio::time::sleep(Duration::from_secs(60)).await;
            drop(tx);
        });
        drop(call);
        // Aborted: its sender is dropped long before the minute.
        let closed = tokio::time::timeout(Duration::from_secs(5), rx).await;
        assert!(matches!(closed, Ok(Err(_))), "{closed:?}");
    }
}
