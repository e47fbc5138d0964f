//! The single-flight cell: concurrent identical reads run once, and a
//! cancelled runner hands its read over.

use super::{Dedup, Origin};
use futures::poll;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
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

#[tokio::test]
async fn a_cancelled_runner_hands_the_read_to_exactly_one_waiter() {
    let dedup = Dedup::<&str, u32>::new();
    let (runs, gate) = (AtomicU32::new(0), Notify::new());
    let read = || async {
        let run = runs.fetch_add(1, SeqCst) + 1;
        gate.notified().await;
        run
    };
    let mut runner = Box::pin(dedup.get_or_run("k", read));
    assert!(poll!(runner.as_mut()).is_pending());
    let mut first = Box::pin(dedup.get_or_run("k", read));
    let mut second = Box::pin(dedup.get_or_run("k", read));
    assert!(poll!(first.as_mut()).is_pending());
    assert!(poll!(second.as_mut()).is_pending());
    assert_eq!(runs.load(SeqCst), 1, "the waiters wait, they do not run");
    drop(runner); // cancelled mid-read
    assert!(poll!(first.as_mut()).is_pending());
    assert_eq!(runs.load(SeqCst), 2, "the first waiter took the read over");
    assert!(poll!(second.as_mut()).is_pending());
    assert_eq!(runs.load(SeqCst), 2, "the second waits for the first");
    gate.notify_waiters();
    assert_eq!(first.await, (2, Origin::Ran));
    assert_eq!(second.await, (2, Origin::Shared));
    assert_eq!(dedup.get_or_run("k", read).await, (2, Origin::Shared));
    assert_eq!(runs.load(SeqCst), 2);
}

#[tokio::test]
async fn a_panicking_runner_does_not_poison_its_key() {
    let dedup = Arc::new(Dedup::<&'static str, u32>::new());
    let (started, gate) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let runner = {
        let (dedup, started, gate) = (dedup.clone(), started.clone(), gate.clone());
        tokio::spawn(async move {
            dedup
                .get_or_run("k", || async move {
                    started.notify_one();
                    gate.notified().await;
                    panic!("the read panicked (expected by the test)")
                })
                .await
        })
    };
    started.notified().await;
    let mut waiter = Box::pin(dedup.get_or_run("k", || async { 9 }));
    assert!(poll!(waiter.as_mut()).is_pending());
    gate.notify_one();
    assert!(runner.await.unwrap_err().is_panic());
    assert_eq!(waiter.await, (9, Origin::Ran));
}

#[tokio::test]
async fn a_cancelled_waiter_changes_nothing() {
    let dedup = Dedup::<&str, u32>::new();
    let gate = Notify::new();
    let mut runner = Box::pin(dedup.get_or_run("k", || async {
        gate.notified().await;
        1
    }));
    assert!(poll!(runner.as_mut()).is_pending());
    let mut waiter = Box::pin(dedup.get_or_run("k", || async { 2 }));
    assert!(poll!(waiter.as_mut()).is_pending());
    drop(waiter);
    gate.notify_waiters();
    assert_eq!(runner.await, (1, Origin::Ran));
    assert_eq!(
        dedup.get_or_run("k", || async { 3 }).await,
        (1, Origin::Shared)
    );
    assert_eq!(dedup.cells().len(), 1);
}

/// Many callers of one key on four threads, some aborted at random points:
/// nobody hangs (no lost wake-up), and every caller that finishes sees the
/// one stored value, exactly one of them as its runner.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn single_flight_holds_under_cancellation_on_many_threads() {
    for round in 0..200u32 {
        let dedup = Arc::new(Dedup::<u32, u32>::new());
        let runs = Arc::new(AtomicU32::new(0));
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (dedup, runs) = (dedup.clone(), runs.clone());
                tokio::spawn(async move {
                    dedup
                        .get_or_run(round, || async move {
                            let run = runs.fetch_add(1, SeqCst);
                            for _ in 0..(run % 3) {
                                tokio::task::yield_now().await;
                            }
                            run
                        })
                        .await
                })
            })
            .collect();
        for (i, task) in tasks.iter().enumerate() {
            if (round as usize + i).is_multiple_of(3) {
                task.abort();
            }
        }
        let mut finished = Vec::new();
        for task in tasks {
            let joined = tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .expect("a caller hung: a lost wake-up");
            if let Ok(value) = joined {
                finished.push(value);
            }
        }
        if let Some(&(value, _)) = finished.first() {
            assert!(finished.iter().all(|(v, _)| *v == value), "{finished:?}");
            let ran = finished.iter().filter(|(_, o)| *o == Origin::Ran).count();
            assert_eq!(ran, 1, "{finished:?}");
        }
    }
}

#[tokio::test]
async fn a_runner_dropped_before_its_first_poll_hands_the_read_over() {
    let dedup = Dedup::<&str, u32>::new();
    // The key is claimed as the future is made, not as it is first polled.
    let runner = dedup.get_or_run("k", || async { 1 });
    let mut waiter = Box::pin(dedup.get_or_run("k", || async { 2 }));
    assert!(poll!(waiter.as_mut()).is_pending(), "the key is claimed");
    drop(runner);
    let handed = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was left waiting on a runner that is gone");
    assert_eq!(handed, (2, Origin::Ran));
}
