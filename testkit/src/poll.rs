//! Waiting, bounded, for a condition to hold.

use std::time::{Duration, Instant};

/// Polls `ok` every 10 ms until it holds; how long that took. Panics after
/// `limit`, naming `what`.
pub async fn until(what: &str, limit: Duration, mut ok: impl AsyncFnMut() -> bool) -> Duration {
    let started = Instant::now();
    loop {
        if ok().await {
            return started.elapsed();
        }
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
