//! The read path's own synchronisation: the single-flight cell under
//! cancellation and panics, the host caps' slots on every path, and the
//! read's timer on tokio's (paused) clock and on an injected one.
use fanout_budget::config::HostConfig;
use fanout_budget::dedup::{Dedup, Origin};
use fanout_budget::hosts::HostCap;
use fanout_budget::{
    Caller, Config, Engine, FanoutError, HostSlot, ManualClock, Read, Transport, UpstreamResponse,
};
use futures::future::BoxFuture;
use futures::poll;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

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
    assert_eq!(dedup.len(), 1);
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

fn cap(max_concurrent: u32, acquire_wait_ms: u64) -> Arc<HostCap> {
    let config = HostConfig {
        max_concurrent,
        acquire_wait_ms,
    };
    Arc::new(HostCap::new("h:1", Some(&config)))
}

#[tokio::test]
async fn a_cap_counts_and_releases_its_slots() {
    let unlimited = Arc::new(HostCap::new("u:1", None));
    let slots: Vec<HostSlot> = (0..3)
        .map(|_| unlimited.try_acquire().unwrap().expect("unlimited"))
        .collect();
    assert_eq!(unlimited.in_flight(), 3);
    drop(slots);
    assert_eq!(unlimited.in_flight(), 0);

    let two = cap(2, 50);
    let a = two.try_acquire().unwrap().expect("a free slot");
    let b = two.try_acquire().unwrap().expect("a free slot");
    assert!(two.try_acquire().unwrap().is_none(), "at the cap: wait");
    assert_eq!(two.in_flight(), 2);
    drop(a);
    let c = two.try_acquire().unwrap().expect("a released slot is free");
    drop((b, c));
    assert_eq!(two.in_flight(), 0);

    let err = cap(0, 50).try_acquire().unwrap_err();
    assert_eq!(
        err,
        FanoutError::HostSaturated {
            host: "h:1".into(),
            max_concurrent: 0
        }
    );
}

#[tokio::test(start_paused = true)]
async fn a_waiting_slot_gets_a_released_one_times_out_or_is_cancelled_without_a_leak() {
    let one = cap(1, 50);
    let held = one.try_acquire().unwrap().unwrap();
    // Released while waiting: the waiter gets it.
    let mut waiting = Box::pin(one.acquire(Duration::from_secs(5)));
    assert!(poll!(waiting.as_mut()).is_pending());
    drop(held);
    let held = waiting.await.expect("the released slot");
    assert_eq!(one.in_flight(), 1);
    // Not released: HOST_SATURATED after min(acquire_wait, time left).
    let started = tokio::time::Instant::now();
    let err = one.acquire(Duration::from_millis(20)).await.unwrap_err();
    assert_eq!(err.code(), "HOST_SATURATED");
    assert_eq!(started.elapsed(), Duration::from_millis(20));
    let started = tokio::time::Instant::now();
    assert!(one.acquire(Duration::from_secs(5)).await.is_err());
    assert_eq!(started.elapsed(), Duration::from_millis(50));
    // Cancelled while waiting: no permit is taken.
    let mut waiting = Box::pin(one.acquire(Duration::from_secs(5)));
    assert!(poll!(waiting.as_mut()).is_pending());
    drop(waiting);
    drop(held);
    assert_eq!(one.in_flight(), 0);
    let again = one.try_acquire().unwrap().expect("the permit came back");
    assert!(one.try_acquire().unwrap().is_none(), "and only one");
    drop(again);
}

#[test]
fn a_joined_slot_releases_both_parts() {
    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, SeqCst);
        }
    }
    let one = cap(1, 50);
    let released = Arc::new(AtomicBool::new(false));
    let local = one.try_acquire().unwrap().unwrap();
    let slot = local.join(HostSlot::new(Flag(released.clone())));
    assert_eq!(one.in_flight(), 1);
    drop(slot);
    assert_eq!(one.in_flight(), 0);
    assert!(released.load(SeqCst));
    assert!(one.try_acquire().unwrap().is_some());
}

/// Answers by the URL's last segment: `ok`, `fail`, `hang`, anything else after
/// `gate` opens.
struct Scripted {
    gate: Notify,
}

impl Transport for Scripted {
    fn fetch<'a>(
        &'a self,
        read: Read,
        host: &'a str,
    ) -> BoxFuture<'a, Result<UpstreamResponse, FanoutError>> {
        Box::pin(async move {
            let ok = || {
                UpstreamResponse::new(
                    host.to_string(),
                    http::StatusCode::OK,
                    http::HeaderMap::new(),
                    bytes::Bytes::from_static(b"{}"),
                )
            };
            match read.url().path().rsplit('/').next() {
                Some("ok") => Ok(ok()),
                Some("fail") => Err(FanoutError::Upstream {
                    host: host.into(),
                    status: None,
                    message: "refused".into(),
                }),
                Some("hang") => std::future::pending().await,
                _ => {
                    self.gate.notified().await;
                    Ok(ok())
                }
            }
        })
    }
}

fn engine(config: Config, clock: Option<Arc<ManualClock>>) -> (Engine, Arc<Scripted>) {
    let transport = Arc::new(Scripted {
        gate: Notify::new(),
    });
    let mut builder = Engine::builder(config).transport(transport.clone());
    if let Some(clock) = clock {
        builder = builder.clock(clock);
    }
    (builder.build(), transport)
}

fn read(path: &str) -> Read {
    Read::get(format!("http://up.test:81/{path}").parse().unwrap())
}

#[tokio::test(start_paused = true)]
async fn every_outcome_releases_the_host_slot_and_balances_the_counters() {
    let mut config = Config::default();
    config.budget.read_timeout_ms = 300;
    config.hosts.insert(
        "up.test:81".into(),
        HostConfig {
            max_concurrent: 1,
            acquire_wait_ms: 10,
        },
    );
    let (engine, transport) = engine(config, None);
    let request = engine.begin_request(Caller::Public);
    let op = request.operation();
    let upstream = op.upstream();
    assert!(upstream.read(read("ok")).await.is_ok());
    assert_eq!(
        upstream.read(read("fail")).await.unwrap_err().code(),
        "UPSTREAM_ERROR"
    );
    let started = tokio::time::Instant::now();
    let err = upstream.read(read("hang")).await.unwrap_err();
    assert_eq!(err.code(), "UPSTREAM_TIMEOUT");
    assert_eq!(started.elapsed(), Duration::from_millis(300));
    assert_eq!(engine.hosts().in_flight("up.test:81"), 0);
    // Cancelled mid-read, while a second read waits for the one slot.
    let mut cancelled = Box::pin(upstream.read(read("gated")));
    assert!(poll!(cancelled.as_mut()).is_pending());
    assert_eq!(engine.hosts().in_flight("up.test:81"), 1);
    let err = upstream.read(read("2/ok")).await.unwrap_err();
    assert_eq!(err.code(), "HOST_SATURATED");
    drop(cancelled);
    assert_eq!(engine.hosts().in_flight("up.test:81"), 0);
    assert!(upstream.read(read("3/ok")).await.is_ok());
    drop(transport);
    let stats = request.budget().stats();
    assert!(stats.balanced(), "{stats:?}");
    assert_eq!(stats.issued.load(SeqCst), 5);
    assert_eq!(stats.cancelled.load(SeqCst), 1);
    assert_eq!(stats.refused_host.load(SeqCst), 1);
    assert_eq!(request.budget().used(), 5);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_not_the_read_timeout_names_the_cut_on_either_clock() {
    for manual in [false, true] {
        let mut config = Config::default();
        config.budget.read_timeout_ms = 5_000;
        config.budget.deadline_ms = 1_000;
        let clock = manual.then(|| Arc::new(ManualClock::new()));
        let (engine, _transport) = engine(config, clock);
        let request = engine.begin_request(Caller::Public);
        let started = tokio::time::Instant::now();
        let err = request.operation().upstream().read(read("hang")).await;
        assert_eq!(err.unwrap_err(), FanoutError::DeadlineExceeded);
        assert_eq!(started.elapsed(), Duration::from_millis(1_000));
        assert!(request.budget().stats().balanced());
    }
}

#[tokio::test]
async fn a_cap_of_zero_refuses_without_charging() {
    let mut config = Config::default();
    config.hosts.insert(
        "up.test:81".into(),
        HostConfig {
            max_concurrent: 0,
            acquire_wait_ms: 10,
        },
    );
    let (engine, _transport) = engine(config, None);
    let request = engine.begin_request(Caller::Public);
    let err = request.operation().upstream().read(read("ok")).await;
    assert_eq!(err.unwrap_err().code(), "HOST_SATURATED");
    assert_eq!(request.budget().used(), 0);
    assert_eq!(request.budget().stats().refused_host.load(SeqCst), 1);
    assert_eq!(engine.hosts().in_flight("up.test:81"), 0);
}

#[tokio::test(start_paused = true)]
async fn each_read_takes_the_slot_of_its_own_host() {
    // `open:81` has room, `closed:82` rejects every read; a request keeps
    // its first host's entry, so the order of hosts must not matter.
    let mut config = Config::default();
    config.hosts.insert(
        "open.test:81".into(),
        HostConfig {
            max_concurrent: 4,
            acquire_wait_ms: 10,
        },
    );
    config.hosts.insert(
        "closed.test:82".into(),
        HostConfig {
            max_concurrent: 0,
            acquire_wait_ms: 10,
        },
    );
    let (engine, _transport) = engine(config, None);
    let at = |host: &str, path: &str| Read::get(format!("http://{host}/{path}").parse().unwrap());
    for order in [
        ["open.test:81", "closed.test:82"],
        ["closed.test:82", "open.test:81"],
    ] {
        let request = engine.begin_request(Caller::Public);
        let op = request.operation();
        let upstream = op.upstream();
        for (i, host) in order.iter().chain(order.iter()).enumerate() {
            let result = upstream.read(at(host, &format!("{i}/ok"))).await;
            match *host {
                "open.test:81" => assert!(result.is_ok(), "{order:?}, read {i}"),
                _ => match result {
                    Err(FanoutError::HostSaturated { host, .. }) => {
                        assert_eq!(host, "closed.test:82", "{order:?}, read {i}")
                    }
                    other => panic!("{order:?}, read {i}: {other:?}"),
                },
            }
        }
        let stats = request.budget().stats();
        assert_eq!(stats.issued.load(SeqCst), 2, "{order:?}");
        assert_eq!(stats.refused_host.load(SeqCst), 2, "{order:?}");
    }
}
