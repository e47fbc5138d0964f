//! CLAIM on a real `redis-server`: its deadline on Redis's clock, the
//! cap never passed, the fair share when busy, the edges, and what Redis
//! holds for a replica while a claim is in flight.

use super::*;

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
    let deadline = || backend.clocks().deadline(&key, backend.local_deadline());
    assert_eq!(deadline(), 0, "no deadline before Redis answered");
    let caps = caps(&config(&redis), 4);
    drop(caps.acquire(HOST, Duration::from_secs(1)).await.unwrap());
    let backend = &caps.backend;
    for _ in 0..20 {
        let before = redis_time_us(&redis).await;
        let deadline = backend.clocks().deadline(&key, backend.local_deadline());
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
    caps.backend.clocks().observe(Some(&key), now - 10_000_000);
    assert!(
        caps.backend
            .clocks()
            .deadline(&key, caps.backend.local_deadline())
            < now
    );
    let slot = caps.acquire(HOST, Duration::from_secs(1)).await.unwrap();
    assert!(held(&redis, &key).await >= 1);
    let deadline = caps
        .backend
        .clocks()
        .deadline(&key, caps.backend.local_deadline());
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
        let field = redis.command(&["HGET", &key, pool.holder()]).await;
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
    // and before it is answered four more reads take slots of the 5: Redis
    // holds every write (the claim's script) until they have.
    {
        let paused = redis.command(&["CLIENT", "PAUSE", "5000", "WRITE"]).await;
        assert!(paused.is_some(), "CLIENT PAUSE");
        let claim = pool.claim();
        tokio::pin!(claim);
        assert!(futures::poll!(claim.as_mut()).is_pending());
        slots.extend((0..4).map(|_| pool.take().expect("within the allowance")));
        assert!(redis.command(&["CLIENT", "UNPAUSE"]).await.is_some());
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
    // An allowance is set only by a claim that succeeded: the slot is of
    // the share, not the fallback (whose slots count in use too).
    let (allowed, in_use) = caps.held(HOST);
    assert_eq!(in_use, 1);
    assert!(allowed >= 1, "a slot of the share, not the fallback");
    drop(slot);
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
