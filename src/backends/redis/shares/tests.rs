//! The claim script and the pools on a real `redis-server` (each test skips
//! without one).

use super::*;
use crate::backends::redis::Route;
use crate::config::RedisConfig;
use fanout_testkit::RedisServer;
use std::sync::atomic::Ordering::SeqCst;

const HOST: &str = "h:1";

async fn redis_time_us(redis: &RedisServer) -> i64 {
    let Some(redis::Value::Array(parts)) = redis.command(&["TIME"]).await else {
        panic!("TIME");
    };
    let parts: Vec<i64> = parts
        .into_iter()
        .map(|p| match p {
            redis::Value::BulkString(b) => String::from_utf8(b).unwrap().parse().unwrap(),
            other => panic!("TIME part {other:?}"),
        })
        .collect();
    parts[0] * 1_000_000 + parts[1]
}

/// Slots held on Redis for `key`: the sum of its fields' `has`.
async fn held(redis: &RedisServer, key: &str) -> u32 {
    redis.slots_held(key).await
}

fn config(redis: &RedisServer) -> RedisConfig {
    RedisConfig {
        url: redis.url(),
        timeout_ms: 1_000,
        lease_ms: 30_000,
        ..RedisConfig::default()
    }
}

/// Caps on `redis` for host `h:1` with `cap` and `config`.
fn caps(config: &RedisConfig, cap: u32) -> RedisHostCaps {
    let host = HostConfig {
        max_concurrent: cap,
        acquire_wait_ms: 200,
        ..Default::default()
    };
    let hosts = BTreeMap::from([(HOST.to_string(), host)]);
    RedisHostCaps::new(hosts, RedisBackend::new(config).unwrap())
}

/// A server and a backend on it; `None` without `redis-server`.
async fn setup() -> Option<(RedisServer, RedisBackend, String)> {
    let redis = RedisServer::start().await?;
    let backend = RedisBackend::new(&config(&redis)).unwrap();
    let key = backend.key("shares", HOST);
    Some((redis, backend, key))
}

/// Runs CLAIM for `holder`: {allowed, busy}; `deadline_us` on Redis's clock.
async fn claim(
    backend: &RedisBackend,
    key: &str,
    holder: &str,
    [in_use, wants, cap, block]: [i64; 4],
    deadline_us: i64,
) -> (i64, i64) {
    let local = Instant::now() + Duration::from_secs(5);
    let args = [in_use, wants, cap, block, 30_000, deadline_us];
    let script = Lua::new(CLAIM);
    let call = backend.script(Route::Call, local, &script, key, Some(holder), &args);
    let (allowed, busy, _now): (i64, i64, i64) = call.await.ok().expect("redis answers");
    (allowed, busy)
}

#[tokio::test]
async fn a_claim_run_after_its_deadline_does_nothing() {
    let Some((redis, backend, key)) = setup().await else {
        return;
    };
    // What a call queued behind a hung Redis finds when it finally runs:
    // its deadline, on Redis's own clock, is past.
    let now = redis_time_us(&redis).await;
    assert_eq!(
        claim(&backend, &key, "late", [0, 1, 4, 0], now - 1).await.0,
        -1
    );
    assert_eq!(held(&redis, &key).await, 0);
    let in_time = now + 60_000_000;
    assert_eq!(claim(&backend, &key, "a", [0, 1, 4, 0], in_time).await.0, 1);
    assert_eq!(claim(&backend, &key, "b", [0, 1, 4, 0], 0).await.0, 1);
    assert_eq!(held(&redis, &key).await, 2);
}

#[tokio::test]
async fn the_deadline_is_on_redis_clock_and_never_later_than_the_callers() {
    let Some((redis, backend, key)) = setup().await else {
        return;
    };
    let deadline = || backend.redis_deadline(&key, backend.local_deadline());
    assert_eq!(deadline(), 0, "no deadline before Redis answered");
    let caps = caps(&config(&redis), 4);
    drop(caps.acquire(HOST, Duration::from_secs(1)).await.unwrap());
    let backend = &caps.backend;
    for _ in 0..20 {
        let before = redis_time_us(&redis).await;
        let deadline = backend.redis_deadline(&key, backend.local_deadline());
        let after = redis_time_us(&redis).await;
        // At most `timeout_ms` after Redis's now; early by the error of
        // the learned offset only (generously: half the timeout).
        assert!(deadline <= after + 1_000_000, "{deadline} vs {after}");
        assert!(deadline >= before + 500_000, "{deadline} vs {before}");
    }
}

#[tokio::test]
async fn a_late_answer_from_a_wrong_offset_is_sent_again() {
    let Some((redis, _, key)) = setup().await else {
        return;
    };
    // As if the key's slot had moved to a master whose clock is 10 s
    // ahead of the one the offset was learned from: the deadline sent is
    // long past on the new clock, so the script answers "late"; the
    // answer arrives in time, so the claim is sent once more, corrected.
    let caps = caps(&config(&redis), 4);
    let now = redis_time_us(&redis).await;
    caps.backend.observe(Some(&key), now - 10_000_000);
    assert!(
        caps.backend
            .redis_deadline(&key, caps.backend.local_deadline())
            < now
    );
    let slot = caps.acquire(HOST, Duration::from_secs(1)).await.unwrap();
    assert!(held(&redis, &key).await >= 1);
    let deadline = caps
        .backend
        .redis_deadline(&key, caps.backend.local_deadline());
    assert!(deadline > now, "the offset was corrected");
    drop(slot);
}

#[tokio::test]
async fn claims_never_allow_more_than_the_cap_and_share_it_fairly() {
    let Some((redis, backend, key)) = setup().await else {
        return;
    };
    // Alone: its demand, plus spare (at most the block, at most half the
    // room left).
    assert_eq!(claim(&backend, &key, "a", [0, 1, 10, 8], 0).await, (5, 0));
    assert_eq!(held(&redis, &key).await, 5);
    // A second replica finds the other half, less its own spare's half.
    assert_eq!(claim(&backend, &key, "b", [0, 1, 10, 8], 0).await, (3, 0));
    assert_eq!(held(&redis, &key).await, 8);
    // Demand beyond what is free: only what is free, busy.
    assert_eq!(claim(&backend, &key, "b", [3, 9, 10, 8], 0).await, (5, 1));
    assert_eq!(held(&redis, &key).await, 10);
    // "a" now learns that "b" is short: its share of 10 between demands
    // 1 and 9 is its own 1, no spare; it still holds what it has in use.
    assert_eq!(claim(&backend, &key, "a", [4, 1, 10, 8], 0).await, (1, 1));
    assert_eq!(held(&redis, &key).await, 4 + 5);
    assert_eq!(claim(&backend, &key, "a", [1, 1, 10, 8], 0).await, (1, 1));
    // Now "b" gets its demand: 9 of the 10, which fits (no spare: no room).
    assert_eq!(claim(&backend, &key, "b", [5, 9, 10, 8], 0).await, (9, 0));
    assert_eq!(held(&redis, &key).await, 10);
    // Even split when both want everything.
    assert_eq!(claim(&backend, &key, "a", [1, 10, 10, 8], 0).await, (1, 1));
    assert_eq!(claim(&backend, &key, "b", [9, 10, 10, 8], 0).await, (5, 1));
    // "b" keeps its 9 in flight until they end; then "a" gets its half.
    assert_eq!(held(&redis, &key).await, 1 + 9);
    assert_eq!(claim(&backend, &key, "b", [5, 10, 10, 8], 0).await, (5, 1));
    assert_eq!(claim(&backend, &key, "a", [1, 10, 10, 8], 0).await, (5, 1));
    assert_eq!(held(&redis, &key).await, 10);
    // Giving everything back (no demand, no spare asked) removes the
    // field; run twice, the same.
    assert_eq!(claim(&backend, &key, "a", [0, 0, 10, 0], 0).await, (0, 1));
    for _ in 0..2 {
        assert_eq!(claim(&backend, &key, "b", [0, 0, 10, 0], 0).await, (0, 0));
        assert_eq!(claim(&backend, &key, "a", [0, 0, 10, 0], 0).await, (0, 0));
    }
    assert_eq!(
        redis.command(&["EXISTS", &key]).await,
        Some(redis::Value::Int(0))
    );
}

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
    // Idle, the share goes back within two refreshes.
    fanout_testkit::until("given back", Duration::from_secs(5), async || {
        held(&redis, &key).await == 0
    })
    .await;
    assert_eq!(caps.held(HOST), (0, 0));
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
    assert!(total >= 200, "{total} reads in a second at 4 × 5 ms");
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

/// The odd slot of a busy cap turns round even when the replica given it is
/// still short: cap 3, two replicas wanting 4 each, claiming in turn.
#[tokio::test]
async fn the_odd_slot_turns_round_between_replicas_still_short() {
    let Some((_redis, backend, key)) = setup().await else {
        return;
    };
    let mut odd = [0; 2];
    for round in 0..6 {
        // Each reports what it has in use (its last answer) and wants 4.
        for (i, holder) in ["a", "b"].into_iter().enumerate() {
            let (allowed, busy) = claim(&backend, &key, holder, [0, 4, 3, 0], 0).await;
            if round > 0 {
                assert_eq!(busy, 1);
                assert!((1..=2).contains(&allowed), "{holder}: {allowed}");
                odd[i] += u32::from(allowed == 2);
            }
        }
    }
    assert!(odd[0] >= 2 && odd[1] >= 2, "the odd slot went {odd:?}");
}

/// Water-filling when the demands just exceed the cap: a cap of one and
/// two replicas wanting one each, or a cap of two and three. The slot
/// free on Redis goes to whoever claims it; nobody is told its fair share
/// is zero while the cap has room.
#[tokio::test]
async fn a_small_cap_wanted_by_more_replicas_is_not_starved() {
    let Some((redis, backend, key)) = setup().await else {
        return;
    };
    // Cap 1: "a" reads alone, "b" comes and is short.
    assert_eq!(claim(&backend, &key, "a", [0, 1, 1, 0], 0).await.0, 1);
    assert_eq!(claim(&backend, &key, "b", [0, 1, 1, 0], 0).await, (0, 1));
    // "a"'s read ends and its next read asks: the slot is free on Redis
    // (a's own, nobody else holds it), so someone must get it.
    let a = claim(&backend, &key, "a", [0, 1, 1, 0], 0).await.0;
    let b = claim(&backend, &key, "b", [0, 1, 1, 0], 0).await.0;
    assert_eq!(a + b, 1, "cap 1, wanted by a and b: a {a}, b {b}");
    assert_eq!(held(&redis, &key).await, 1);

    // Cap 2, three replicas wanting one each.
    let key = backend.key("shares", "h:2");
    for holder in ["a", "b"] {
        assert_eq!(claim(&backend, &key, holder, [0, 1, 2, 0], 0).await.0, 1);
    }
    assert_eq!(claim(&backend, &key, "c", [0, 1, 2, 0], 0).await, (0, 1));
    // "a" and "b" finish a read each and ask again.
    let granted = [
        claim(&backend, &key, "a", [0, 1, 2, 0], 0).await.0,
        claim(&backend, &key, "b", [0, 1, 2, 0], 0).await.0,
        claim(&backend, &key, "c", [0, 1, 2, 0], 0).await.0,
    ];
    assert_eq!(granted.iter().sum::<i64>(), 2, "cap 2: {granted:?}");
    assert_eq!(held(&redis, &key).await, 2);
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

/// Reads that take slots while a claim is in flight (up to the allowance
/// held then) may leave the claim's answer below what is in use; the next
/// claim must still report at least what is in use, or Redis holds less
/// than the replica has in flight and another replica is given the rest.
#[tokio::test]
async fn redis_always_holds_what_a_replica_has_in_use() {
    let Some(redis) = RedisServer::start().await else {
        return;
    };
    let caps = caps(&config(&redis), 10);
    let key = caps.backend.key("shares", HOST);
    let pool = caps.pools[HOST].clone();
    let far = (redis_time_us(&redis).await / 1000 + 600_000).to_string();
    let field = |has: u32, wants: u32| format!("{has} {wants} {far}");
    let ours = async || -> u32 {
        let field = redis.command(&["HGET", &key, &pool.holder]).await;
        match field {
            Some(redis::Value::BulkString(v)) => String::from_utf8(v).unwrap()[..]
                .split(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap(),
            other => panic!("our field: {other:?}"),
        }
    };
    // Alone, one read waiting: its demand and spare (half the room, 4).
    let waiting = Waiting::new(&pool);
    pool.claim().await.unwrap();
    drop(waiting);
    let mut slots = vec![pool.take().unwrap()];
    assert_eq!(caps.held(HOST), (5, 1));
    // Another replica "b" holds 3.
    redis
        .command(&["HSET", &key, "b", &field(3, 3)])
        .await
        .unwrap();
    // A refresh claim goes out (demand 1, keeping the allowance of 5),
    // and before it is answered four more reads take slots of the 5.
    {
        let claim = pool.claim();
        tokio::pin!(claim);
        assert!(futures::poll!(claim.as_mut()).is_pending());
        slots.extend((0..4).map(|_| pool.take().expect("within the allowance")));
        claim.await.unwrap();
    }
    // Answer: demand 1 and half the room of 7: 4 — but 5 are in use.
    assert_eq!(caps.held(HOST), (4, 5));
    assert!(ours().await >= 5);
    // A third replica "c" is short: the next claim is busy.
    redis
        .command(&["HSET", &key, "c", &field(0, 9)])
        .await
        .unwrap();
    pool.claim().await.unwrap();
    let in_use = caps.held(HOST).1;
    assert_eq!(in_use, 5);
    assert!(
        ours().await >= in_use,
        "Redis holds {} for a replica with {in_use} in flight",
        ours().await
    );
    // What the other replicas could claim then stays within the cap.
    let c = claim(&caps.backend, &key, "c", [0, 9, 10, 8], 0).await.0 as u32;
    assert!(in_use + 3 + c <= 10, "{in_use} + 3 + {c} in flight, cap 10");
    drop(slots);
}

/// A rolling upgrade: replicas of the version before keep per-read leases
/// in a sorted set at `<prefix>:host:<HOST:PORT>` on the same Redis. This
/// version's shares must not collide with it: a `WRONGTYPE` would fail
/// every claim and open the breaker for the per-IP limit too (with
/// `failure_mode = "closed"`, every request refused until the old
/// replicas are gone).
#[tokio::test]
async fn shares_do_not_collide_with_the_leases_of_the_version_before() {
    let Some(redis) = RedisServer::start().await else {
        return;
    };
    let caps = caps(&config(&redis), 4);
    let old_key = caps.backend.key("host", HOST);
    let expires = (redis_time_us(&redis).await / 1000 + 30_000).to_string();
    redis
        .command(&["ZADD", &old_key, &expires, "old-replica-lease"])
        .await
        .unwrap();
    let slot = caps.acquire(HOST, Duration::from_secs(1)).await.unwrap();
    assert_eq!(caps.backend.failed_calls(), 0, "no call failed");
    assert!(!caps.backend.is_open());
    assert_eq!(
        caps.held(HOST).1,
        1,
        "a slot of the share, not the fallback"
    );
    drop(slot);
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
/// README ("Running several replicas") states the bound.
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

/// README: `refresh_ms` is "how long another replica may wait for slots
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

/// Edge values: a cap of 0, the largest cap and demand (u32), and fields
/// CLAIM did not write (garbage, negative, or with an exponent, as Lua
/// would print a number past 14 digits) — dropped, never counted as room.
#[tokio::test]
async fn claims_at_the_edges() {
    let Some((redis, backend, key)) = setup().await else {
        return;
    };
    assert_eq!(claim(&backend, &key, "a", [0, 1, 0, 8], 0).await, (0, 1));
    let max = i64::from(u32::MAX);
    let key = backend.key("shares", "h:max");
    assert_eq!(
        claim(&backend, &key, "a", [0, max, max, max], 0).await,
        (max, 0)
    );
    assert_eq!(held(&redis, &key).await, u32::MAX);
    assert_eq!(
        claim(&backend, &key, "b", [0, max, max, max], 0).await,
        (0, 1)
    );
    // Busy: half each, rounded down; the odd slot goes to "b", short since
    // its claim ("a" was not).
    assert_eq!(
        claim(&backend, &key, "a", [max, max, max, max], 0).await.0,
        max / 2
    );
    let key = backend.key("shares", "h:garbage");
    for (holder, value) in [
        ("x", "junk"),
        ("y", "-3 1 99999999999999"),
        ("z", "3 1 1e+15"),
    ] {
        redis.command(&["HSET", &key, holder, value]).await.unwrap();
    }
    assert_eq!(claim(&backend, &key, "a", [0, 4, 4, 0], 0).await, (4, 0));
    assert_eq!(
        redis.command(&["HLEN", &key]).await,
        Some(redis::Value::Int(1))
    );
}

/// Issue 23, item 4, on Redis: a read that joins another request's read
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
    assert_eq!(pool.lock().waiting, CAP - 1, "three wait in the pool");
    assert_eq!(caps.in_flight(&host), u64::from(CAP), "one waits locally");
    drop(filler);
    let joined = || -> u64 { requests.iter().map(|r| r.budget().counts().coalesced).sum() };
    fanout_testkit::until(
        "one read sent, three joined",
        Duration::from_secs(30),
        async || upstream.requests() == 1 && joined() == u64::from(CAP) - 1,
    )
    .await;
    let waiting = pool.lock().waiting;
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
