//! Request-scoped single-flight de-duplication.
mod common;
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

/// Two operations of one request share a read; the operation running it is
/// cancelled; the other still gets its answer (it reads itself).
#[tokio::test]
async fn a_cancelled_operation_does_not_poison_the_batch() {
    let upstream = common::Upstream::start().await;
    upstream.seen.set(
        1,
        common::Behaviour::Delay(std::time::Duration::from_millis(300)),
    );
    let engine = fanout_budget::Engine::new(fanout_budget::Config::default());
    let request = engine.begin_request(fanout_budget::Caller::Public);
    let url: reqwest::Url = format!("{}/item/1", upstream.base()).parse().unwrap();

    let (a, b) = (request.operation(), request.operation());
    let first = {
        let url = url.clone();
        tokio::spawn(async move {
            a.upstream()
                .read(fanout_budget::Read::get(url))
                .await
                .map(|r| r.status)
        })
    };
    while upstream.seen.in_flight() == 0 {
        tokio::task::yield_now().await;
    }
    let second = tokio::spawn(async move {
        b.upstream()
            .read(fanout_budget::Read::get(url))
            .await
            .map(|r| r.body.clone())
    });
    tokio::task::yield_now().await;
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    let body = second
        .await
        .unwrap()
        .expect("the surviving operation gets an answer");
    assert!(String::from_utf8_lossy(&body).contains("item-1"));
}
