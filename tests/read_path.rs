//! The read path's own synchronisation: the host caps' slots on every path,
//! and the read's timer on tokio's (paused) clock — the engine's one clock.
use fanout_budget::config::HostConfig;
use fanout_budget::{
    error::HostRefusal,
    inbound::Caller,
    read::{HostLimiter, HostSlot, LocalHostCaps},
    Config, Read, ReadError,
};
use fanout_testkit::scripted::{engine, read};
use futures::poll;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

/// Caps for host `h:1` alone.
fn cap(max_concurrent: u32, acquire_wait_ms: u64) -> LocalHostCaps {
    let config = HostConfig::default()
        .max_concurrent(max_concurrent)
        .acquire_wait_ms(acquire_wait_ms);
    LocalHostCaps::new([("h:1".to_string(), config)].into())
}

const LONG: Duration = Duration::from_secs(5);

#[tokio::test(start_paused = true)]
async fn a_cap_counts_and_releases_its_slots() {
    let caps = cap(2, 50);
    let unlimited: Vec<HostSlot> =
        futures::future::try_join_all((0..3).map(|_| caps.acquire("u:1", LONG)))
            .await
            .expect("a host without a table is unlimited");
    assert_eq!(caps.in_flight("u:1"), 3);
    drop(unlimited);
    assert_eq!(caps.in_flight("u:1"), 0);

    let a = caps.acquire("h:1", LONG).await.expect("a free slot");
    let b = caps.acquire("h:1", LONG).await.expect("a free slot");
    assert!(caps.acquire("h:1", LONG).await.is_err(), "at the cap");
    assert_eq!(caps.in_flight("h:1"), 2);
    drop(a);
    let c = caps
        .acquire("h:1", LONG)
        .await
        .expect("a released slot is free");
    drop((b, c));
    assert_eq!(caps.in_flight("h:1"), 0);

    let err = cap(0, 50).acquire("h:1", LONG).await.unwrap_err();
    assert_eq!(err, HostRefusal::Saturated { max_concurrent: 0 });
}

#[tokio::test(start_paused = true)]
async fn a_waiting_slot_gets_a_released_one_times_out_or_is_cancelled_without_a_leak() {
    let one = cap(1, 50);
    let held = one.acquire("h:1", LONG).await.unwrap();
    // Released while waiting: the waiter gets it.
    let mut waiting = Box::pin(one.acquire("h:1", LONG));
    assert!(poll!(waiting.as_mut()).is_pending());
    drop(held);
    let held = waiting.await.expect("the released slot");
    assert_eq!(one.in_flight("h:1"), 1);
    // Not released: refused after min(acquire_wait, time left).
    let started = tokio::time::Instant::now();
    assert!(one.acquire("h:1", Duration::from_millis(20)).await.is_err());
    assert_eq!(started.elapsed(), Duration::from_millis(20));
    let started = tokio::time::Instant::now();
    assert!(one.acquire("h:1", LONG).await.is_err());
    assert_eq!(started.elapsed(), Duration::from_millis(50));
    // Cancelled while waiting: no permit is taken.
    let mut waiting = Box::pin(one.acquire("h:1", LONG));
    assert!(poll!(waiting.as_mut()).is_pending());
    drop(waiting);
    drop(held);
    assert_eq!(one.in_flight("h:1"), 0);
    let again = one
        .acquire("h:1", LONG)
        .await
        .expect("the permit came back");
    assert!(
        one.acquire("h:1", Duration::ZERO).await.is_err(),
        "and only one"
    );
    drop(again);
}

#[tokio::test]
async fn a_joined_slot_releases_both_parts() {
    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, SeqCst);
        }
    }
    let one = cap(1, 50);
    let released = Arc::new(AtomicBool::new(false));
    let local = one.acquire("h:1", LONG).await.unwrap();
    let slot = local.join(HostSlot::new(Flag(released.clone())));
    assert_eq!(one.in_flight("h:1"), 1);
    drop(slot);
    assert_eq!(one.in_flight("h:1"), 0);
    assert!(released.load(SeqCst));
    assert!(one.acquire("h:1", LONG).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn every_outcome_releases_the_host_slot_and_balances_the_counters() {
    let mut config = Config::default();
    config.budget.read_timeout_ms = 300;
    config.hosts.insert(
        "up.test:81".into(),
        HostConfig::default().max_concurrent(1).acquire_wait_ms(10),
    );
    let (engine, transport) = engine(config);
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
    let stats = request.budget().counts();
    assert!(stats.balanced(), "{stats:?}");
    assert_eq!(stats.issued, 5);
    assert_eq!(stats.cancelled, 1);
    assert_eq!(stats.refused_host, 1);
    assert_eq!(request.budget().used(), 5);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_not_the_read_timeout_names_the_cut() {
    let mut config = Config::default();
    config.budget.read_timeout_ms = 5_000;
    config.budget.deadline_ms = 1_000;
    let (engine, _transport) = engine(config);
    let request = engine.begin_request(Caller::Public);
    let started = tokio::time::Instant::now();
    let err = request.operation().upstream().read(read("hang")).await;
    assert_eq!(err.unwrap_err(), ReadError::DeadlineExceeded);
    assert_eq!(started.elapsed(), Duration::from_millis(1_000));
    assert!(request.budget().counts().balanced());
}

#[tokio::test]
async fn a_cap_of_zero_refuses_without_charging() {
    let mut config = Config::default();
    config.hosts.insert(
        "up.test:81".into(),
        HostConfig::default().max_concurrent(0).acquire_wait_ms(10),
    );
    let (engine, _transport) = engine(config);
    let request = engine.begin_request(Caller::Public);
    let err = request.operation().upstream().read(read("ok")).await;
    assert_eq!(err.unwrap_err().code(), "HOST_SATURATED");
    assert_eq!(request.budget().used(), 0);
    assert_eq!(request.budget().counts().refused_host, 1);
    assert_eq!(engine.hosts().in_flight("up.test:81"), 0);
}

#[tokio::test(start_paused = true)]
async fn each_read_takes_the_slot_of_its_own_host() {
    // `open:81` has room, `closed:82` rejects every read; a request keeps
    // its first host's entry, so the order of hosts must not matter.
    let mut config = Config::default();
    config.hosts.insert(
        "open.test:81".into(),
        HostConfig::default().max_concurrent(4).acquire_wait_ms(10),
    );
    config.hosts.insert(
        "closed.test:82".into(),
        HostConfig::default().max_concurrent(0).acquire_wait_ms(10),
    );
    let (engine, _transport) = engine(config);
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
                    Err(ReadError::HostSaturated { host, .. }) => {
                        assert_eq!(host, "closed.test:82", "{order:?}, read {i}")
                    }
                    other => panic!("{order:?}, read {i}: {other:?}"),
                },
            }
        }
        let stats = request.budget().counts();
        assert_eq!(stats.issued, 2, "{order:?}");
        assert_eq!(stats.refused_host, 2, "{order:?}");
    }
}
