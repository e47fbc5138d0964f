//! The circuit breaker in front of Redis.
//!
//! Closed (normal), calls go to Redis. The first failed or timed-out call
//! opens it: from then on calls skip Redis and the caller applies
//! `failure_mode` at once, paying no timeout. One background task probes
//! recovery every `backoff`; the first probe that succeeds closes the breaker.
//! Each change of state is logged once. Time is tokio's, so a paused tokio
//! clock drives the probes in tests.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tracing::instrument::WithSubscriber;

/// Open or closed, with the count of failed calls.
#[derive(Debug)]
pub(crate) struct Breaker {
    backoff: Duration,
    open: AtomicBool,
    failures: AtomicU64,
}

impl Breaker {
    /// A closed breaker that stays open at least `backoff` after a failure.
    pub(crate) fn new(backoff: Duration) -> Self {
        Self {
            backoff,
            open: AtomicBool::new(false),
            failures: AtomicU64::new(0),
        }
    }

    /// Whether calls skip Redis right now.
    pub(crate) fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// Calls that failed or timed out so far.
    pub(crate) fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Records a failed call. The failure that opens the breaker starts the
    /// one probe loop: every `backoff`, `probe()`; `Ok` closes the breaker.
    /// The loop ends when the breaker is dropped.
    pub(crate) fn trip<P, F, E>(self: &Arc<Self>, error: &dyn fmt::Display, mut probe: P)
    where
        P: FnMut() -> F + Send + 'static,
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: fmt::Display,
    {
        self.failures.fetch_add(1, Ordering::Relaxed);
        if self.open.swap(true, Ordering::AcqRel) {
            return; // already open: its probe loop is running
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // Nothing could probe: stay closed, so the next call tries Redis.
            self.open.store(false, Ordering::Release);
            return;
        };
        let backoff_ms = self.backoff.as_millis() as u64;
        tracing::warn!(%error, backoff_ms, "redis unreachable: skipping it until a probe succeeds");
        let breaker = Arc::downgrade(self);
        let backoff = self.backoff;
        let probes = async move {
            loop {
                tokio::time::sleep(backoff).await;
                if breaker.strong_count() == 0 {
                    return;
                }
                let probed = probe().await;
                let Some(breaker) = breaker.upgrade() else {
                    return;
                };
                match probed {
                    Ok(()) => {
                        breaker.open.store(false, Ordering::Release);
                        tracing::info!("redis reachable again: shared limits resume");
                        return;
                    }
                    Err(error) => tracing::debug!(%error, "redis probe failed"),
                }
            }
        };
        // Logged where the call that tripped it logs.
        runtime.spawn(probes.with_current_subscriber());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[tokio::test(start_paused = true)]
    async fn opens_on_a_failure_and_closes_after_the_first_good_probe() {
        let breaker = Arc::new(Breaker::new(Duration::from_millis(1000)));
        let probes = Arc::new(AtomicUsize::new(0));
        let concurrent = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let probe = {
            let (probes, concurrent, most) = (probes.clone(), concurrent.clone(), most.clone());
            move || {
                let (probes, concurrent, most) = (probes.clone(), concurrent.clone(), most.clone());
                async move {
                    let now = concurrent.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    concurrent.fetch_sub(1, Ordering::SeqCst);
                    // The third probe succeeds.
                    if probes.fetch_add(1, Ordering::SeqCst) + 1 >= 3 {
                        Ok(())
                    } else {
                        Err("refused")
                    }
                }
            }
        };
        assert!(!breaker.is_open());
        for _ in 0..10 {
            breaker.trip(&"timed out", probe.clone());
        }
        assert!(breaker.is_open());
        assert_eq!(breaker.failures(), 10);
        // Probes at 1.0 s, 2.3 s and 3.6 s; the third closes it at 3.9 s.
        tokio::time::sleep(Duration::from_millis(3800)).await;
        assert!(breaker.is_open(), "two failed probes");
        assert_eq!(probes.load(Ordering::SeqCst), 2);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!breaker.is_open(), "the third probe succeeded");
        assert_eq!(probes.load(Ordering::SeqCst), 3);
        assert_eq!(most.load(Ordering::SeqCst), 1, "one probe at a time");
        // Closed stays closed, and no probe runs.
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(probes.load(Ordering::SeqCst), 3);
        // A new failure opens it again.
        breaker.trip(&"refused", probe);
        assert!(breaker.is_open());
    }

    #[tokio::test(start_paused = true)]
    async fn the_probe_loop_ends_with_the_breaker() {
        let breaker = Arc::new(Breaker::new(Duration::from_millis(100)));
        let probes = Arc::new(AtomicUsize::new(0));
        let counted = probes.clone();
        breaker.trip(&"refused", move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Err::<(), _>("refused") }
        });
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert_eq!(probes.load(Ordering::SeqCst), 3);
        drop(breaker);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(
            probes.load(Ordering::SeqCst),
            3,
            "no probe after the breaker is gone"
        );
    }
}
