//! The pools on a real `redis-server`: reads served from the share without
//! a round trip, two busy replicas sharing a cap, spare given back, and a
//! read that joins another leaving the queues.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_take_slots_of_the_share_without_a_round_trip() {
    let Some(redis) = RedisServer::start().await else {
        return;
    };
    let caps = caps(&config(&redis), 64);
    let key = caps.backend.key("shares", HOST);
    let first = caps.acquire(HOST, Duration::from_secs(1)).await.unwrap();
    let calls = caps.backend.calls();
    // The first claim got the demand and the block (8): 8 more reads
    // start at once, without a call.
    let more: Vec<_> =
        futures::future::join_all((0..8).map(|_| caps.acquire(HOST, Duration::from_secs(1))))
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
    assert_eq!(caps.backend.calls(), calls, "no round trip for slots held");
    assert_eq!(caps.held(HOST), (9, 9));
    assert!(held(&redis, &key).await >= 9);
    drop((first, more));
    // Idle, the share goes back within two refreshes: in Redis, and here
    // once the claim's answer is applied (Redis holds 0 a moment before).
    fanout_testkit::until("given back", Duration::from_secs(5), async || {
        held(&redis, &key).await == 0 && caps.held(HOST) == (0, 0)
    })
    .await;
    assert_eq!(held(&redis, &key).await, 0);
}

/// 64 reads at a time, each 1 ms, for a second, on one replica: none is
/// refused (the cap, 256, is never near), and they cost a claim now and
/// then, not a round trip each (per-read leases made two).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churning_reads_cost_a_claim_now_and_then() {
    let Some(redis) = RedisServer::start().await else {
        return;
    };
    let mut config = config(&redis);
    config.timeout_ms = 100;
    let host = HostConfig {
        max_concurrent: 256,
        acquire_wait_ms: 50,
        ..Default::default()
    };
    let hosts = BTreeMap::from([(HOST.to_string(), host)]);
    let caps = Arc::new(RedisHostCaps::new(
        hosts,
        RedisBackend::new(&config).unwrap(),
    ));
    let stop = Instant::now() + Duration::from_secs(1);
    let calls = caps.backend.calls();
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let caps = caps.clone();
            tokio::spawn(async move {
                let mut reads = 0u64;
                while Instant::now() < stop {
                    let slot = caps.acquire(HOST, Duration::from_secs(1)).await;
                    let slot = slot.expect("a slot: the cap is far");
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    drop(slot);
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    let mut reads = 0;
    for task in tasks {
        reads += task.await.unwrap();
    }
    let calls = caps.backend.calls() - calls;
    eprintln!("{reads} reads, {calls} Redis calls");
    assert!(reads >= 1_000, "{reads} reads");
    assert!(calls * 100 < reads, "{calls} calls for {reads} reads");
}

/// Two replicas, each with twice the cap's worth of readers: the cap holds
/// across both at every moment, and neither starves (each is served a fair
/// part, though the other holds slots it could reuse locally).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contended_cap_holds_and_is_shared() {
    let Some((per_replica, peak)) = two_busy_replicas(4, 8, 2_000, Duration::ZERO).await else {
        return;
    };
    let total: u64 = per_replica.iter().sum();
    assert!(peak <= 4, "{peak} in flight, cap 4");
    // At most 800 in the second; a quarter of that on a loaded machine is
    // plenty to say the cap is served, not stalled.
    assert!(total >= 100, "{total} reads in a second at 4 × 5 ms");
    for reads in per_replica {
        assert!(reads * 4 >= total, "starved: {per_replica:?}");
    }
}

/// Two replicas with `readers` each on a host capped at `cap`, reading 5 ms
/// at a time for a second after `warm_up`: reads per replica in that second,
/// and the most in flight at once (across both, the whole run); `None`
/// without `redis-server`.
async fn two_busy_replicas(
    cap: u32,
    readers: usize,
    acquire_wait_ms: u64,
    warm_up: Duration,
) -> Option<([u64; 2], u32)> {
    let redis = RedisServer::start().await?;
    let host = HostConfig {
        max_concurrent: cap,
        acquire_wait_ms,
        ..Default::default()
    };
    let hosts = BTreeMap::from([(HOST.to_string(), host)]);
    let replicas: Vec<_> = (0..2)
        .map(|_| {
            let backend = RedisBackend::new(&config(&redis)).unwrap();
            Arc::new(RedisHostCaps::new(hosts.clone(), backend))
        })
        .collect();
    let in_flight = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let peak = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let warm = Instant::now() + warm_up;
    let stop = warm + Duration::from_secs(1);
    let mut tasks = Vec::new();
    for (r, caps) in replicas.iter().enumerate() {
        for _ in 0..readers {
            let (caps, in_flight, peak) = (caps.clone(), in_flight.clone(), peak.clone());
            tasks.push(tokio::spawn(async move {
                let mut reads = 0u64;
                while Instant::now() < stop {
                    let Ok(slot) = caps.acquire(HOST, Duration::from_secs(5)).await else {
                        continue;
                    };
                    let now = in_flight.fetch_add(1, SeqCst) + 1;
                    peak.fetch_max(now, SeqCst);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    in_flight.fetch_sub(1, SeqCst);
                    drop(slot);
                    if Instant::now() > warm {
                        reads += 1;
                    }
                }
                (r, reads)
            }));
        }
    }
    let mut per_replica = [0u64; 2];
    for task in tasks {
        let (r, reads) = task.await.unwrap();
        per_replica[r] += reads;
    }
    let peak = peak.load(SeqCst);
    eprintln!("reads per replica {per_replica:?}, peak in flight {peak}");
    Some((per_replica, peak))
}

/// Two replicas, each with readers wanting a cap of one all the time: the
/// host keeps being read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cap_of_one_between_two_busy_replicas_keeps_serving() {
    let reads = cap_of_one_between_two_busy_replicas().await;
    // One at a time, 5 ms each: about 160 in that second here; a starved
    // cap served none.
    assert!(
        reads.iter().sum::<u64>() >= 20,
        "{reads:?} reads in a second after warming up"
    );
}

/// The same, each replica served a fair part: busy, the share is rounded
/// down and the odd slot goes to the replica short the longest, so it turns
/// round (at the latest at the holder's next refresh) instead of staying
/// with whoever holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cap_of_one_between_two_busy_replicas_is_shared() {
    let reads = cap_of_one_between_two_busy_replicas().await;
    let total: u64 = reads.iter().sum();
    for r in reads {
        assert!(r * 4 >= total, "starved: {reads:?}");
    }
}

/// Reads per replica in a second (after 300 ms of warming up), two
/// replicas with two readers each on a host capped at one.
async fn cap_of_one_between_two_busy_replicas() -> [u64; 2] {
    let Some((reads, peak)) = two_busy_replicas(1, 2, 200, Duration::from_millis(300)).await else {
        return [100, 100];
    };
    assert_eq!(peak, 1, "cap 1");
    reads
}

/// Redis restarted (or flushed, or evicting) between two claims of a
/// replica: nothing failed, so the replica's allowance is still valid
/// and it goes on taking from it, while the others find the host's hash
/// gone and are granted the whole cap.
///
/// Ignored: it fails, by design. A share is handed out without a round
/// trip, so data lost on Redis is noticed at the replica's next call (a
/// claim at the latest `refresh_ms` later, here set long so the test is
/// deterministic): until then the cap is exceeded by what the replica had
/// in flight and what it takes. Only a round trip per read would close it;
/// The book (book/src/replicas.md) states the bound.
#[tokio::test]
#[ignore = "design: data lost on Redis is noticed at the next claim"]
async fn a_restarted_redis_between_claims_lets_no_replica_pass_the_cap() {
    let Some(mut redis) = RedisServer::start().await else {
        return;
    };
    let config = RedisConfig {
        refresh_ms: 9_000,
        ..config(&redis)
    };
    let (a, b) = (caps(&config, 4), caps(&config, 4));
    let wait = Duration::from_secs(1);
    let mut held_by_a = vec![a.acquire(HOST, wait).await.unwrap()];
    // Demand 1 and half the room of 3: an allowance of 2.
    assert_eq!(a.held(HOST), (2, 1));
    redis.kill();
    redis.restart().await;
    let held_by_b: Vec<_> = futures::future::join_all((0..4).map(|_| b.acquire(HOST, wait)))
        .await
        .into_iter()
        .filter_map(Result::ok)
        .collect();
    held_by_a.extend(a.acquire(HOST, wait).await.ok());
    let in_flight = held_by_a.len() + held_by_b.len();
    assert!(in_flight <= 4, "{in_flight} in flight, cap 4");
}

/// The book's configuration table: `refresh_ms` is "how long another replica may wait for slots
/// this one holds idle". A replica holding spare learns at its refresh
/// that another is short; it must give the spare back then, not at the
/// refresh after (its claim kept the allowance as its floor, not knowing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_spare_goes_back_within_one_refresh_of_another_replica_short() {
    let Some(redis) = RedisServer::start().await else {
        return;
    };
    let config = RedisConfig {
        refresh_ms: 1_000,
        ..config(&redis)
    };
    let host = HostConfig {
        max_concurrent: 10,
        acquire_wait_ms: 5_000,
        ..Default::default()
    };
    let hosts = BTreeMap::from([(HOST.to_string(), host)]);
    let a = RedisHostCaps::new(hosts.clone(), RedisBackend::new(&config).unwrap());
    let b = Arc::new(RedisHostCaps::new(
        hosts,
        RedisBackend::new(&config).unwrap(),
    ));
    // One read on "a": it holds its demand and spare, 5 of 10.
    drop(a.acquire(HOST, Duration::from_secs(1)).await.unwrap());
    assert_eq!(a.held(HOST), (5, 0));
    // Ten reads on "b": 5 at once, the rest once "a" gives its spare back.
    let started = Instant::now();
    let reads = (0..10).map(|_| {
        let b = b.clone();
        async move {
            let slot = b.acquire(HOST, Duration::from_secs(5)).await.unwrap();
            (slot, started.elapsed())
        }
    });
    let reads = futures::future::join_all(reads).await;
    let slowest = reads.iter().map(|(_, took)| *took).max().unwrap();
    // "a"'s refresh comes within a second; one more claim of "b" after it.
    assert!(
        slowest < Duration::from_millis(1_500),
        "b waited {slowest:?} for a's idle spare (refresh_ms 1000)"
    );
    drop(reads);
}

/// On Redis (since 2026-12-03): a read that joins another request's read
/// (a host with `coalesce = true`) leaves the queues it waited in — the
/// local cap's and its pool's — so it holds no slot of either and is no
/// longer counted among the pool's waiters (the demand claims report).
///
/// Cap 4, of which another replica holds 3: this one's share is 1, taken
/// by a slot no read uses. Four requests read `/item/1`: three take a local
/// slot and wait in the pool, the fourth waits for a local slot. The slot
/// frees: one of them leads the read, the others join it. Then the other
/// replica gives its 3 back, and three new distinct reads must be sent at
/// once (the cap: 4 reads on the wire).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_joins_leaves_the_local_queue_and_the_pool() {
    use crate::{inbound::Caller, Config, Engine, ReadError};
    const CAP: u32 = 4;
    let Some(redis) = RedisServer::start().await else {
        return;
    };
    let upstream = fanout_testkit::Upstream::start().await;
    upstream.seen.hold();
    let host = upstream.host();
    let table = HostConfig {
        max_concurrent: CAP,
        acquire_wait_ms: 2_000,
        coalesce: true,
        ..HostConfig::default()
    };
    let mut settings = Config::default();
    settings.budget.read_timeout_ms = 60_000;
    settings.budget.deadline_ms = 120_000;
    settings.hosts.insert(host.clone(), table);
    let backend = RedisBackend::new(&config(&redis)).unwrap();
    let caps = Arc::new(RedisHostCaps::new(settings.hosts.clone(), backend));
    let engine = Engine::builder(settings).host_limiter(caps.clone()).build();
    let (pool, key) = (caps.pools[&host].clone(), caps.backend.key("shares", &host));
    let far = (redis_time_us(&redis).await / 1000 + 600_000).to_string();
    redis
        .command(&["HSET", &key, "other", &format!("3 3 {far}")])
        .await
        .unwrap();
    let filler = caps.acquire(&host, Duration::from_secs(1)).await.unwrap();
    assert_eq!(caps.held(&host), (1, 1), "this replica's share: 1");

    let get = |path: &str| crate::Read::get(upstream.url(path).parse().unwrap());
    let (mut requests, mut tasks) = (Vec::new(), Vec::new());
    for _ in 0..CAP {
        let request = engine.begin_request(Caller::Public);
        let (operation, read) = (request.operation(), get("/item/1"));
        let mut task = Box::pin(async move {
            let response = operation.upstream().read(read).await?;
            Ok::<_, ReadError>(response.body.clone())
        });
        assert!(futures::poll!(task.as_mut()).is_pending());
        requests.push(request);
        tasks.push(tokio::spawn(task));
    }
    assert_eq!(pool.waiting(), CAP - 1, "three wait in the pool");
    assert_eq!(caps.in_flight(&host), u64::from(CAP), "one waits locally");
    drop(filler);
    let joined = || -> u64 { requests.iter().map(|r| r.budget().counts().coalesced).sum() };
    fanout_testkit::until(
        "one read sent, three joined",
        Duration::from_secs(30),
        async || upstream.requests() == 1 && joined() == u64::from(CAP) - 1,
    )
    .await;
    let waiting = pool.waiting();
    let (_, in_use) = caps.held(&host);
    let local = caps.in_flight(&host);

    // The other replica goes; three new distinct reads.
    redis.command(&["HDEL", &key, "other"]).await.unwrap();
    let fresh: Vec<_> = (2..=u64::from(CAP))
        .map(|i| {
            let request = engine.begin_request(Caller::Public);
            let (operation, read) = (request.operation(), get(&format!("/item/{i}")));
            let task =
                tokio::spawn(async move { operation.upstream().read(read).await.map(|_| ()) });
            (request, task)
        })
        .collect();
    fanout_testkit::until(
        "the new reads sent, or ended",
        Duration::from_secs(30),
        async || {
            upstream.seen.in_flight() == u64::from(CAP)
                || fresh.iter().all(|(_, t)| t.is_finished())
        },
    )
    .await;
    let on_the_wire = upstream.seen.in_flight();
    let refused = fresh.iter().filter(|(_, t)| t.is_finished()).count();
    println!(
        "Redis, cap {CAP}: {refused} of {} new reads refused while the upstream had {on_the_wire} reads in flight",
        fresh.len()
    );
    assert_eq!(
        (waiting, in_use, local, refused, on_the_wire),
        (0, 1, 1, 0, u64::from(CAP)),
        "(joiners waiting in the pool, pool slots in use, local slots, new reads refused, reads on the wire)"
    );
    upstream.seen.release();
    for task in tasks {
        task.await.unwrap().expect("every /item/1 read answered");
    }
    for (_, task) in fresh {
        task.await.unwrap().expect("every new read answered");
    }
    assert_eq!(caps.in_flight(&host), 0);
}

/// Redis down (`"open"`): reads waiting for the fallback share are served
/// in the order they came, as a semaphore serves them — a slot coming back
/// goes to the first in line, not to a read that arrives just then or to
/// whichever waiter runs first. The slot still in use from before the
/// outage counts against the share. (One thread: each waiter is in line
/// before the next starts, and nothing runs between a slot coming back and
/// the newcomer's first poll.)
#[tokio::test]
async fn fallback_waiters_are_served_in_order() {
    use futures::FutureExt as _;
    let Some(mut redis) = RedisServer::start().await else {
        return;
    };
    let config = RedisConfig {
        failure_mode: crate::config::FailureMode::Open,
        backoff_ms: 60_000,
        ..config(&redis)
    };
    // A share of 4; room in the local cap for every read below.
    let host = HostConfig {
        max_concurrent: 8,
        acquire_wait_ms: 20_000,
        ..Default::default()
    };
    let hosts = BTreeMap::from([(HOST.to_string(), host)]);
    let caps = Arc::new(RedisHostCaps::new(
        hosts,
        RedisBackend::new(&config).unwrap(),
    ));
    let pool = caps.pools[HOST].clone();
    let wait = Duration::from_secs(20);
    let before = caps.acquire(HOST, wait).await.unwrap();
    redis.kill();
    fanout_testkit::until("breaker open", Duration::from_secs(10), async || {
        caps.backend.is_open()
    })
    .await;
    let mut slots = vec![before];
    for _ in 0..3 {
        slots.push(caps.acquire(HOST, wait).await.unwrap());
    }
    assert_eq!(caps.held(HOST).1, 4, "the share, 4, in use");
    let mut waiters = Vec::new();
    for n in 1..=3 {
        let caps = caps.clone();
        waiters.push(tokio::spawn(async move { caps.acquire(HOST, wait).await }));
        fanout_testkit::until("in line", Duration::from_secs(10), async || {
            pool.waiting() == n
        })
        .await;
    }
    for turn in 0..3 {
        drop(slots.remove(0));
        let newcomer = caps.acquire(HOST, wait).now_or_never();
        assert!(newcomer.is_none(), "a newcomer took the slot (turn {turn})");
        let waiter = waiters.remove(0);
        fanout_testkit::until(
            "the first in line served",
            Duration::from_secs(10),
            async || waiter.is_finished(),
        )
        .await;
        slots.push(waiter.await.unwrap().expect("served in turn"));
        assert!(
            waiters.iter().all(|w| !w.is_finished()),
            "a later waiter served before the first (turn {turn})"
        );
    }
    assert_eq!(caps.held(HOST).1, 4);
}
