#![cfg(feature = "redis")]
//! The per-IP limit on a real `redis-server`, admissions taken a few at a
//! time: how many calls a client costs, that a client over its limit costs
//! a call per admission rather than per request, and that what one replica
//! took ahead and did not use goes back to the client's quota.
use fanout_budget::backends::redis::{RedisBackend, RedisRateLimiter};
use fanout_budget::config::RedisConfig;
use fanout_budget::inbound::{Decision, InboundLimiter};
use fanout_testkit::RedisServer;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

const CLIENT: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 7));

fn limiter(redis: &RedisServer, per_minute: u32) -> (RedisRateLimiter, RedisBackend) {
    let config = RedisConfig::default().url(redis.url()).timeout_ms(2_000);
    let backend = RedisBackend::new(&config).unwrap();
    let rpm = NonZeroU32::new(per_minute).unwrap();
    (RedisRateLimiter::new(backend.clone(), rpm), backend)
}

/// Sends `n` checks for `CLIENT`, one after another; how many were admitted.
async fn admitted(limiter: &RedisRateLimiter, n: usize) -> u64 {
    let mut admitted = 0;
    for _ in 0..n {
        if let Decision::Allow { .. } = limiter.check(CLIENT).await.unwrap() {
            admitted += 1;
        }
    }
    admitted
}

#[tokio::test]
async fn a_frequent_client_costs_a_call_per_block_of_requests() {
    let Some(redis) = RedisServer::start().await else {
        return;
    };
    let (limiter, backend) = limiter(&redis, 60_000);
    assert_eq!(admitted(&limiter, 400).await, 400);
    // From one at a time up to `lease_block` (8) a call.
    let calls = backend.calls();
    assert!(calls * 5 <= 400, "{calls} calls for 400 requests");
    assert!(calls >= 400 / 8, "{calls} calls: more than 8 a call?");
}

#[tokio::test]
async fn a_client_over_its_limit_costs_a_call_per_admission() {
    let Some(redis) = RedisServer::start().await else {
        return;
    };
    // 60 a minute: a burst of 60, then one a second.
    let (limiter, backend) = limiter(&redis, 60);
    let started = Instant::now();
    let got = admitted(&limiter, 1_000).await;
    let elapsed = started.elapsed().as_secs_f64();
    assert!(
        (60..=61 + elapsed.ceil() as u64).contains(&got),
        "{got} admitted in {elapsed:.2} s"
    );
    // The takes shrink to one as the quota runs out, and a refusal is kept
    // until the next admission is due: 1,000 requests, a few dozen calls.
    let calls = backend.calls();
    assert!(calls <= 60, "{calls} calls for 1,000 requests");
    match limiter.check(CLIENT).await.unwrap() {
        Decision::Deny { retry_after } => assert!(retry_after <= Duration::from_secs(1)),
        allowed => panic!("{allowed:?}"),
    }
}

#[tokio::test]
async fn what_a_replica_took_ahead_and_did_not_use_goes_back() {
    let Some(redis) = RedisServer::start().await else {
        return;
    };
    let (a, _) = limiter(&redis, 60);
    let (b, _) = limiter(&redis, 60);
    let started = Instant::now();
    // Replica a sees the client often: it takes admissions ahead.
    assert_eq!(admitted(&a, 20).await, 20);
    // Then the client goes to replica b only and spends the rest there. What
    // a took ahead is a's until it is back with a call.
    let on_b = admitted(&b, 200).await;
    assert!(on_b < 40, "b admitted {on_b} while a holds some ahead");
    // Past the second they are held, a's next call for the client gives
    // them back (the stay being the behaviour under test, not a wait for
    // an event).
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let on_a = admitted(&a, 1).await;
    let after = admitted(&b, 200).await;
    let total = 20 + on_b + on_a + after;
    let elapsed = started.elapsed().as_secs_f64();
    // Every admission of the burst was used, none twice: the burst plus
    // what the rate added meanwhile (one a second), one either way.
    let most = 60 + elapsed.ceil() as u64 + 1;
    assert!(
        (60..=most).contains(&total),
        "{total} admitted in {elapsed:.2} s (a 20 + {on_a}, b {on_b} + {after})"
    );
}

/// Many clients once each (a scan over addresses): the state kept per
/// client goes once nothing is held for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_seen_once_are_forgotten() {
    let Some(redis) = RedisServer::start().await else {
        return;
    };
    let (limiter, _) = limiter(&redis, 60);
    let limiter = std::sync::Arc::new(limiter);
    let client = |n: u32| {
        IpAddr::V6(std::net::Ipv6Addr::from(
            0x2001_0db8_u128 << 96 | u128::from(n),
        ))
    };
    let tasks: Vec<_> = (0..8u32)
        .map(|t| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                for n in 0..1_000 {
                    limiter.check(client(t * 1_000 + n)).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert!(limiter.clients() >= 4_000, "{} kept", limiter.clients());
    // Past what was taken ahead for them (a second) and the hold after it,
    // one client's checks run the sweep: it comes after at most 4,096
    // checks or twice the clients kept, whichever is more.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    admitted(&limiter, 2 * 8_000 + 4_096).await;
    assert!(limiter.clients() <= 1, "{} kept", limiter.clients());
}

/// A hung Redis (SIGSTOP): requests of one client queue behind the one call
/// in flight for it, but only that call waits out the timeout — the ones
/// behind it find the breaker open and fail at once, so the queue is one
/// timeout long, not one per request. Resumed, the client is served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_redis_costs_one_client_one_timeout_not_one_per_request() {
    let Some(redis) = RedisServer::start().await else {
        return;
    };
    let config = RedisConfig::default()
        .url(redis.url())
        .timeout_ms(300)
        .backoff_ms(100);
    let backend = RedisBackend::new(&config).unwrap();
    let limiter = std::sync::Arc::new(RedisRateLimiter::new(
        backend.clone(),
        NonZeroU32::new(60).unwrap(),
    ));
    // Connected, the script loaded, nothing taken ahead (60 a minute: a
    // take of one while few requests came).
    assert!(limiter.check(CLIENT).await.is_ok());
    redis.signal("STOP");
    let started = Instant::now();
    let checks: Vec<_> = (0..20)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let result = limiter
                    .check(IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 8)))
                    .await;
                (result.is_err(), started.elapsed())
            })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    for check in checks {
        let (failed, took) = check.await.unwrap();
        assert!(failed, "no answer from a stopped Redis");
        slowest = slowest.max(took);
    }
    redis.signal("CONT");
    eprintln!(
        "20 checks of one client on a hung Redis (timeout 300 ms): all failed within {slowest:?}"
    );
    assert!(
        slowest < Duration::from_millis(1_500),
        "{slowest:?}: the queue waited a timeout per request"
    );
    fanout_testkit::until("served again", Duration::from_secs(10), async || {
        limiter.check(CLIENT).await.is_ok()
    })
    .await;
}
