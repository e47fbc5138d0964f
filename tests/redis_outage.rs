#![cfg(feature = "redis")]
//! The Redis host caps through an outage, on a real `redis-server`: a hung
//! Redis (SIGSTOP, SIGCONT) leaves no slot behind; a killed one costs no
//! timeout per call while the breaker is open, and the backend recovers by
//! itself once it is back — a restarted one caps again within `backoff_ms`
//! plus one claim; a cancelled acquire leaves nothing held. A host's fallback
//! share counts the slots a replica holds, whether Redis died or hung.
use fanout_budget::backends::redis::{RedisBackend, RedisHostCaps};
use fanout_budget::config::{FailureMode, HostConfig, RedisConfig};
use fanout_budget::read::HostLimiter;
use fanout_testkit::{until, RedisServer};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

const HOST: &str = "upstream.test:443";
const KEY: &str = "fanout:shares:upstream.test:443";
const CAP: u32 = 4;
/// Far longer than any test: slots left behind would show.
const LEASE_MS: u64 = 30_000;

struct Replica {
    caps: Arc<RedisHostCaps>,
    backend: RedisBackend,
}

fn replicas(redis: &RedisServer, n: usize, mode: FailureMode, timeout_ms: u64) -> Vec<Replica> {
    let config = RedisConfig::default()
        .url(redis.url())
        .failure_mode(mode)
        .timeout_ms(timeout_ms)
        .lease_ms(LEASE_MS)
        .backoff_ms(200);
    let mut hosts = BTreeMap::new();
    let host = HostConfig::default()
        .max_concurrent(CAP)
        .acquire_wait_ms(5_000);
    hosts.insert(HOST.to_string(), host);
    (0..n)
        .map(|_| {
            let backend = RedisBackend::new(&config).unwrap();
            let caps = Arc::new(RedisHostCaps::new(hosts.clone(), backend.clone()));
            Replica { caps, backend }
        })
        .collect()
}

#[derive(Default)]
struct Stats {
    ok: AtomicU64,
    saturated: AtomicU64,
    unavailable: AtomicU64,
    /// Slowest acquire started in this phase, µs.
    slowest_us: AtomicU64,
    phase: AtomicU64,
    /// Most slots one replica's workers held at once, seen as one asked
    /// for in this phase was taken: the phase in the high 32 bits, the
    /// peak in the low, so a peak of an earlier phase never lands in this
    /// one's.
    peak_held: AtomicU64,
}

impl Stats {
    fn get(counter: &AtomicU64) -> u64 {
        counter.load(SeqCst)
    }

    /// Starts a phase: the slowest acquire and the peak count only those
    /// started from now.
    fn next_phase(&self) {
        let phase = self.phase.fetch_add(1, SeqCst) + 1;
        self.slowest_us.store(0, SeqCst);
        self.peak_held.store(phase << 32, SeqCst);
    }

    /// `held` at once, seen by an acquire started in `phase`.
    fn held_in(&self, phase: u64, held: u64) {
        let _ = self.peak_held.fetch_update(SeqCst, SeqCst, |now| {
            (now >> 32 == phase && now & u64::from(u32::MAX) < held).then_some(phase << 32 | held)
        });
    }

    /// The most held at once in the current phase.
    fn peak(&self) -> u64 {
        self.peak_held.load(SeqCst) & u64::from(u32::MAX)
    }
}

/// Workers on every replica: acquire, hold 20 ms (the read), release.
struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    stats: Arc<Stats>,
}

fn load(replicas: &[Replica], workers: usize) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(Stats::default());
    let mut tasks = Vec::new();
    for replica in replicas {
        let held = Arc::new(AtomicU64::new(0));
        for _ in 0..workers {
            let (caps, stop, stats, held) = (
                replica.caps.clone(),
                stop.clone(),
                stats.clone(),
                held.clone(),
            );
            tasks.push(tokio::spawn(async move {
                while !stop.load(SeqCst) {
                    let (phase, started) = (stats.phase.load(SeqCst), Instant::now());
                    let got = caps.acquire(HOST, Duration::from_secs(30)).await;
                    if stats.phase.load(SeqCst) == phase {
                        let took = started.elapsed().as_micros() as u64;
                        stats.slowest_us.fetch_max(took, SeqCst);
                    }
                    match got {
                        Ok(slot) => {
                            stats.ok.fetch_add(1, SeqCst);
                            let now = held.fetch_add(1, SeqCst) + 1;
                            stats.held_in(phase, now);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            held.fetch_sub(1, SeqCst);
                            drop(slot);
                        }
                        Err(e) => {
                            let counter = match e.code() {
                                "HOST_SATURATED" => &stats.saturated,
                                "UNAVAILABLE" => &stats.unavailable,
                                other => panic!("unexpected {other}: {e:?}"),
                            };
                            counter.fetch_add(1, SeqCst);
                            // Pacing, so failing fast does not spin.
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                    }
                }
            }));
        }
    }
    Load { stop, tasks, stats }
}

impl Load {
    async fn stop(self) {
        self.stop.store(true, SeqCst);
        for task in self.tasks {
            tokio::time::timeout(Duration::from_secs(20), task)
                .await
                .expect("a worker stops")
                .unwrap();
        }
    }
}

/// Slots held on Redis by every replica.
async fn held(redis: &RedisServer) -> i64 {
    i64::from(redis.slots_held(KEY).await)
}

fn failed_calls(replicas: &[Replica]) -> u64 {
    replicas.iter().map(|r| r.backend.failed_calls()).sum()
}

/// Takes `CAP` slots round the replicas: all must be held on Redis (the hash
/// holds `CAP`), and one more is `HOST_SATURATED`.
async fn exactly_the_cap_is_available(redis: &RedisServer, replicas: &[Replica]) {
    let mut slots = Vec::new();
    for i in 0..CAP as usize {
        let caps = &replicas[i % replicas.len()].caps;
        slots.push(caps.acquire(HOST, Duration::from_secs(5)).await.unwrap());
    }
    assert_eq!(
        held(redis).await,
        i64::from(CAP),
        "every slot is held on Redis"
    );
    let extra = replicas[replicas.len() - 1]
        .caps
        .acquire(HOST, Duration::from_millis(100));
    assert_eq!(extra.await.unwrap_err().code(), "HOST_SATURATED");
    drop(slots);
    until("released", Duration::from_secs(5), async || {
        held(redis).await == 0
    })
    .await;
}

async fn hang(mode: FailureMode) {
    let Some(redis) = RedisServer::start().await else {
        return;
    };
    let timeout = Duration::from_millis(200);
    let replicas = replicas(&redis, 2, mode, timeout.as_millis() as u64);
    let load = load(&replicas, 8);
    let stats = load.stats.clone();
    until("warm-up", Duration::from_secs(10), async || {
        Stats::get(&stats.ok) >= 40
    })
    .await;
    assert!(held(&redis).await <= i64::from(CAP));

    redis.signal("STOP");
    let stopped = Instant::now();
    let failed = failed_calls(&replicas);
    // The acquires in flight when Redis stopped time out; both breakers open.
    until("calls timed out", Duration::from_secs(10), async || {
        failed_calls(&replicas) >= failed + u64::from(CAP)
            && replicas.iter().all(|r| r.backend.is_open())
    })
    .await;
    stats.next_phase();
    let failed = failed_calls(&replicas);
    let (ok, refused) = (Stats::get(&stats.ok), Stats::get(&stats.unavailable));
    // Open serves on the local caps, closed refuses, neither waiting on
    // Redis; meanwhile probes time out (each ~backoff + timeout).
    until(
        "served or refused during the hang",
        Duration::from_secs(10),
        async || {
            let answered = match mode {
                FailureMode::Open => Stats::get(&stats.ok) >= ok + 40,
                FailureMode::Closed => Stats::get(&stats.unavailable) >= refused + 40,
                other => unreachable!("no outage test for {other:?}"),
            };
            answered && failed_calls(&replicas) >= failed + 4
        },
    )
    .await;
    assert!(replicas.iter().all(|r| r.backend.is_open()));
    let slowest = Duration::from_micros(Stats::get(&stats.slowest_us));
    let hung_for = stopped.elapsed();
    redis.signal("CONT");
    let resumed = Instant::now();

    let recovered = until("breakers closed", Duration::from_secs(10), async || {
        replicas.iter().all(|r| !r.backend.is_open())
    })
    .await;
    let (ok, saturated) = (Stats::get(&stats.ok), Stats::get(&stats.saturated));
    until(
        "reads after recovery",
        Duration::from_secs(10),
        async || Stats::get(&stats.ok) >= ok + 40,
    )
    .await;
    assert_eq!(
        Stats::get(&stats.saturated),
        saturated,
        "HOST_SATURATED after recovery: slots left behind (held {})",
        held(&redis).await
    );
    load.stop().await;
    // Nothing in flight: no slot may be left held.
    until("nothing held", Duration::from_secs(5), async || {
        held(&redis).await == 0
    })
    .await;
    let empty = resumed.elapsed();
    exactly_the_cap_is_available(&redis, &replicas).await;
    assert!(
        resumed.elapsed() < Duration::from_millis(LEASE_MS * 2 / 3),
        "recovered only after {:?}",
        resumed.elapsed()
    );
    println!(
        "{mode:?}: hung {hung_for:?} (slowest acquire once open {slowest:?}); \
         breakers closed {recovered:?} after SIGCONT, nothing held {empty:?} after"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_redis_leaves_no_slot_behind_open() {
    hang(FailureMode::Open).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_redis_leaves_no_slot_behind_closed() {
    hang(FailureMode::Closed).await;
}

async fn killed(mode: FailureMode) {
    let Some(mut redis) = RedisServer::start().await else {
        return;
    };
    let timeout = Duration::from_millis(2_000);
    let replicas = replicas(&redis, 1, mode, timeout.as_millis() as u64);
    let replica = &replicas[0];
    let load = load(&replicas, 8);
    let stats = load.stats.clone();
    until("warm-up", Duration::from_secs(10), async || {
        Stats::get(&stats.ok) >= 20
    })
    .await;

    redis.kill();
    until("breaker open", Duration::from_secs(10), async || {
        replica.backend.is_open()
    })
    .await;
    let failed = replica.backend.failed_calls();
    stats.next_phase();
    let mut slowest = Duration::ZERO;
    for _ in 0..20 {
        let started = Instant::now();
        let got = replica.caps.acquire(HOST, Duration::from_secs(5)).await;
        let took = started.elapsed();
        slowest = slowest.max(took);
        // Far below the timeout a call to a dead Redis would wait (not a
        // fixed figure: in "open" it may queue behind the load's workers for
        // the fallback share).
        assert!(
            took < timeout / 2,
            "a call took {took:?} with Redis dead (timeout {timeout:?})"
        );
        match mode {
            FailureMode::Open => drop(got.expect("open: the local cap serves")),
            FailureMode::Closed => assert_eq!(got.unwrap_err().code(), "UNAVAILABLE"),
            other => unreachable!("no outage test for {other:?}"),
        }
    }
    // The probes keep failing (every backoff) and calls stay fast meanwhile.
    until("probes failed", Duration::from_secs(10), async || {
        replica.backend.failed_calls() >= failed + 2
    })
    .await;
    assert!(replica.backend.is_open());
    if mode == FailureMode::Open {
        let peak = stats.peak();
        // Its fallback share: half the cap, not the whole cap per replica.
        assert!(
            peak <= u64::from(CAP / 2),
            "{peak} held at once, fallback share {} of the cap {CAP}",
            CAP / 2
        );
        assert!(peak >= 1, "open: served during the outage");
    }

    redis.restart().await;
    let recovered = until("breaker closed", Duration::from_secs(10), async || {
        !replica.backend.is_open()
    })
    .await;
    let ok = Stats::get(&stats.ok);
    until(
        "reads on Redis again",
        Duration::from_secs(10),
        async || Stats::get(&stats.ok) >= ok + 20 && held(&redis).await > 0,
    )
    .await;
    load.stop().await;
    until("nothing held", Duration::from_secs(5), async || {
        held(&redis).await == 0
    })
    .await;
    exactly_the_cap_is_available(&redis, &replicas).await;
    println!(
        "{mode:?}: slowest call with Redis dead {slowest:?} (timeout {timeout:?}); \
         recovered {recovered:?} after restart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_fails_fast_and_recovers_open() {
    killed(FailureMode::Open).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_fails_fast_and_recovers_closed() {
    killed(FailureMode::Closed).await;
}

/// How Redis goes away in the fallback share's tests.
#[derive(Clone, Copy, Debug)]
enum Outage {
    /// Killed: its connections refused at once.
    Killed,
    /// Hung (SIGSTOP): its connections stay open and nothing is answered;
    /// each call waits its whole timeout, and what was sent meanwhile runs
    /// when it resumes.
    Hung,
}

impl Outage {
    fn begin(self, redis: &mut RedisServer) {
        match self {
            Outage::Killed => redis.kill(),
            Outage::Hung => redis.signal("STOP"),
        }
    }

    async fn end(self, redis: &mut RedisServer) {
        match self {
            Outage::Killed => redis.restart().await,
            Outage::Hung => redis.signal("CONT"),
        }
    }

    /// Ends the outage, then waits until Redis holds `at_least` slots by
    /// claims made since: a hung Redis still has the entries of before the
    /// outage, which would satisfy a plain count.
    async fn end_and_claimed(self, redis: &mut RedisServer, what: &str, at_least: u32) {
        self.end(redis).await;
        let back = redis.time_ms().await;
        until(what, Duration::from_secs(10), async || {
            redis.slots_claimed_since(KEY, back, LEASE_MS).await >= at_least
        })
        .await;
    }
}

/// Once the test's slots are given back, nothing is held on Redis (what a
/// hung Redis ran late included), and exactly the cap is available.
async fn released_and_whole(redis: &RedisServer, replicas: &[Replica]) {
    until("released", Duration::from_secs(5), async || {
        held(redis).await == 0
    })
    .await;
    exactly_the_cap_is_available(redis, replicas).await;
}

/// The slots a replica holds of its share on Redis when Redis goes away
/// count against its fallback share: it takes no fallback slot while half
/// the cap or more is in use, however the slots in use were granted. (The
/// fallback was counted apart: a replica could hold its Redis slots plus
/// half the cap at once, the whole cap on each of two replicas.)
async fn slots_held_count_against_the_fallback_share(outage: Outage) {
    let Some(mut redis) = RedisServer::start().await else {
        return;
    };
    let replicas = replicas(&redis, 1, FailureMode::Open, 200);
    let (caps, backend) = (&replicas[0].caps, &replicas[0].backend);
    let mut shared = Vec::new();
    for _ in 0..3 {
        shared.push(caps.acquire(HOST, Duration::from_secs(5)).await.unwrap());
    }
    assert_eq!(held(&redis).await, 3, "the three are held on Redis");
    outage.begin(&mut redis);
    // The claimer's next refresh fails: the share is void, the breaker open.
    until("breaker open", Duration::from_secs(10), async || {
        backend.is_open()
    })
    .await;
    let refused = caps.acquire(HOST, Duration::from_millis(100)).await;
    assert_eq!(
        refused.map(drop).unwrap_err().code(),
        "HOST_SATURATED",
        "{outage:?}: 3 in use of a fallback share of {}",
        CAP / 2
    );
    shared.truncate(1);
    let mut fallback = vec![caps
        .acquire(HOST, Duration::from_millis(100))
        .await
        .expect("1 in use: room for one")];
    let refused = caps.acquire(HOST, Duration::from_millis(100)).await;
    assert_eq!(refused.map(drop).unwrap_err().code(), "HOST_SATURATED");
    drop(shared);
    fallback.push(
        caps.acquire(HOST, Duration::from_millis(100))
            .await
            .expect("the Redis slot back: room for one more"),
    );
    let refused = caps.acquire(HOST, Duration::from_millis(100)).await;
    assert_eq!(refused.map(drop).unwrap_err().code(), "HOST_SATURATED");
    // Back: the two fallback slots in use are held on Redis by a claim made
    // since (with a spare it may add), and once they are given back nothing
    // is.
    let what = "the fallback slots claimed on Redis";
    outage.end_and_claimed(&mut redis, what, 2).await;
    drop(fallback);
    released_and_whole(&redis, &replicas).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_held_when_redis_dies_count_against_the_fallback_share() {
    slots_held_count_against_the_fallback_share(Outage::Killed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_held_when_redis_hangs_count_against_the_fallback_share() {
    slots_held_count_against_the_fallback_share(Outage::Hung).await;
}

/// Fallback slots still in use when Redis is back are held on it: the
/// replica's next claim reports them, so the other replicas get only the
/// rest of the cap. (They were counted nowhere: another replica got the
/// whole cap beside them.)
async fn fallback_slots_held_on_redis_once_back(outage: Outage) {
    let Some(mut redis) = RedisServer::start().await else {
        return;
    };
    let replicas = replicas(&redis, 2, FailureMode::Open, 200);
    let (a, b) = (&replicas[0], &replicas[1]);
    // A's claimer runs, and refreshes while a slot is in use: its next
    // refresh notices the outage.
    let warm = a.caps.acquire(HOST, Duration::from_secs(5)).await.unwrap();
    outage.begin(&mut redis);
    until("breaker open", Duration::from_secs(10), async || {
        a.backend.is_open()
    })
    .await;
    drop(warm);
    let mut fallback = Vec::new();
    for _ in 0..CAP / 2 {
        let slot = a.caps.acquire(HOST, Duration::from_millis(100)).await;
        fallback.push(slot.expect("open: the fallback share serves"));
    }
    // Held by a claim A made since (a hung Redis still has A's entry of
    // before the outage: a slot and a spare).
    let what = "A's fallback slots claimed on Redis";
    outage.end_and_claimed(&mut redis, what, CAP / 2).await;
    let mut taken = Vec::new();
    for _ in 0..CAP - CAP / 2 {
        let slot = b.caps.acquire(HOST, Duration::from_secs(5)).await;
        taken.push(slot.expect("B gets the rest of the cap"));
    }
    let extra = b.caps.acquire(HOST, Duration::from_millis(300)).await;
    assert_eq!(
        extra.map(drop).unwrap_err().code(),
        "HOST_SATURATED",
        "{outage:?}: A's {} and B's {} are the cap",
        CAP / 2,
        CAP - CAP / 2
    );
    drop((fallback, taken));
    released_and_whole(&redis, &replicas).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_slots_in_use_are_held_on_redis_once_it_is_back() {
    fallback_slots_held_on_redis_once_back(Outage::Killed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_slots_in_use_are_held_on_redis_once_it_resumes() {
    fallback_slots_held_on_redis_once_back(Outage::Hung).await;
}

/// After a restart the shared cap is back within one `backoff_ms` and one
/// claim: the first probe after Redis is back gets through. Redis is
/// restarted right after a probe failed, the worst moment: a whole backoff
/// before the next probe. (The connection manager used to answer that probe
/// with the reconnect the last failure had started while Redis was down, and
/// only then start another: one more backoff, 4 s instead of 2 s here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_redis_caps_again_within_one_backoff() {
    let Some(mut redis) = RedisServer::start().await else {
        return;
    };
    let backoff = Duration::from_millis(2_000);
    let config = RedisConfig::default()
        .url(redis.url())
        .failure_mode(FailureMode::Open)
        .timeout_ms(200)
        .lease_ms(LEASE_MS)
        .backoff_ms(backoff.as_millis() as u64);
    let mut hosts = BTreeMap::new();
    let host = HostConfig::default()
        .max_concurrent(CAP)
        .acquire_wait_ms(5_000);
    hosts.insert(HOST.to_string(), host);
    let backend = RedisBackend::new(&config).unwrap();
    let caps = Arc::new(RedisHostCaps::new(hosts, backend.clone()));
    let replicas = [Replica {
        caps: caps.clone(),
        backend: backend.clone(),
    }];
    let load = load(&replicas, 2);
    until("reads on Redis", Duration::from_secs(10), async || {
        held(&redis).await > 0
    })
    .await;

    redis.kill();
    until("breaker open", Duration::from_secs(10), async || {
        backend.is_open()
    })
    .await;
    let failed = backend.failed_calls();
    // Only probes fail while the breaker is open (checks skip Redis).
    until("a probe failed", backoff * 3, async || {
        backend.failed_calls() > failed
    })
    .await;
    // Timed from the failed probe, not from the restart (which takes a
    // while of its own): the next probe is one backoff after it.
    let probed = Instant::now();
    redis.restart().await;
    let restarted = probed.elapsed();
    // A claim answered again: this replica's share held on the restarted
    // Redis (which knew nothing), with an allowance.
    until(
        "a read on the shared cap again",
        Duration::from_secs(10),
        async || caps.held(HOST).0 > 0 && held(&redis).await > 0,
    )
    .await;
    let took = probed.elapsed();
    load.stop().await;
    println!(
        "shared cap back {took:?} after the failed probe (restarted after {restarted:?}, \
         backoff {backoff:?})"
    );
    // One backoff and a claim; the defect is two backoffs.
    assert!(
        took < backoff * 3 / 2,
        "the shared cap came back {took:?} after the failed probe, backoff {backoff:?}"
    );
}

/// `calls` of `command` in `INFO commandstats` (scripts' calls included).
async fn command_calls(redis: &RedisServer, command: &str) -> u64 {
    let info = match redis.command(&["INFO", "commandstats"]).await {
        Some(redis::Value::BulkString(b)) => String::from_utf8(b).unwrap(),
        Some(redis::Value::VerbatimString { text, .. }) => text,
        other => panic!("INFO: {other:?}"),
    };
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_acquire_leaves_no_slot_behind() {
    let Some(redis) = RedisServer::start().await else {
        return;
    };
    // A long timeout: the claim runs well before its deadline, so what it
    // took must be given back, not refused as late.
    let replicas = replicas(&redis, 1, FailureMode::Closed, 10_000);
    let caps = &replicas[0].caps;
    // Warm up: connected, and the script loaded (so EVALSHA runs it).
    drop(caps.acquire(HOST, Duration::from_secs(5)).await.unwrap());
    until("given back", Duration::from_secs(5), async || {
        held(&redis).await == 0
    })
    .await;
    let (recorded, removed) = (
        command_calls(&redis, "hset").await,
        command_calls(&redis, "hdel").await,
    );

    redis.signal("STOP");
    let cancelled = tokio::time::timeout(
        Duration::from_millis(100),
        caps.acquire(HOST, Duration::from_secs(5)),
    )
    .await;
    assert!(cancelled.is_err(), "the acquire waits on the stopped Redis");
    redis.signal("CONT");
    // The claim the cancelled read asked for runs and is answered; nobody
    // uses what it got, so the next refresh gives it back (long before the
    // 30 s lease would). Redis runs the give-back before the replica reads
    // its answer: both sides are waited for (a replica that claimed again
    // would hold slots here, on both, and never pass).
    until(
        "claimed, then given back",
        Duration::from_secs(5),
        async || {
            command_calls(&redis, "hset").await > recorded
                && command_calls(&redis, "hdel").await > removed
                && held(&redis).await == 0
                && caps.held(HOST) == (0, 0)
        },
    )
    .await;
    assert_eq!(held(&redis).await, 0, "nothing claimed again");
    assert!(
        !replicas[0].backend.is_open(),
        "a cancellation is no failure"
    );
}

#[test]
fn zero_redis_durations_are_refused_naming_the_key() {
    for key in ["timeout_ms", "lease_ms", "backoff_ms"] {
        let mut config = fanout_budget::Config::default();
        match key {
            "timeout_ms" => config.redis.timeout_ms = 0,
            "lease_ms" => config.redis.lease_ms = 0,
            _ => config.redis.backoff_ms = 0,
        }
        let err = config.validate().unwrap_err();
        assert_eq!(err.to_string(), format!("redis.{key} must be at least 1"));
        assert_eq!(err.key(), Some(format!("redis.{key}").as_str()));
    }
}

#[test]
fn redis_durations_that_void_every_share_are_refused_naming_the_key() {
    let mut config = fanout_budget::Config::default();
    config.redis.refresh_ms = config.redis.lease_ms / 3 + 1;
    let err = config.validate().unwrap_err();
    assert_eq!(err.key(), Some("redis.refresh_ms"));
    assert!(err
        .to_string()
        .starts_with("redis.refresh_ms must be less than a third of redis.lease_ms"));
    let mut config = fanout_budget::Config::default();
    config.redis.timeout_ms = config.redis.lease_ms * 2 / 3 + 1;
    let err = config.validate().unwrap_err();
    assert_eq!(err.key(), Some("redis.timeout_ms"));
    assert!(err
        .to_string()
        .starts_with("redis.timeout_ms must be less than two thirds of redis.lease_ms"));
    assert!(fanout_budget::Config::default().validate().is_ok());
}
