//! Request-scoped single-flight de-duplication.
use fanout_budget::dedup::{Dedup, Origin};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use tokio::sync::Notify;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_identical_reads_run_once() {
    let dedup = Arc::new(Dedup::<String, u64>::new());
    let runs = Arc::new(AtomicU64::new(0));
    let gate = Arc::new(Notify::new());
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let (dedup, runs, gate) = (dedup.clone(), runs.clone(), gate.clone());
            tokio::spawn(async move {
                dedup
                    .get_or_run("k".to_string(), || async move {
                        runs.fetch_add(1, SeqCst);
                        gate.notified().await;
                        42
                    })
                    .await
            })
        })
        .collect();
    // Let the runner reach the gate, then open it.
    while runs.load(SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    gate.notify_one();
    let mut ran = 0;
    for t in tasks {
        let (value, origin) = t.await.unwrap();
        assert_eq!(value, 42);
        ran += (origin == Origin::Ran) as u32;
    }
    assert_eq!(runs.load(SeqCst), 1);
    assert_eq!(ran, 1);
    let (value, origin) = dedup.get_or_run("k".to_string(), || async { 7 }).await;
    assert_eq!((value, origin), (42, Origin::Shared));
}

#[tokio::test]
async fn a_cancelled_read_does_not_poison_its_key() {
    let dedup = Dedup::<&str, u64>::new();
    let started = Notify::new();
    {
        let read = dedup.get_or_run("k", || async {
            started.notify_one();
            std::future::pending::<u64>().await
        });
        tokio::pin!(read);
        tokio::select! {
            _ = &mut read => unreachable!("the read never finishes"),
            _ = started.notified() => {}
        }
        // `read` is dropped here: the caller was cancelled mid-read.
    }
    let (value, origin) = dedup.get_or_run("k", || async { 5 }).await;
    assert_eq!((value, origin), (5, Origin::Ran));
}
